// Every parallel layout of the model against the one-rank model, in float64 on in-process
// ranks: tensor parallel (2 and 4 ranks, with and without sequence parallelism), context
// parallel, pipeline parallel (1F1B and interleaved) and combinations. Each rank's
// parameters must be exactly its slices of the one-rank model's, and after the step's
// micro-batches its gradients (summed where the layout leaves partial sums) and the loss
// must match to rounding. Context parallelism is causal ring attention, so these tests are
// also its check against ordinary attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "parallel/layout_run.h"

namespace omni {
namespace {

using namespace layout_test;

// Largest |a - b| / (|b| + 1e-3) over the elements of `p` against the one-rank tensor.
double compare(const ParamInfo& p, const double* local, const std::vector<double>& full) {
  double worst = 0;
  ParameterSet<double>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (g + i >= int64_t(full.size())) continue;  // padded vocabulary rows beyond one rank's
      worst =
          std::max(worst, std::abs(local[l + i] - full[g + i]) / (std::abs(full[g + i]) + 1e-3));
    }
  });
  return worst;
}

void check_layout_of(const TransformerConfig& cfg, const Layout& layout) {
  const Data data = make_data(cfg, layout.packed);
  GPTModel<double> ref(cfg, kBatch, kSeed);
  double ref_loss = 0;
  for (const MicroBatch& mb : data.batches)
    ref_loss += ref.forward_backward(mb, 1.0 / kMicroBatches);
  auto full = [&](const std::string& name, bool grad) {
    const ParamInfo& info = ref.params().info(name);
    const double* p = (grad ? ref.params().grads() : ref.params().values()) + info.offset;
    return std::vector<double>(p, p + info.numel);
  };

  double worst_value = 0, worst_grad = 0, loss = NAN;
  std::vector<std::string> seen;
  for (const RankResult<double>& r :
       run_layout<double>(cfg, layout, data, [](int) { return ops::Exec{}; })) {
    if (r.last_stage) loss = r.loss;
    for (const ParamInfo& p : r.infos) {
      worst_value =
          std::max(worst_value, compare(p, r.values.data() + p.offset, full(p.name, false)));
      const double e = compare(p, r.grads.data() + p.offset, full(p.name, true));
      EXPECT_LT(e, 1e-9) << p.name << " on rank " << r.rank;
      worst_grad = std::max(worst_grad, e);
      seen.push_back(p.name);
    }
  }
  EXPECT_EQ(worst_value, 0.0);  // the same values, element by element
  EXPECT_NEAR(loss, ref_loss, 1e-12 * std::abs(ref_loss));
  EXPECT_LT(worst_grad, 1e-9);
  // Every parameter of the one-rank model lives on some rank.
  for (const ParamInfo& p : ref.params().infos())
    EXPECT_NE(std::find(seen.begin(), seen.end(), p.name), seen.end()) << p.name;
}

void check_layout(bool llama, const Layout& layout) {
  check_layout_of(layout_config(llama, layout), layout);
}

class ModelParallel : public ::testing::TestWithParam<bool> {};

TEST_P(ModelParallel, TensorParallel2) {
  check_layout(GetParam(), {.tp = 2});
}
TEST_P(ModelParallel, TensorParallel4) {
  check_layout(GetParam(), {.tp = 4});
}
TEST_P(ModelParallel, TensorParallel2SequenceParallel) {
  check_layout(GetParam(), {.tp = 2, .sp = true});
}
TEST_P(ModelParallel, ContextParallel2) {
  check_layout(GetParam(), {.cp = 2});
}
TEST_P(ModelParallel, ContextParallel4PackedDocuments) {
  check_layout(GetParam(), {.cp = 4, .packed = true});
}
TEST_P(ModelParallel, TensorParallel2PackedDocuments) {
  check_layout(GetParam(), {.tp = 2, .sp = true, .packed = true});
}
TEST_P(ModelParallel, Pipeline2) {
  check_layout(GetParam(), {.pp = 2});
}
TEST_P(ModelParallel, Pipeline4Interleaved) {
  check_layout(GetParam(), {.pp = 4, .layers_per_virtual_stage = 1});
}
TEST_P(ModelParallel, TensorParallel2Pipeline2SequenceParallel) {
  check_layout(GetParam(), {.tp = 2, .pp = 2, .sp = true});
}
TEST_P(ModelParallel, ContextParallel2TensorParallel2) {
  check_layout(GetParam(), {.tp = 2, .cp = 2});
}

// Dropout 0.1 on the hidden states and attention probabilities: the masks are keyed by the
// global sample, position, head and element, so every layout draws the one-rank model's.
TEST_P(ModelParallel, TensorParallel2SequenceParallelWithDropout) {
  check_layout(GetParam(), {.tp = 2, .sp = true, .dropout = true});
}
TEST_P(ModelParallel, Pipeline2InterleavedWithDropout) {
  check_layout(GetParam(), {.pp = 2, .layers_per_virtual_stage = 2, .dropout = true});
}
TEST_P(ModelParallel, ContextParallel2WithDropout) {
  check_layout(GetParam(), {.cp = 2, .dropout = true});
}
TEST_P(ModelParallel, ContextParallel2TensorParallel2PackedDocumentsWithDropout) {
  check_layout(GetParam(), {.tp = 2, .cp = 2, .sp = true, .packed = true, .dropout = true});
}
TEST_P(ModelParallel, TensorParallel2FullRecomputeWithDropout) {
  check_layout(GetParam(), {.tp = 2, .recompute = Recompute::Full, .dropout = true});
}

