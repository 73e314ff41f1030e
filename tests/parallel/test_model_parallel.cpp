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

#include "comm/local_communicator.h"
#include "comm/process_grid.h"
#include "model/gpt_model.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/schedules.h"

namespace omni {
namespace {

TransformerConfig tiny(bool llama) {
  TransformerConfig c;
  c.num_layers = 8;
  c.hidden_size = llama ? 32 : 16;
  c.num_attention_heads = llama ? 8 : 4;
  c.ffn_hidden_size = llama ? 24 : 0;
  c.seq_length = 8;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 4;
  c.init_method_std = 0.2;
  if (llama) {
    c.group_query_attention = true;
    c.num_query_groups = 4;
    c.normalization = Normalization::RMSNorm;
    c.swiglu = true;
    c.position_embedding_type = PositionEmbedding::Rope;
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
    c.qk_layernorm = true;
  }
  c.validate();
  return c;
}

struct Layout {
  int tp = 1, cp = 1, pp = 1, layers_per_virtual_stage = 0;
  bool sp = false;
  bool packed = false;  // two documents per sample (reset positions and attention)
};

constexpr int kBatch = 2, kMicroBatches = 4;
constexpr uint64_t kSeed = 7;

struct Data {
  std::vector<std::vector<int32_t>> tokens, labels, positions, key_start;
  std::vector<std::vector<float>> masks;
  std::vector<MicroBatch> batches;
};

Data make_data(const TransformerConfig& c, bool packed) {
  Data d;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> id(0, c.vocab_size - 1);
  const int n = kBatch * c.seq_length;
  for (int m = 0; m < kMicroBatches; ++m) {
    std::vector<int32_t> t(n), l(n);
    std::vector<float> mask(n, 1.0f);
    for (int i = 0; i < n; ++i) t[i] = id(rng), l[i] = id(rng);
    mask[3] = mask[n - 1] = 0.0f;
    d.tokens.push_back(t), d.labels.push_back(l), d.masks.push_back(mask);
  }
  // Packed: the second document of each sample starts at position 3.
  const int S = c.seq_length, doc = 3;
  std::vector<int32_t> pos(n), start(n);
  for (int i = 0; i < n; ++i) {
    pos[i] = i % S < doc ? i % S : i % S - doc;
    start[i] = i % S < doc ? 0 : doc;
  }
  d.positions.assign(kMicroBatches, pos), d.key_start.assign(kMicroBatches, start);
  for (int m = 0; m < kMicroBatches; ++m)
    d.batches.push_back(MicroBatch{d.tokens[m].data(), d.labels[m].data(), d.masks[m].data(),
                                   kBatch, c.seq_length, packed ? d.positions[m].data() : nullptr,
                                   packed ? d.key_start[m].data() : nullptr});
  return d;
}

// Largest |a - b| / (|b| + 1e-3) over the elements of `p` against the one-rank tensor.
double compare(const ParamInfo& p, const double* local, const std::vector<double>& full) {
  double worst = 0;
  ParameterSet<double>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (g + i >= int64_t(full.size())) continue;  // padded vocabulary rows beyond one rank's
      worst = std::max(worst, std::abs(local[l + i] - full[g + i]) / (std::abs(full[g + i]) + 1e-3));
    }
  });
  return worst;
}

