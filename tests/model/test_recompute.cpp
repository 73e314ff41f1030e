// Activation recompute changes memory, never the math: with full (every layer, or the first
// N of each chunk) or selective recompute, the loss and every gradient are bit-identical to
// the run that keeps every activation, on one rank and under pipeline and context
// parallelism (where the recomputed forward communicates again).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "comm/local_communicator.h"
#include "comm/process_grid.h"
#include "model/gpt_model.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/schedules.h"

namespace omni {
namespace {

TransformerConfig tiny_llama() {
  TransformerConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 48;
  c.seq_length = 16;
  c.vocab_size = 64;
  c.make_vocab_size_divisible_by = 8;
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.position_embedding_type = PositionEmbedding::Rope;
  c.add_bias_linear = false;
  c.init_method_std = 0.2;
  c.validate();
  return c;
}

struct Result {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per world rank
  int64_t activation_bytes = 0;           // world rank 0's
};

// Three micro-batches of a step at the layout (pp, cp), with `recompute`.
Result run(int pp, int cp, const Recompute& recompute) {
  const TransformerConfig cfg = tiny_llama();
  constexpr int kBatch = 2, kMicro = 4;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> id(0, cfg.vocab_size - 1);
  const int n = kBatch * cfg.seq_length;
  std::vector<std::vector<int32_t>> tokens(kMicro, std::vector<int32_t>(n)), labels = tokens;
  for (int m = 0; m < kMicro; ++m)
    for (int i = 0; i < n; ++i) tokens[m][i] = id(rng), labels[m][i] = id(rng);
  Result r;
  r.grads.resize(pp * cp);
  std::mutex mu;
  run_ranks(pp * cp, [&](Communicator& world) {
    ProcessGrid grid(world, ParallelLayout{.cp = cp, .pp = pp});
    PipelineSplit split;
    split.num_layers = cfg.num_layers;
    split.pipeline_model_parallel_size = pp;
    ModelParallel mp;
    mp.cp = &grid.cp();
    for (const LayerRange& l : pipeline_rank_layers(split, grid.pp_rank()))
      mp.chunks.push_back({l.begin, l.end});
    mp.pre_process = grid.is_first_stage(), mp.post_process = grid.is_last_stage();
    GPTModel<float> model(cfg, kBatch, 5, mp);
    model.set_recompute(recompute);
    std::vector<MicroBatch> full(kMicro);
    std::vector<ContextParallelBatch> local(kMicro);
    for (int m = 0; m < kMicro; ++m) {
      full[m] = MicroBatch{tokens[m].data(), labels[m].data(), nullptr, kBatch, cfg.seq_length};
      local[m].slice(full[m], cp, grid.cp_rank());
    }
    PipelineExecutor<float> pipe(model, grid.pp());
    const double loss = pipe.run(
        kMicro, [&](int m) -> const MicroBatch& { return cp > 1 ? local[m].batch() : full[m]; },
        true, 1.0 / kMicro);
    const ParameterSet<float>& p = model.params();
    std::lock_guard<std::mutex> lock(mu);
    r.grads[world.rank()].assign(p.grads(), p.grads() + p.size());
    if (grid.is_last_stage() && grid.cp_rank() == 0) r.loss = loss;
    if (world.rank() == 0) r.activation_bytes = model.activation_bytes();
  });
  return r;
}

void expect_same_as_keeping_everything(int pp, int cp) {
  const Result keep = run(pp, cp, {});
  for (const Recompute& rc : {Recompute{Recompute::Full, 0}, Recompute{Recompute::Full, 2},
                              Recompute{Recompute::Selective, 0}}) {
    const Result got = run(pp, cp, rc);
    EXPECT_EQ(got.loss, keep.loss) << "granularity " << rc.granularity << ", " << rc.num_layers;
    std::printf("pp %d cp %d, granularity %d (layers %d): activations %.1f%% of keeping all\n",
                pp, cp, int(rc.granularity), rc.num_layers,
                100.0 * got.activation_bytes / keep.activation_bytes);
    // Attention keeps no probabilities in any mode, so selective recompute keeps what
    // keeping everything keeps; full recompute keeps less.
    if (rc.granularity == Recompute::Selective)
      EXPECT_EQ(got.activation_bytes, keep.activation_bytes);
    else
      EXPECT_LT(got.activation_bytes, keep.activation_bytes);
    for (size_t r = 0; r < keep.grads.size(); ++r) {
      ASSERT_EQ(got.grads[r].size(), keep.grads[r].size());
      EXPECT_EQ(std::memcmp(got.grads[r].data(), keep.grads[r].data(),
                            keep.grads[r].size() * sizeof(float)),
                0)
          << "rank " << r << ", granularity " << rc.granularity << ", " << rc.num_layers;
    }
  }
}

TEST(Recompute, OneRankIsBitIdentical) { expect_same_as_keeping_everything(1, 1); }
TEST(Recompute, PipelineIsBitIdentical) { expect_same_as_keeping_everything(2, 1); }
TEST(Recompute, RingAttentionIsBitIdentical) { expect_same_as_keeping_everything(1, 2); }

}  // namespace
}  // namespace omni
