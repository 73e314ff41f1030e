#include "parallel/schedules.h"

#include <algorithm>
#include <string>
#include <utility>

#include "base/error.h"

namespace omni {

namespace {

constexpr const char* kFirstFlag = "--decoder-first-pipeline-num-layers";
constexpr const char* kLastFlag = "--decoder-last-pipeline-num-layers";
constexpr const char* kVirtualFlag = "--num-layers-per-virtual-pipeline-stage";

// Layers per pipeline stage for a split without interleaving, after Megatron's checks on
// the uneven first/last stage (TransformerConfig's num_layers_in_{first,last}_pipeline_stage).
std::vector<int> stage_sizes(const PipelineSplit& s) {
  const int pp = s.pipeline_model_parallel_size;
  const auto& first = s.decoder_first_pipeline_num_layers;
  const auto& last = s.decoder_last_pipeline_num_layers;
  if (!first && !last) {
    OMNI_REQUIRE(s.num_layers % pp == 0, "--num-layers ", s.num_layers,
                 " is not divisible by --pipeline-model-parallel-size ", pp,
                 " (use --decoder-first-pipeline-num-layers / "
                 "--decoder-last-pipeline-num-layers for an uneven split)");
    return std::vector<int>(pp, s.num_layers / pp);
  }
  int middle_layers = s.num_layers, middle_stages = pp;
  std::string given;  // the edge-stage flags as the user gave them, for messages
  for (auto [flag, value] : {std::pair{kFirstFlag, first}, std::pair{kLastFlag, last}}) {
    if (!value) continue;
    OMNI_REQUIRE(*value > 0, flag, " must be positive (got ", *value, ")");
    given += detail::concat(given.empty() ? "" : " and ", flag, " ", *value);
    middle_layers -= *value;
    --middle_stages;
  }
  OMNI_REQUIRE(middle_stages >= 0, given,
               " together need --pipeline-model-parallel-size 2 or more (got ", pp, ")");
  OMNI_REQUIRE(middle_layers >= 0, given, " hold more than --num-layers ", s.num_layers);
  OMNI_REQUIRE((middle_layers > 0) == (middle_stages > 0), "--num-layers ", s.num_layers, " with ",
               given, " leaves ", middle_layers, " layers for the ", middle_stages,
               " other stages of --pipeline-model-parallel-size ", pp);
  OMNI_REQUIRE(middle_stages == 0 || middle_layers % middle_stages == 0, "the ", middle_layers,
               " layers left after ", given, " (--num-layers ", s.num_layers,
               ") are not divisible by the ", middle_stages,
               " other stages of --pipeline-model-parallel-size ", pp);
  std::vector<int> sizes(pp, middle_stages ? middle_layers / middle_stages : 0);
  if (first) sizes.front() = *first;
  if (last) sizes.back() = *last;
  return sizes;
}

}  // namespace

int virtual_pipeline_size(const PipelineSplit& s) {
  const int pp = s.pipeline_model_parallel_size;
  const int per_chunk = s.num_layers_per_virtual_pipeline_stage;
  OMNI_REQUIRE(s.num_layers > 0, "--num-layers must be positive (got ", s.num_layers, ")");
  OMNI_REQUIRE(pp > 0, "--pipeline-model-parallel-size must be positive (got ", pp, ")");
  OMNI_REQUIRE(per_chunk >= 0, kVirtualFlag, " must be positive (got ", per_chunk, ")");
  if (per_chunk == 0) {
    stage_sizes(s);
    return 1;
  }
  OMNI_REQUIRE(!s.decoder_first_pipeline_num_layers && !s.decoder_last_pipeline_num_layers,
               kVirtualFlag, " cannot be combined with ", kFirstFlag, " or ", kLastFlag,
               " (an uneven split cannot be cut into equal virtual stages)");
  OMNI_REQUIRE(s.num_layers % pp == 0, "--num-layers ", s.num_layers,
               " is not divisible by --pipeline-model-parallel-size ", pp);
  const int per_stage = s.num_layers / pp;
  OMNI_REQUIRE(per_stage % per_chunk == 0, kVirtualFlag, " ", per_chunk, " does not divide the ",
               per_stage, " layers of each pipeline stage (--num-layers ", s.num_layers,
               " / --pipeline-model-parallel-size ", pp, ")");
  const int vp = per_stage / per_chunk;
  OMNI_REQUIRE(vp == 1 || pp > 1, kVirtualFlag, " ", per_chunk,
               " asks for an interleaved schedule, which needs --pipeline-model-parallel-size 2 "
               "or more (got ",
               pp, ")");
  return vp;
}

std::vector<LayerRange> pipeline_rank_layers(const PipelineSplit& s, int rank) {
  const int vp = virtual_pipeline_size(s);
  const int pp = s.pipeline_model_parallel_size;
  OMNI_CHECK(rank >= 0 && rank < pp, "pipeline rank ", rank, " of ", pp);
  if (s.num_layers_per_virtual_pipeline_stage > 0) {
    const int per_chunk = s.num_layers / (pp * vp);
    std::vector<LayerRange> chunks;
    for (int c = 0; c < vp; ++c) {
      const int stage = c * pp + rank;
      chunks.push_back({stage * per_chunk, (stage + 1) * per_chunk});
    }
    return chunks;
  }
  const std::vector<int> sizes = stage_sizes(s);
  int begin = 0;
  for (int r = 0; r < rank; ++r) begin += sizes[r];
  return {{begin, begin + sizes[rank]}};
}

std::vector<PipelineOp> pipeline_schedule(int pipeline_size, int rank, int num_microbatches,
                                          int virtual_size, bool forward_only) {
  const int pp = pipeline_size, vp = virtual_size, m = num_microbatches;
  OMNI_CHECK(pp > 0 && rank >= 0 && rank < pp && vp > 0 && m > 0, "pipeline rank ", rank, " of ",
             pp, ", ", vp, " chunks per rank, ", m, " micro-batches");
  if (vp > 1) {
    OMNI_REQUIRE(pp > 1, "the interleaved pipeline schedule (", kVirtualFlag,
                 ") needs --pipeline-model-parallel-size 2 or more (got ", pp, ")");
    OMNI_REQUIRE(m % pp == 0, "the interleaved pipeline schedule (", kVirtualFlag,
                 ") needs the micro-batches per step (--global-batch-size / (--micro-batch-size "
                 "x data-parallel size) = ",
                 m, ") to be a multiple of --pipeline-model-parallel-size ", pp);
  }
  // Forward k runs micro-batch group k / (pp*vp) of pp micro-batches: all of the group through
  // chunk 0, then through chunk 1, ... Backward k takes the same micro-batch, chunks reversed.
  // With vp == 1 this is simply micro-batch k.
  const auto op = [&](PipelinePass pass, int k) {
    const int group = k / (pp * vp), within = k % (pp * vp);
    const int chunk = within / pp;
    return PipelineOp{pass, group * pp + within % pp,
                      pass == PipelinePass::Forward ? chunk : vp - 1 - chunk};
  };
  // Megatron's warm-up: the forwards a rank runs before its first backward.
  const int total = m * vp;
  int warmup = 0;
  if (forward_only)
    warmup = total;
  else if (pp > 1)
    warmup = vp == 1 ? pp - rank - 1 : (pp - rank - 1) * 2 + (vp - 1) * pp;
  warmup = std::min(warmup, total);

  std::vector<PipelineOp> ops;
  ops.reserve(2 * total);
  for (int k = 0; k < warmup; ++k) ops.push_back(op(PipelinePass::Forward, k));
  for (int k = 0; k < total - warmup; ++k) {
    ops.push_back(op(PipelinePass::Forward, warmup + k));
    ops.push_back(op(PipelinePass::Backward, k));
  }
  if (!forward_only)
    for (int k = total - warmup; k < total; ++k) ops.push_back(op(PipelinePass::Backward, k));
  return ops;
}

}  // namespace omni