// DeepSpeed-Ulysses (parallel/ulysses.h): the same sequence split, attention by all-to-all.
TEST_P(ModelParallel, Ulysses2) {
  check_layout(GetParam(), {.cp = 2, .ulysses = true});
}
TEST_P(ModelParallel, Ulysses4PackedDocumentsWithDropout) {
  check_layout(GetParam(), {.cp = 4, .packed = true, .dropout = true, .ulysses = true});
}
TEST_P(ModelParallel, Ulysses2Pipeline2FullRecompute) {
  check_layout(GetParam(), {.cp = 2, .pp = 2, .recompute = Recompute::Full, .ulysses = true});
}
TEST_P(ModelParallel, Ulysses2TensorParallel2SequenceParallelWithDropout) {
  check_layout(GetParam(), {.tp = 2, .cp = 2, .sp = true, .dropout = true, .ulysses = true});
}

// Multi-latent attention (model/mla.h): the up-projections split by heads, the down-projections
// and latent norms replicated with partial gradients.
TEST(ModelParallelMla, TensorParallel2SequenceParallelPipeline2PackedWithDropout) {
  const Layout layout{.tp = 2, .pp = 2, .sp = true, .packed = true, .dropout = true};
  check_layout_of(mla_layout_config(layout), layout);
}
TEST(ModelParallelMla, TensorParallel4FullRecompute) {
  const Layout layout{.tp = 4, .recompute = Recompute::Full};
  check_layout_of(mla_layout_config(layout), layout);
}
// Under context parallelism the values' head dim (6) is not the keys' (8): ring attention and
// Ulysses pass blocks of each width.
TEST(ModelParallelMla, ContextParallel2TensorParallel2PackedWithDropout) {
  const Layout layout{.tp = 2, .cp = 2, .sp = true, .packed = true, .dropout = true};
  check_layout_of(mla_layout_config(layout), layout);
}
TEST(ModelParallelMla, Ulysses2Pipeline2PackedDocuments) {
  const Layout layout{.cp = 2, .pp = 2, .packed = true, .ulysses = true};
  check_layout_of(mla_layout_config(layout), layout);
}

// Multi-token prediction (model/mtp.cpp): two depths whose rolled tokens, labels and mask
// cross the context-parallel chunks' boundaries (and, packed, the documents'); GPT-2's depths
// add the rolled tokens' learned positions.
TransformerConfig mtp_layout_config(bool llama, const Layout& layout) {
  TransformerConfig c = layout_config(llama, layout);
  c.num_layers = 2;
  c.mtp_num_layers = 2;
  c.mtp_loss_scaling_factor = 0.3;
  return c;
}
TEST(ModelParallelMtp, ContextParallel2PackedDocumentsWithDropout) {
  const Layout layout{.cp = 2, .packed = true, .dropout = true};
  check_layout_of(mtp_layout_config(true, layout), layout);
}
TEST(ModelParallelMtp, ContextParallel4Gpt2) {
  const Layout layout{.cp = 4};
  check_layout_of(mtp_layout_config(false, layout), layout);
}
TEST(ModelParallelMtp, Ulysses2PackedDocuments) {
  const Layout layout{.cp = 2, .packed = true, .ulysses = true};
  check_layout_of(mtp_layout_config(true, layout), layout);
}
TEST(ModelParallelMtp, ContextParallel2TensorParallel2SequenceParallelGpt2) {
  const Layout layout{.tp = 2, .cp = 2, .sp = true};
  check_layout_of(mtp_layout_config(false, layout), layout);
}
// A later pipeline stage holds no position table for GPT-2's depths to embed with: refused in
// one line (rope's is built: MpiMTP's pp2).
TEST(ModelParallelMtp, LearnedPositionsOnALaterPipelineStageAreRefused) {
  TransformerConfig c = mtp_layout_config(false, {});
  omni::ModelParallel mp;
  mp.chunks = {{1, c.num_layers}}, mp.pre_process = false;
  try {
    GPTModel<double> m(c, kBatch, kSeed, mp);
    ADD_FAILURE() << "built";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--mtp-num-layers 2 with --position-embedding-type learned_absolute and "
              "--pipeline-model-parallel-size above 1: not built yet (the last stage holds no "
              "copy of the position embeddings; rope and none are built)");
  }
  mp.pre_process = true, mp.chunks = {{0, c.num_layers}};
  EXPECT_NO_THROW(GPTModel<double>(c, kBatch, kSeed, mp));
}

INSTANTIATE_TEST_SUITE_P(Gpt2AndLlama, ModelParallel, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "llama" : "gpt2"; });

}  // namespace
}  // namespace omni