void check_layout(bool llama, const Layout& layout) {
  const TransformerConfig cfg = tiny(llama);
  const Data data = make_data(cfg, layout.packed);
  GPTModel<double> ref(cfg, kBatch, kSeed);
  double ref_loss = 0;
  for (const MicroBatch& mb : data.batches) ref_loss += ref.forward_backward(mb, 1.0 / kMicroBatches);
  auto full = [&](const std::string& name, bool grad) {
    const ParamInfo& info = ref.params().info(name);
    const double* p = (grad ? ref.params().grads() : ref.params().values()) + info.offset;
    return std::vector<double>(p, p + info.numel);
  };

  std::mutex mu;
  double worst_value = 0, worst_grad = 0, loss = NAN;
  std::vector<std::string> seen;
  const int world = layout.tp * layout.cp * layout.pp;
  run_ranks(world, [&](Communicator& w) {
    ProcessGrid grid(w, ParallelLayout{.tp = layout.tp, .cp = layout.cp, .pp = layout.pp});
    PipelineSplit split;
    split.num_layers = cfg.num_layers;
    split.pipeline_model_parallel_size = layout.pp;
    split.num_layers_per_virtual_pipeline_stage = layout.layers_per_virtual_stage;
    ModelParallel mp;
    mp.tp = &grid.tp(), mp.cp = &grid.cp(), mp.sequence_parallel = layout.sp;
    for (const LayerRange& r : pipeline_rank_layers(split, grid.pp_rank()))
      mp.chunks.push_back({r.begin, r.end});
    mp.pre_process = grid.is_first_stage(), mp.post_process = grid.is_last_stage();
    GPTModel<double> model(cfg, kBatch, kSeed, mp);

    std::vector<ContextParallelBatch> local(kMicroBatches);
    for (int m = 0; m < kMicroBatches; ++m) local[m].slice(data.batches[m], layout.cp, grid.cp_rank());
    PipelineExecutor<double> pipe(model, grid.pp());
    auto batch = [&](int m) -> const MicroBatch& {
      return layout.cp > 1 ? local[m].batch() : data.batches[m];
    };
    // Context-parallel ranks each hold part of every gradient: their sum is the gradient.
    const double l = pipe.run(kMicroBatches, batch, true, 1.0 / kMicroBatches);
    ParameterSet<double>& ps = model.params();
    for (const ParamInfo& p : ps.infos())
      if (p.tp_partial_grad) grid.tp().all_reduce(ps.grads() + p.offset, p.numel);
    grid.cp().all_reduce(ps.grads(), ps.size());
    if (layout.pp > 1 && ps.has("embedding.word_embeddings.weight") &&
        !cfg.untie_embeddings_and_output_weights) {
      const ParamInfo& e = ps.info("embedding.word_embeddings.weight");
      grid.embedding().all_reduce(ps.grads() + e.offset, e.numel);
    }

    std::lock_guard<std::mutex> lock(mu);
    if (grid.is_last_stage()) loss = l;
    for (const ParamInfo& p : ps.infos()) {
      worst_value = std::max(worst_value, compare(p, ps.values() + p.offset, full(p.name, false)));
      const double e = compare(p, ps.grads() + p.offset, full(p.name, true));
      EXPECT_LT(e, 1e-9) << p.name << " on rank " << w.rank();
      worst_grad = std::max(worst_grad, e);
      seen.push_back(p.name);
    }
  });
  EXPECT_EQ(worst_value, 0.0);  // the same values, element by element
  EXPECT_NEAR(loss, ref_loss, 1e-12 * std::abs(ref_loss));
  EXPECT_LT(worst_grad, 1e-9);
  // Every parameter of the one-rank model lives on some rank.
  for (const ParamInfo& p : ref.params().infos())
    EXPECT_NE(std::find(seen.begin(), seen.end(), p.name), seen.end()) << p.name;
}

class ModelParallel : public ::testing::TestWithParam<bool> {};

TEST_P(ModelParallel, TensorParallel2) { check_layout(GetParam(), {.tp = 2}); }
TEST_P(ModelParallel, TensorParallel4) { check_layout(GetParam(), {.tp = 4}); }
TEST_P(ModelParallel, TensorParallel2SequenceParallel) {
  check_layout(GetParam(), {.tp = 2, .sp = true});
}
TEST_P(ModelParallel, ContextParallel2) { check_layout(GetParam(), {.cp = 2}); }
TEST_P(ModelParallel, ContextParallel4PackedDocuments) {
  check_layout(GetParam(), {.cp = 4, .packed = true});
}
TEST_P(ModelParallel, TensorParallel2PackedDocuments) {
  check_layout(GetParam(), {.tp = 2, .sp = true, .packed = true});
}
TEST_P(ModelParallel, Pipeline2) { check_layout(GetParam(), {.pp = 2}); }
TEST_P(ModelParallel, Pipeline4Interleaved) {
  check_layout(GetParam(), {.pp = 4, .layers_per_virtual_stage = 1});
}
TEST_P(ModelParallel, TensorParallel2Pipeline2SequenceParallel) {
  check_layout(GetParam(), {.tp = 2, .pp = 2, .sp = true});
}
TEST_P(ModelParallel, ContextParallel2TensorParallel2) {
  check_layout(GetParam(), {.tp = 2, .cp = 2});
}

INSTANTIATE_TEST_SUITE_P(Gpt2AndLlama, ModelParallel, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "llama" : "gpt2"; });

}  // namespace
}  // namespace omni
