// `omnitron plan`'s traffic model for expert tensor parallelism above TP against the bytes a
// training step really sends: one step of a tiny MoE model on in-process ranks at TP 1,
// ETP 2 over four data-parallel ranks (expert-data-parallel 2), every communicator counted
// by comm/counting_communicator.h, against plan_expert_traffic's per-group bytes. Alltoall:
// ExpertTensorExchange's gathers and reduce-scatters of the experts' rows over the ETP group;
// allgather: the tokens and routing over the expert grid's tp-ep group; either way the
// experts' gradients all-reduced over their data-parallel group. Dropless at EP 1 every rank
// routes top-k x its tokens, so the counts are exact (the equalities below are exact).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "comm/counting_communicator.h"
#include "comm/local_communicator.h"
#include "comm/process_grid.h"
#include "model/gpt_model.h"
#include "parallel/layout_run.h"
#include "parallel/pipeline.h"
#include "train/expert_grads.h"
#include "train/plan.h"

namespace omni {
namespace {

struct Sent {
  double expert_tp = 0, expert_tp_ep = 0, expert_dp = 0;
};

// Every other layer an MoE layer of 4 experts (top-2, no shared expert), Llama-shaped.
TransformerConfig moe_model(const char* dispatcher) {
  TransformerConfig c = layout_test::tiny(true);
  c.num_layers = 4;
  c.num_moe_experts = 4, c.moe_ffn_hidden_size = 12, c.moe_layer_freq = "2";
  c.moe_router_topk = 2;
  c.moe_token_dispatcher_type = dispatcher;
  c.validate();
  return c;
}

PlanLayout etp2_layout(bool recompute) {
  PlanLayout l;
  l.gpus = 4, l.dp = 4, l.etp = 2;
  l.micro_batch = 2, l.global_batch = 2 * 2 * 4;  // two micro-batches a rank
  if (recompute) l.recompute = "full", l.recompute_method = "uniform";
  return l;
}

// One training step (forward and backward of the rank's micro-batches, then the experts'
// gradients reduced) on l.gpus local ranks; rank r's bytes per group.
std::vector<Sent> count_step(const TransformerConfig& cfg, const PlanLayout& l) {
  const int n = l.micro_batch * cfg.seq_length, M = l.micro_batches();
  std::vector<Sent> out(l.gpus);
  run_ranks(l.gpus, [&](Communicator& world) {
    Tally tally;
    CountingCommunicator counted(world, tally);
    ProcessGrid grid(counted, ParallelLayout{.tp = l.tp, .etp = l.etp});
    ModelParallel mp;
    mp.tp = &grid.tp(), mp.cp = &grid.cp();
    mp.expert_tp = &grid.expert_tp(), mp.tp_cp = &grid.tp_cp();
    mp.expert_tp_ep = grid.expert_tp_ep();
    mp.chunks = {{0, cfg.num_layers}};
    GPTModel<float> model(cfg, l.micro_batch, 5, mp);
    if (l.recompute == "full") model.set_recompute({Recompute::Full, 0});
    std::unique_ptr<ExpertGradients> experts = ExpertGradients::make(
        grid, model.params().infos(), model.params().grads_tensor(), 1e9, false, {});
    ASSERT_TRUE(experts);
    std::mt19937 rng(7 + world.rank());
    std::uniform_int_distribution<int> id(0, cfg.vocab_size - 1);
    std::vector<std::vector<int32_t>> tokens(M, std::vector<int32_t>(n)), labels = tokens;
    std::vector<MicroBatch> batches(M);
    for (int m = 0; m < M; ++m) {
      for (int i = 0; i < n; ++i) tokens[m][i] = id(rng), labels[m][i] = id(rng);
      batches[m] =
          MicroBatch{tokens[m].data(), labels[m].data(), nullptr, l.micro_batch, cfg.seq_length};
    }
    PipelineExecutor<float> pipe(model, grid.pp());
    tally.on = true;
    pipe.run(M, [&](int m) -> const MicroBatch& { return batches[m]; }, true, 1.0 / M);
    experts->finish();
    tally.on = false;
    auto group = [&](const std::string& name) {  // every kind of call over one group
      double sent = 0;
      for (const auto& [key, e] : tally.entries) sent += key.first == name ? e.algorithmic : 0.0;
      return sent;
    };
    out[world.rank()] = {group("expert_tp"), group("expert_tp_ep"), group("expert_dp")};
  });
  return out;
}

void expect_planned(const char* dispatcher, bool recompute) {
  SCOPED_TRACE(std::string(dispatcher) + (recompute ? ", full recompute" : ""));
  const TransformerConfig cfg = moe_model(dispatcher);
  const PlanLayout l = etp2_layout(recompute);
  ASSERT_EQ(l.expert_dp(), 2);
  const PlanExpertTraffic plan = plan_expert_traffic(cfg, l, 0, 4);
  const bool allgather = std::string(dispatcher) == "allgather";
  EXPECT_EQ(plan.moe_layers, 2);
  EXPECT_EQ(plan.gather_ranks, 2);
  EXPECT_GT(allgather ? plan.gather : plan.expert_tp, 0.0);
  EXPECT_EQ(allgather ? plan.expert_tp : plan.gather, 0.0);
  EXPECT_EQ(plan.ep, 0.0);
  for (const Sent& s : count_step(cfg, l)) {
    std::printf("%-9s%s: expert_tp %.0f (plan %.0f), expert_tp_ep %.0f (plan %.0f), expert_dp "
                "%.0f (plan %.0f)\n",
                dispatcher, recompute ? " recompute" : "", s.expert_tp, plan.expert_tp,
                s.expert_tp_ep, plan.gather, s.expert_dp, plan.expert_dp);
    EXPECT_DOUBLE_EQ(s.expert_tp, plan.expert_tp);
    EXPECT_DOUBLE_EQ(s.expert_tp_ep, plan.gather);
    EXPECT_DOUBLE_EQ(s.expert_dp, plan.expert_dp);
  }
}

TEST(PlanExpertTensorAboveTensor, AlltoallExchangeBytesMatchTheCountedStep) {
  expect_planned("alltoall", false);
  expect_planned("alltoall", true);
}

TEST(PlanExpertTensorAboveTensor, AllgatherBytesMatchTheCountedStep) {
  expect_planned("allgather", false);
}

}  // namespace
}  // namespace omni
