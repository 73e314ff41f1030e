// The bytes the tensor-parallel groups move in one MoE transformer layer's forward and backward
// under sequence parallelism, counted by comm/counting_communicator.h on in-process ranks,
// against the analytical count. With the experts' own tensor-parallel group of etp < tp ranks
// and no shared expert, the routed experts' rows are gathered and their output summed over
// that block only (ETP 1: nothing moves), as Megatron-Core moves them; a shared expert, split
// over every tp rank, needs every row, and the routed rows ride in its tp gather and sum.
// With etp a multiple of tp (the group spanning data-parallel replicas) each rank's routed
// rows are gathered over the expert tensor-parallel group and the slices' outputs summed back
// (alltoall: the rows after the dispatch; allgather: the tokens, over the expert tp x ep
// group), nothing over tp for them.
// (The layouts' numbers against the one-rank model: test_moe_layouts.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "comm/counting_communicator.h"
#include "parallel/layout_run.h"

namespace omni {
namespace {

using namespace layout_test;

struct Bytes {
  double tp = 0, expert_tp = 0, expert_tp_ep = 0;  // algorithmic bytes one rank sends, per group
};

// Layer 1 (an MoE layer) of layout_run.h's MoE model alone, as a pipeline chunk: one training
// forward and backward of a micro-batch of kBatch sequences on max(tp, etp) ranks (etp / tp
// data-parallel ones when etp > tp), with ETP etp, EP 1. Returns rank 0's bytes (every rank's
// are the same: dropless, each rank routes as many rows).
Bytes moe_layer_bytes(int tp, int etp, bool shared_expert,
                      const std::string& dispatcher = "alltoall") {
  TransformerConfig cfg = moe_layout_config(dispatcher);
  if (!shared_expert) cfg.moe_shared_expert_intermediate_size = 0;
  cfg.validate();
  const int world = std::max(tp, etp);
  std::vector<Bytes> bytes(world);
  run_ranks(world, [&](Communicator& w) {
    Tally tally;
    CountingCommunicator counted(w, tally);
    ProcessGrid grid(counted, ParallelLayout{.tp = tp, .etp = etp});
    ModelParallel mp;
    mp.tp = &grid.tp(), mp.cp = &grid.cp(), mp.sequence_parallel = tp > 1;
    if (grid.own_expert_tp()) mp.expert_tp = &grid.expert_tp(), mp.tp_cp = &grid.tp_cp();
    mp.expert_tp_ep = grid.expert_tp_ep();
    mp.chunks = {{1, 2}};
    mp.pre_process = mp.post_process = false;
    GPTModel<double> model(cfg, kBatch, kSeed, mp);
    const Data data = make_data(cfg, false);
    const MicroBatch& mb = data.batches[0];
    const size_t n = size_t(model.stage_rows(mb)) * cfg.hidden_size;
    std::mt19937 rng(11 + w.rank());
    std::normal_distribution<double> d;
    std::vector<double> input(n), grad(n);
    for (size_t i = 0; i < n; ++i) input[i] = d(rng), grad[i] = d(rng);
    tally.on = true;
    model.chunk_forward(0, 0, mb, input.data(), true, 1.0, nullptr);
    model.chunk_backward(0, 0, mb, grad.data());
    tally.on = false;
    Bytes& b = bytes[w.rank()];
    for (const auto& [key, e] : tally.entries) {
      if (key.first == "tp") b.tp += e.algorithmic;
      if (key.first == "expert_tp") b.expert_tp += e.algorithmic;
      if (key.first == "expert_tp_ep") b.expert_tp_ep += e.algorithmic;
    }
  });
  for (const Bytes& b : bytes) {
    EXPECT_EQ(b.tp, bytes[0].tp);
    EXPECT_EQ(b.expert_tp, bytes[0].expert_tp);
    EXPECT_EQ(b.expert_tp_ep, bytes[0].expert_tp_ep);
  }
  return bytes[0];
}

// The analytical count for N tokens of C float64 values over t tp ranks: the attention's
// all-gather and reduce-scatter, forward and backward, of (t-1)/t of the N rows each; the
// MoE layer's four the same over tp (whole rows), or with its own rows over its etp block,
// (e-1)/e of the block's N e/t rows; under ETP < TP the reported figures (E + 2 doubles)
// all-reduced over tp, 2 (t-1)/t of them.
Bytes expected(int t, int e, bool whole_rows) {
  const TransformerConfig cfg = moe_layout_config("alltoall");
  const double N = kBatch * cfg.seq_length, row = cfg.hidden_size * sizeof(double);
  Bytes b;
  b.tp = 4 * (t - 1) * N / t * row;
  if (whole_rows)
    b.tp += 4 * (t - 1) * N / t * row;
  else
    b.expert_tp = 4 * (e - 1) * N / t * row;
  if (e < t) b.tp += 2.0 * (t - 1) / t * (cfg.num_moe_experts + 2) * sizeof(double);
  return b;
}

void expect_bytes(int tp, int etp, bool shared_expert) {
  const Bytes got = moe_layer_bytes(tp, etp, shared_expert);
  const Bytes want = expected(tp, etp, shared_expert || etp == tp);
  EXPECT_DOUBLE_EQ(got.tp, want.tp);
  EXPECT_DOUBLE_EQ(got.expert_tp, want.expert_tp);
}

TEST(MoETensorParallelBytes, ExpertTensor1UnderTensor2MovesOnlyTheAttentionsRows) {
  expect_bytes(2, 1, false);
}
TEST(MoETensorParallelBytes, ExpertTensor1And2UnderTensor4GatherOverTheBlockOnly) {
  expect_bytes(4, 1, false);
  expect_bytes(4, 2, false);
}
TEST(MoETensorParallelBytes, SharedExpertKeepsTheTensorParallelGather) {
  expect_bytes(4, 1, true);
  expect_bytes(4, 2, true);
}
TEST(MoETensorParallelBytes, ExpertTensorOfTheTensorParallelSize) {
  expect_bytes(4, 4, false);
}

// ETP e a multiple of TP t: each rank routes its n = N/t rows (K rows each, dropless) itself.
// Alltoall: the counts of its E experts all-gathered over the e ranks ((e-1) E doubles), then
// four exchanges over them, forward and backward (the rows gathered, the slices' outputs
// reduce-scattered; the output gradients gathered, the input gradients reduce-scattered),
// each (e-1) n K rows. Allgather: over the tp x ep group (e ranks at EP 1) the routing
// (1 + 2 n K values) and the tokens gathered and the outputs reduce-scattered, forward; the
// output gradients gathered and the input gradients and the probabilities' (n K)
// reduce-scattered, backward: (e-1) (1 + 3 n K + 4 n C) values. Over tp: the attention's rows,
// the MoE layer's whole rows only for the shared expert, the reported figures.
Bytes expected_wide(int t, int e, bool shared_expert, bool allgather) {
  const TransformerConfig cfg = moe_layout_config("alltoall");
  const double N = kBatch * cfg.seq_length, C = cfg.hidden_size, n = N / t, K = cfg.moe_router_topk,
               E = cfg.num_moe_experts, v = sizeof(double);
  Bytes b;
  b.tp = 4 * (t - 1) * N / t * C * v;
  if (shared_expert) b.tp += 4 * (t - 1) * N / t * C * v;
  if (t > 1) b.tp += 2.0 * (t - 1) / t * (E + 2) * v;
  if (allgather)
    b.expert_tp_ep = (e - 1) * (1 + 3 * n * K + 4 * n * C) * v;
  else
    b.expert_tp = (e - 1) * (E + 4 * n * K * C) * v;
  return b;
}

void expect_wide_bytes(int tp, int etp, bool shared_expert) {
  for (const bool allgather : {false, true}) {
    SCOPED_TRACE(allgather ? "allgather" : "alltoall");
    const Bytes got = moe_layer_bytes(tp, etp, shared_expert, allgather ? "allgather" : "alltoall");
    const Bytes want = expected_wide(tp, etp, shared_expert, allgather);
    EXPECT_DOUBLE_EQ(got.tp, want.tp);
    EXPECT_DOUBLE_EQ(got.expert_tp, want.expert_tp);
    EXPECT_DOUBLE_EQ(got.expert_tp_ep, want.expert_tp_ep);
  }
}

TEST(MoETensorParallelBytes, ExpertTensor2OverTwoDataParallelRanks) {
  expect_wide_bytes(1, 2, false);
  expect_wide_bytes(1, 2, true);
}
TEST(MoETensorParallelBytes, ExpertTensor4UnderTensor2) {
  expect_wide_bytes(2, 4, false);
  expect_wide_bytes(2, 4, true);
}

}  // namespace
}  // namespace omni
