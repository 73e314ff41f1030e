// `omnitron plan`'s memory model against what the trainer really allocates: for small models
// at many layouts, every rank's parameter count equals its ParameterSet's size, the activation
// bytes equal GPTModel::activation_bytes() after a training step (within 1 %, the tolerance this
// test states; today they agree exactly), the workspace equals GPTModel::workspace_bytes()
// (exactly; under EP > 1 within the bounds the test states), and the distributed optimizer's
// shard is 1/(DP x CP) of the parameters; under Ulysses (--cp-comm-type a2a) the bytes a step sends
// over the cp group equal plan_ulysses_bytes exactly. Also: Korthikanti et al. 2022's Table 2
// formulas, the plan's figures adding up, and the search's order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <random>
#include <tuple>
#include <vector>

#include "comm/counting_communicator.h"
#include "comm/local_communicator.h"
#include "comm/process_grid.h"
#include "model/gpt_model.h"
#include "model/moe_layer.h"
#include "parallel/context_parallel.h"
#include "parallel/data_parallel.h"
#include "parallel/layout_run.h"
#include "parallel/pipeline.h"
#include "parallel/schedules.h"
#include "train/flops.h"
#include "train/plan.h"

namespace omni {
namespace {

// layout_run.h's tiny models: Llama-shaped (RMSNorm, SwiGLU, grouped queries, rope, untied,
// qk-layernorm) and GPT-2-shaped (LayerNorm, biases, learned positions, tied), here with
// qk-layernorm too so that its LayerNorm's biases are counted.
TransformerConfig tiny_llama() {
  return layout_test::tiny(true);
}
TransformerConfig tiny_gpt2() {
  TransformerConfig c = layout_test::tiny(false);
  c.qk_layernorm = true;
  return c;
}

struct Case {
  const char* name;
  TransformerConfig model;
  PlanLayout layout;  // gpus, tp, cp, pp, vp, dp, micro_batch, global_batch, sp, ... filled
};

PlanLayout layout(int tp, int cp, int pp, int vp, int dp, int micro_batches, bool sp,
                  const char* recompute = "", const char* method = "uniform", int layers = 1) {
  PlanLayout l;
  l.tp = tp, l.cp = cp, l.pp = pp, l.vp = vp, l.dp = dp, l.gpus = tp * cp * pp * dp;
  l.micro_batch = 2, l.global_batch = 2 * micro_batches * dp;
  l.sequence_parallel = sp && tp > 1;
  l.distributed_optimizer = dp * cp > 1;
  l.recompute = recompute, l.recompute_method = method, l.recompute_num_layers = layers;
  return l;
}

struct Measured {
  int pp_rank = 0;
  int64_t params = 0, activation_bytes = 0, shard = 0;
  int64_t workspace_bytes = 0;  // GPTModel::workspace_bytes() after the step
  // Algorithmic bytes (comm/counting_communicator.h) sent over the cp group during the step:
  // by all-to-alls (Ulysses), by anything else.
  double cp_all_to_all = 0, cp_other = 0;
};

// One training step of the case's layout on local ranks; each rank's ParameterSet size,
// activation bytes, distributed-optimizer shard and bytes sent over its cp group.
std::vector<Measured> measure(const Case& k) {
  const TransformerConfig& cfg = k.model;
  const PlanLayout& l = k.layout;
  const int n = l.micro_batch * cfg.seq_length, M = l.micro_batches();
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> id(0, cfg.vocab_size - 1);
  std::vector<std::vector<int32_t>> tokens(M, std::vector<int32_t>(n)), labels = tokens;
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < n; ++i) tokens[m][i] = id(rng), labels[m][i] = id(rng);
  std::vector<Measured> out(l.gpus);
  run_ranks(l.gpus, [&](Communicator& world) {
    Tally tally;
    CountingCommunicator counted(world, tally);
    ProcessGrid grid(counted,
                     ParallelLayout{.tp = l.tp, .cp = l.cp, .ep = l.ep, .pp = l.pp, .etp = l.etp});
    PipelineSplit split;
    split.num_layers = cfg.num_layers;
    split.pipeline_model_parallel_size = l.pp;
    split.num_layers_per_virtual_pipeline_stage = l.vp > 1 ? cfg.num_layers / (l.pp * l.vp) : 0;
    ModelParallel mp;
    mp.tp = &grid.tp(), mp.cp = &grid.cp(), mp.sequence_parallel = l.sequence_parallel;
    mp.ulysses = l.cp_comm_type == "a2a";
    if (l.ep > 1) mp.ep = &grid.ep();
    if (grid.own_expert_tp()) mp.expert_tp = &grid.expert_tp(), mp.tp_cp = &grid.tp_cp();
    mp.expert_tp_ep = grid.expert_tp_ep();  // ETP > TP's allgather
    for (const LayerRange& r : pipeline_rank_layers(split, grid.pp_rank()))
      mp.chunks.push_back({r.begin, r.end});
    mp.pre_process = grid.is_first_stage(), mp.post_process = grid.is_last_stage();
    GPTModel<float> model(cfg, l.micro_batch, 5, mp);
    Recompute rc;
    if (l.recompute == "full")
      rc = {Recompute::Full, l.recompute_method == "block" ? l.recompute_num_layers : 0};
    model.set_recompute(rc);
    std::vector<MicroBatch> full(M);
    std::vector<ContextParallelBatch> local(M);
    for (int m = 0; m < M; ++m) {
      full[m] =
          MicroBatch{tokens[m].data(), labels[m].data(), nullptr, l.micro_batch, cfg.seq_length};
      local[m].slice(full[m], l.cp, grid.cp_rank());
    }
    PipelineExecutor<float> pipe(model, grid.pp());
    tally.on = true;
    pipe.run(
        M, [&](int m) -> const MicroBatch& { return l.cp > 1 ? local[m].batch() : full[m]; }, true,
        1.0 / M);
    tally.on = false;
    Measured r{grid.pp_rank(), model.params().size(), model.activation_bytes()};
    r.workspace_bytes = model.workspace_bytes();
    for (const auto& [key, e] : tally.entries)
      if (key.first == "cp")
        (key.second == Call::AllToAll ? r.cp_all_to_all : r.cp_other) += e.algorithmic;
    if (l.distributed_optimizer) {
      DataParallelBuckets<float> ddp(grid.dp_cp(), model.params(), 0, GradReduce::ReduceScatter);
      for (const ShardRange& s : ddp.shard()) r.shard += s.end - s.begin;
    }
    out[world.rank()] = r;
  });
  return out;
}

// Every other layer an MoE layer: router, experts, shared expert and expert bias in place of
// the MLP.
TransformerConfig tiny_moe() {
  TransformerConfig c = tiny_llama();
  c.num_moe_experts = 4;
  c.moe_ffn_hidden_size = 12;
  c.moe_layer_freq = "2";
  c.moe_shared_expert_intermediate_size = 8;
  c.moe_router_score_function = MoEScoreFunction::Sigmoid;
  c.moe_router_enable_expert_bias = true;
  return c;
}

// Multi-token prediction (model/mtp.cpp): its depths and, past the first stage, the last
// stage's copy of the word embeddings; an MoE depth (every layer MoE), a dense one under TP.
TransformerConfig with_mtp(TransformerConfig c, int depths, const char* moe_freq = nullptr) {
  c.mtp_num_layers = depths;
  if (moe_freq) c.moe_layer_freq = moe_freq;
  return c;
}

// Multi-latent attention (layout_run.h's DeepSeek-shaped tiny model: q and kv latents with
// their RMSNorms, a rope part, v_head_dim 6 beside qk_head_dim 4 + rope 4).
TransformerConfig tiny_mla() {
  return layout_test::mla_layout_config({});
}

// DeepSeek's shape in small: MLA with MoE layers (a gated shared expert beside), `dispatcher`
// moving the tokens under expert parallelism.
TransformerConfig tiny_mla_moe(const char* dispatcher = "allgather") {
  TransformerConfig c = tiny_mla();
  c.num_moe_experts = 4, c.moe_ffn_hidden_size = 12, c.moe_layer_freq = "[0,1,1,1]";
  c.moe_router_topk = 2, c.moe_shared_expert_intermediate_size = 8;
  c.moe_shared_expert_gate = true;
  c.moe_router_score_function = MoEScoreFunction::Sigmoid;
  c.moe_router_enable_expert_bias = true;
  c.moe_token_dispatcher_type = dispatcher;
  return c;
}

// MoE layers whose experts take at most their capacity, padded to it (exact rows per expert).
TransformerConfig padded_moe() {
  TransformerConfig c = tiny_moe();
  c.moe_expert_capacity_factor = 1.5, c.moe_pad_expert_input_to_capacity = true;
  return c;
}

// GPT-2-shaped (linear biases) MoE layers.
TransformerConfig tiny_gpt2_moe() {
  TransformerConfig c = tiny_gpt2();
  c.num_moe_experts = 4, c.moe_ffn_hidden_size = 16, c.moe_layer_freq = "2";
  return c;
}

TransformerConfig alltoall_moe() {
  TransformerConfig c = tiny_moe();
  c.moe_token_dispatcher_type = "alltoall";
  return c;
}

PlanLayout with_ep(PlanLayout l, int ep, int etp = 0) {
  l.ep = ep, l.etp = etp;
  return l;
}

// Context parallelism by Ulysses' all-to-alls (--cp-comm-type a2a) instead of the ring.
PlanLayout ulysses(PlanLayout l) {
  l.cp_comm_type = "a2a";
  return l;
}

TransformerConfig tied_llama() {
  TransformerConfig c = tiny_llama();
  c.untie_embeddings_and_output_weights = false;
  return c;
}

std::vector<Case> cases() {
  return {
      {"one rank", tiny_llama(), layout(1, 1, 1, 1, 1, 2, false)},
      {"one rank, full recompute", tiny_llama(), layout(1, 1, 1, 1, 1, 2, false, "full")},
      {"one rank, block recompute of 3", tiny_gpt2(),
       layout(1, 1, 1, 1, 1, 2, false, "full", "block", 3)},
      {"one rank, selective recompute", tiny_gpt2(), layout(1, 1, 1, 1, 1, 2, false, "selective")},
      {"TP 2", tiny_llama(), layout(2, 1, 1, 1, 1, 2, false)},
      {"TP 2 + SP", tiny_gpt2(), layout(2, 1, 1, 1, 1, 2, true)},
      {"TP 2 + SP, full recompute", tiny_llama(), layout(2, 1, 1, 1, 1, 2, true, "full")},
      {"PP 2, 4 micro-batches (1F1B)", tiny_gpt2(), layout(1, 1, 2, 1, 1, 4, false)},
      {"PP 2 x VPP 2 (interleaved)", tiny_llama(), layout(1, 1, 2, 2, 1, 4, false)},
      {"PP 2 x TP 2 + SP, block recompute", tiny_gpt2(),
       layout(2, 1, 2, 1, 1, 4, true, "full", "block", 1)},
      {"CP 2", tiny_llama(), layout(1, 2, 1, 1, 1, 2, false)},
      // Ulysses: each layer keeps its H/CP heads' q, k, v and output over the whole sequence;
      // its all-to-alls' bytes are checked too.
      {"CP 2 Ulysses", tiny_llama(), ulysses(layout(1, 2, 1, 1, 1, 2, false))},
      {"TP 2 + SP x CP 2 Ulysses, full recompute", tiny_llama(),
       ulysses(layout(2, 2, 1, 1, 1, 2, true, "full"))},
      {"MLA, CP 2 Ulysses", tiny_mla(), ulysses(layout(1, 2, 1, 1, 1, 2, false))},
      {"CP 2 Ulysses x PP 2, MTP 1", with_mtp(tiny_llama(), 1),
       ulysses(layout(1, 2, 2, 1, 1, 4, false))},
      {"DP 2, distributed optimizer", tiny_gpt2(), layout(1, 1, 1, 1, 2, 2, false)},
      {"PP 2, MoE layers", tiny_moe(), layout(1, 1, 2, 1, 1, 4, false)},
      {"MoE layers, full recompute", tiny_moe(), layout(1, 1, 1, 1, 1, 2, false, "full")},
      {"PP 2, MTP 1 over MoE layers", with_mtp(tiny_moe(), 1, "1"),
       layout(1, 1, 2, 1, 1, 4, false)},
      {"TP 2 + SP, PP 2, MTP 2 (tied)", with_mtp(tied_llama(), 2), layout(2, 1, 2, 1, 1, 4, true)},
      {"TP 2 + SP, MTP 1 (GPT-2)", with_mtp(tiny_gpt2(), 1), layout(2, 1, 1, 1, 1, 2, true)},
      {"CP 2, MTP 1", with_mtp(tiny_llama(), 1), layout(1, 2, 1, 1, 1, 2, false)},
      {"MLA", tiny_mla(), layout(1, 1, 1, 1, 1, 2, false)},
      {"MLA, TP 2 + SP", tiny_mla(), layout(2, 1, 1, 1, 1, 2, true)},
      {"MLA, TP 2, selective recompute", tiny_mla(), layout(2, 1, 1, 1, 1, 2, false, "selective")},
      {"MLA, CP 2, full recompute", tiny_mla(), layout(1, 2, 1, 1, 1, 2, false, "full")},
      {"MoE layers, TP 2 + SP", tiny_moe(), layout(2, 1, 1, 1, 1, 2, true)},
      {"MoE layers, TP 2 + SP, full recompute", tiny_moe(), layout(2, 1, 1, 1, 1, 2, true, "full")},
      {"MoE padded to capacity, TP 2 + SP", padded_moe(), layout(2, 1, 1, 1, 1, 2, true)},
      {"MLA + MoE, TP 2 + SP, PP 2", tiny_mla_moe(), layout(2, 1, 2, 1, 1, 4, true)},
      {"MLA + MoE, TP 2 + SP, EP 2 allgather", tiny_mla_moe("allgather"),
       with_ep(layout(2, 1, 1, 1, 2, 1, true), 2)},
      {"MLA + MoE, EP 2 alltoall, CP 2", tiny_mla_moe("alltoall"),
       with_ep(layout(1, 2, 1, 1, 2, 1, false), 2)},
      // Expert tensor parallelism 1 under TP 2: each TP rank routes its half of the rows to
      // whole experts (EP 1: all of them; EP 2 over the TP ranks: half of them).
      {"MoE layers, TP 2 + SP, ETP 1", tiny_moe(), with_ep(layout(2, 1, 1, 1, 1, 2, true), 1, 1)},
      {"MLA + MoE, TP 2 + SP, ETP 1, EP 2 alltoall", tiny_mla_moe("alltoall"),
       with_ep(layout(2, 1, 1, 1, 1, 2, true), 2, 1)},
      // Expert tensor parallelism above TP: each rank routes its own rows, its experts run
      // the ETP ranks' rows gathered (alltoall) or the ETP x EP ranks' tokens (allgather).
      {"MoE alltoall, ETP 2 over DP 2", alltoall_moe(),
       with_ep(layout(1, 1, 1, 1, 2, 1, false), 1, 2)},
      {"MLA + MoE allgather, ETP 2 over DP 2", tiny_mla_moe("allgather"),
       with_ep(layout(1, 1, 1, 1, 2, 1, false), 1, 2)},
      {"MoE alltoall, TP 2 + SP, ETP 4 over DP 2", alltoall_moe(),
       with_ep(layout(2, 1, 1, 1, 2, 1, true), 1, 4)},
      {"MoE alltoall, ETP 2 x EP 2 over DP 4", alltoall_moe(),
       with_ep(layout(1, 1, 1, 1, 4, 1, false), 2, 2)},
      // Experts with linear biases: fc1's split with its rows, fc2's whole on every rank.
      {"GPT-2 MoE with biases, TP 2 + SP", tiny_gpt2_moe(), layout(2, 1, 1, 1, 1, 2, true)},
      {"GPT-2 MoE with biases, ETP 2 over DP 2", tiny_gpt2_moe(),
       with_ep(layout(1, 1, 1, 1, 2, 1, false), 1, 2)},
  };
}

// How many ranks share `m`'s pipeline stage.
int ranks_on_stage(const std::vector<Measured>& all, const Measured& m) {
  return int(std::count_if(all.begin(), all.end(),
                           [&](const Measured& o) { return o.pp_rank == m.pp_rank; }));
}

TEST(Plan, MemoryModelMatchesWhatTheTrainerAllocates) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name);
    const std::vector<Measured> all = measure(k);
    for (const Measured& m : all) {
      const int64_t params = plan_rank_parameters(k.model, k.layout, m.pp_rank);
      const int64_t act = plan_activation_bytes(k.model, k.layout, m.pp_rank, 4);
      // Under expert parallelism a rank's experts get the rows its routing sends them: the
      // plan's expected rows are the mean over the stage's ranks (exact when dropless).
      double measured = 0;
      int ranks = 0;
      for (const Measured& o : all)
        if (o.pp_rank == m.pp_rank) measured += double(o.activation_bytes), ++ranks;
      if (k.layout.ep == 1) measured = double(m.activation_bytes), ranks = 1;
      measured /= ranks;
      std::printf(
          "%-40s stage %d: parameters %lld (plan %lld), activations %lld B%s (plan %lld)\n", k.name,
          m.pp_rank, (long long)m.params, (long long)params, (long long)m.activation_bytes,
          ranks > 1 ? (", mean " + std::to_string(int64_t(measured))).c_str() : "", (long long)act);
      EXPECT_EQ(params, m.params) << "stage " << m.pp_rank;
      // The workspace (GPTModel::workspace_bytes: the model's scratch, the ring's or Ulysses'
      // blocks, the final norm and staged inputs per slot, MLA's, MTP's and the MoE layers'
      // scratch): exact, but under EP > 1, where the MoE layers' shared scratch grows to the
      // most rows a rank's experts receive in any layer and micro-batch, and the plan takes
      // the expected rows. There the mean over the stage's ranks is at least the plan's (each
      // buffer's size is a maximum of terms linear in the rows, whose mean over the ranks is
      // the expected; Jensen) and at most EP x its scratch (every rank's rows at one rank).
      const int64_t ws = plan_workspace_bytes(k.model, k.layout, m.pp_rank, 4, true);
      double ws_mean = 0;
      for (const Measured& o : all)
        if (o.pp_rank == m.pp_rank) ws_mean += double(o.workspace_bytes) / ranks_on_stage(all, o);
      std::printf("%-40s stage %d: workspace %lld B (plan %lld)\n", k.name, m.pp_rank,
                  (long long)m.workspace_bytes, (long long)ws);
      if (k.layout.ep == 1) {
        EXPECT_EQ(ws, m.workspace_bytes) << "stage " << m.pp_rank;
      } else {
        const double scratch = double(plan_moe_scratch_bytes(k.model, k.layout, 4));
        EXPECT_GE(ws_mean, double(ws)) << "stage " << m.pp_rank;
        EXPECT_LE(ws_mean, double(ws) + (k.layout.ep - 1) * scratch) << "stage " << m.pp_rank;
      }
      EXPECT_NEAR(double(act), measured, 0.01 * measured) << "stage " << m.pp_rank;
      // Ulysses: the cp group's all-to-alls, exactly as plan_ulysses_bytes counts them (the
      // time model's bytes). Besides them the group carries only the last stage's small
      // exchanges, which the plan leaves out (as for the ring): the loss sums over the sequence
      // (masked loss and token count, one double each per micro-batch, all-reduced: 2 (CP-1)/CP
      // x 8 B each) and, with MTP, the whole sequence's ids gathered (5 doubles a row, (CP-1)
      // x b s/CP rows sent) per micro-batch.
      if (k.layout.ulysses()) {
        const PlanLayout& l = k.layout;
        const double planned = plan_ulysses_bytes(k.model, l, m.pp_rank, 4);
        std::printf("%-40s stage %d: cp all-to-alls %.0f B (plan %.0f), other %.0f B\n", k.name,
                    m.pp_rank, m.cp_all_to_all, planned, m.cp_other);
        EXPECT_GT(planned, 0.0);
        EXPECT_DOUBLE_EQ(m.cp_all_to_all, planned) << "stage " << m.pp_rank;
        const double rows = double(l.micro_batch) * k.model.seq_length / l.cp;
        const double loss_sums = 2 * (2.0 * (l.cp - 1) / l.cp * 8);
        const double mtp_ids = k.model.mtp_num_layers > 0 ? (l.cp - 1) * rows * 5 * 8 : 0.0;
        EXPECT_DOUBLE_EQ(m.cp_other,
                         m.pp_rank == l.pp - 1 ? l.micro_batches() * (loss_sums + mtp_ids) : 0.0)
            << "stage " << m.pp_rank;
      }
      if (k.layout.distributed_optimizer) {  // buckets split with remainders: within an element
        EXPECT_NEAR(double(m.shard), double(m.params) / (k.layout.dp * k.layout.cp), 1.0);
      }
    }
  }
}

// Parameters (activations: MemoryModelMatchesWhatTheTrainerAllocates): multi-latent
// attention's projections, MoE layers split over TP (a shared expert and the
// expert bias beside), two multi-token prediction depths (MoE layers, as the last decoder
// layer is) and the last stage's embedding copy, at TP 2 x PP 2, as GPTModel lays them out.
TEST(Plan, LatentAttentionMoEAndMultiTokenPredictionParametersMatchTheModel) {
  TransformerConfig cfg = layout_test::mla_layout_config({});
  cfg.num_moe_experts = 4, cfg.moe_ffn_hidden_size = 12, cfg.moe_layer_freq = "[0,1,0,1]";
  cfg.moe_shared_expert_intermediate_size = 8, cfg.moe_shared_expert_gate = true;
  cfg.moe_router_score_function = MoEScoreFunction::Sigmoid;
  cfg.moe_router_enable_expert_bias = true;
  cfg.mtp_num_layers = 2;
  for (bool sp : {false, true}) {
    const PlanLayout l = layout(2, 1, 2, 1, 1, 4, sp);
    std::vector<int64_t> params(4);
    std::vector<int> stage(4);
    run_ranks(4, [&](Communicator& world) {
      ProcessGrid grid(world, ParallelLayout{.tp = 2, .pp = 2});
      PipelineSplit split;
      split.num_layers = cfg.num_layers, split.pipeline_model_parallel_size = 2;
      ModelParallel mp;
      mp.tp = &grid.tp(), mp.sequence_parallel = sp;
      for (const LayerRange& r : pipeline_rank_layers(split, grid.pp_rank()))
        mp.chunks.push_back({r.begin, r.end});
      mp.pre_process = grid.is_first_stage(), mp.post_process = grid.is_last_stage();
      GPTModel<float> model(cfg, l.micro_batch, 5, mp);
      params[world.rank()] = model.params().size(), stage[world.rank()] = grid.pp_rank();
    });
    for (int r = 0; r < 4; ++r)
      EXPECT_EQ(plan_rank_parameters(cfg, l, stage[r]), params[r]) << "rank " << r << " sp " << sp;
  }
}

// Expert parallelism 2 over two data-parallel ranks: each rank holds half of every MoE layer's
// experts, as GPTModel allocates them, and the plan's optimizer figure shards the experts over
// the expert-data-parallel group (1 rank here) and the rest over DP 2.
TEST(Plan, ExpertParallelMemoryMatchesTheModel) {
  const TransformerConfig cfg = tiny_moe();
  PlanLayout l = layout(1, 1, 1, 1, 2, 1, false);
  l.ep = 2;
  std::vector<int64_t> params(2), experts(2);
  run_ranks(2, [&](Communicator& world) {
    ProcessGrid grid(world, ParallelLayout{.ep = 2});
    ModelParallel mp;
    mp.ep = &grid.ep();
    mp.chunks.push_back({0, cfg.num_layers});
    GPTModel<float> model(cfg, l.micro_batch, 5, mp);
    params[world.rank()] = model.params().size();
    for (const ParamInfo& p : model.params().infos()) {
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      if (is_expert_parameter(p.name)) experts[world.rank()] += (n + 15) / 16 * 16;
    }
  });
  const int64_t planned = plan_rank_parameters(cfg, l, 0);
  const int64_t planned_experts = plan_rank_expert_parameters(cfg, l, 0);
  PlanLayout one = l;
  one.ep = 1;
  EXPECT_LT(planned, plan_rank_parameters(cfg, one, 0));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(params[r], planned) << "rank " << r;
    EXPECT_EQ(experts[r], planned_experts) << "rank " << r;
  }
  // fp32 on a GPU row: 8 B of AdamW state per parameter, the dense over DP 2, the experts over
  // the one expert-data-parallel rank.
  const Plan p = make_plan(cfg, l, plan_device("H100", 1));
  EXPECT_DOUBLE_EQ(p.memory[2].value,
                   double(planned - planned_experts) * 8 / 2 + double(planned_experts) * 8);
  EXPECT_GT(p.time[8].value, 0.0);  // the dispatch's collectives
  EXPECT_EQ(p.time[8].name, "EP dispatch");
  // ZeRO stage 3: the values and gradients too, 4 B each, the experts' over their one rank.
  PlanLayout zero3 = l;
  zero3.distributed_optimizer = true, zero3.zero_stage = 3;
  const Plan z = make_plan(cfg, zero3, plan_device("H100", 1));
  for (size_t i : {0, 1}) {
    EXPECT_DOUBLE_EQ(z.memory[i].value,
                     double(planned - planned_experts) * 4 / 2 + double(planned_experts) * 4)
        << z.memory[i].name;
    EXPECT_NE(z.memory[i].why.find("over the 1 expert-data-parallel ranks"), std::string::npos)
        << z.memory[i].why;
  }
}

// The pipeline holds min(PP - stage, M) micro-batches on each rank under 1F1B, and more on the
// first ranks under interleaving (Megatron's warm-up).
TEST(Plan, MicroBatchesInFlightFollowTheSchedule) {
  PlanLayout l;
  l.pp = 4, l.micro_batch = 1, l.global_batch = 8;
  EXPECT_EQ(plan_slots_in_flight(l, 0), std::vector<int>{4});
  EXPECT_EQ(plan_slots_in_flight(l, 3), std::vector<int>{1});
  l.global_batch = 2;
  EXPECT_EQ(plan_slots_in_flight(l, 0), std::vector<int>{2});
  l.vp = 2, l.global_batch = 8;
  const std::vector<int> first = plan_slots_in_flight(l, 0);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_GT(first[0] + first[1], 4);
}

// Korthikanti et al. 2022, Table 2, for their GPT-3 175B setting (s 2048, h 12288, a 96,
// t 8, b 1): sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh/t (34 + 5as/h) with
// sequence parallelism, 34 sbh/t with selective recompute too, 2sbh/t when full.
TEST(Plan, KorthikantiTable2) {
  TransformerConfig c;
  c.num_layers = 96, c.hidden_size = 12288, c.num_attention_heads = 96, c.seq_length = 2048;
  PlanLayout l;
  l.tp = 8, l.micro_batch = 1;
  const double sbh = 2048.0 * 12288.0, as_h = 96.0 * 2048.0 / 12288.0;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(c, l), sbh * (10 + 24.0 / 8 + 5 * as_h / 8));
  l.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(c, l), sbh / 8 * (34 + 5 * as_h));
  l.recompute = "selective";
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(c, l), sbh / 8 * 34);
  l.recompute = "full";
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(c, l), 2 * sbh / 8);
}

PlanDevice h100() {
  return plan_device("h100", 8);
}

TransformerConfig llama3_8b() {
  TransformerConfig c = tiny_llama();
  c.qk_layernorm = false, c.init_method_std = 0.02;
  c.num_layers = 32, c.hidden_size = 4096, c.ffn_hidden_size = 14336;
  c.num_attention_heads = 32, c.num_query_groups = 8, c.seq_length = 8192;
  c.vocab_size = 128256, c.make_vocab_size_divisible_by = 128;
  return c;
}

TEST(Plan, FiguresAddUpAndFollowTheLayout) {
  PlanLayout l = layout(2, 1, 2, 1, 2, 32, true);
  l.micro_batch = 1, l.global_batch = 64, l.precision = "bf16";
  const Plan p = make_plan(llama3_8b(), l, h100());
  double mem = 0, time = 0;
  for (size_t i = 0; i + 1 < p.memory.size(); ++i) mem += p.memory[i].value;
  for (size_t i = 0; i + 1 < p.time.size(); ++i) time += p.time[i].value;
  EXPECT_DOUBLE_EQ(mem, p.memory_bytes());
  EXPECT_DOUBLE_EQ(time, p.step_seconds());
  for (const PlanFigure& f : p.memory) EXPECT_FALSE(f.why.empty()) << f.name;
  for (const PlanFigure& f : p.time) EXPECT_FALSE(f.why.empty()) << f.name;
  EXPECT_TRUE(p.fits());
  // Megatron's table: bf16 with the distributed optimizer is 6 + 12/d bytes per parameter.
  const double P = double(plan_rank_parameters(llama3_8b(), l, p.stage));
  EXPECT_DOUBLE_EQ(p.memory[0].value + p.memory[1].value + p.memory[2].value, P * (6 + 12.0 / 2));
  // Full recompute keeps less and computes more.
  PlanLayout rc = l;
  rc.recompute = "full", rc.recompute_method = "uniform", rc.recompute_num_layers = 1;
  const Plan q = make_plan(llama3_8b(), rc, h100());
  EXPECT_LT(q.memory_bytes(), p.memory_bytes());
  EXPECT_GT(q.time[0].value, p.time[0].value);
  // A bigger pipeline bubble with fewer micro-batches.
  PlanLayout few = l;
  few.global_batch = 8;
  const Plan r = make_plan(llama3_8b(), few, h100());
  EXPECT_GT(r.time[6].value / r.time[0].value, p.time[6].value / p.time[0].value);
}

// The CPU's one fraction of peak: 0.85 of the sgemm rate in fp32, its own (0.70 as
// plan_devices.cpp measures the CPU) of the bf16 GEMM's rate under --bf16, each named in the
// compute figure's words. The device is written out here: measuring this machine's takes
// seconds.
TEST(Plan, CpuBf16ComputeAtItsOwnFraction) {
  PlanDevice cpu;
  cpu.name = "cpu", cpu.host_memory = true;
  cpu.fp32_tflops = 0.2, cpu.bf16_tflops = 0.4;
  cpu.compute_efficiency = 0.85, cpu.bf16_compute_efficiency = 0.7;
  cpu.memory_gib = 24, cpu.hbm_gbps = 50, cpu.intra_gbps = 12, cpu.inter_gbps = 12;
  PlanLayout l = layout(1, 1, 1, 1, 1, 4, false);
  const Plan fp32 = make_plan(tiny_llama(), l, cpu);
  l.precision = "bf16";
  const Plan bf16 = make_plan(tiny_llama(), l, cpu);
  EXPECT_NE(fp32.time[0].why.find("at 85%"), std::string::npos) << fp32.time[0].why;
  EXPECT_NE(bf16.time[0].why.find("at 70%"), std::string::npos) << bf16.time[0].why;
  EXPECT_NEAR(fp32.time[0].value / bf16.time[0].value, (0.4 * 0.7) / (0.2 * 0.85), 1e-9);
}

// Narayanan et al. 2021, Table 1 (bench/plan_narayanan.sh prints it): GPT models on DGX A100s,
// fp16, full recompute, micro-batch 1, Megatron's dropout 0.1, with the two switches for how
// those runs ran. Their per-GPU teraFLOP/s count the recomputed forward: 96 B s l h^2 (1 +
// s/6h + V/16lh). Each within 15 %; without the materialised score matrix the small models
// come out far too fast.
TEST(Plan, NarayananTable1WithinFifteenPercent) {
  struct Row {
    int heads, hidden, layers, tp, pp, gpus, batch;
    double published;
  };
  const Row rows[] = {
      {24, 2304, 24, 1, 1, 32, 512, 137},        {32, 3072, 30, 2, 1, 64, 512, 138},
      {32, 4096, 36, 4, 1, 128, 512, 142},       {48, 6144, 40, 8, 1, 256, 1024, 135},
      {64, 8192, 48, 8, 2, 512, 1536, 138},      {80, 10240, 60, 8, 4, 1024, 1792, 140},
      {96, 12288, 80, 8, 8, 1536, 2304, 148},    {128, 16384, 96, 8, 16, 1920, 2160, 155},
      {128, 20480, 105, 8, 35, 2520, 2520, 163}, {160, 25600, 128, 8, 64, 3072, 3072, 163}};
  const PlanDevice a100 = plan_device("A100", 1);
  for (const Row& r : rows) {
    TransformerConfig c;
    c.num_layers = r.layers, c.hidden_size = r.hidden, c.num_attention_heads = r.heads;
    c.seq_length = 2048, c.vocab_size = 51200;
    c.hidden_dropout = c.attention_dropout = 0.1;
    PlanLayout l = layout(r.tp, 1, r.pp, 1, r.gpus / (r.tp * r.pp), 1, false, "full");
    l.micro_batch = 1, l.global_batch = r.batch, l.distributed_optimizer = false;
    l.precision = "fp16", l.attention_backend = "local", l.scatter_gather_p2p = true;
    auto tflops = [&](const Plan& p) {
      const double s = 2048, h = r.hidden, L = r.layers, V = 51200;
      return 96 * r.batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)) /
             p.step_seconds() / r.gpus / 1e12;
    };
    const double got = tflops(make_plan(c, l, a100));
    SCOPED_TRACE(std::to_string(r.hidden) + " hidden: " + std::to_string(got) + " TFLOP/s");
    EXPECT_NEAR(got, r.published, 0.15 * r.published);
    if (r.hidden == 2304) {  // flash-style attention would be 45 % too fast
      l.attention_backend = "auto";
      EXPECT_GT(tflops(make_plan(c, l, a100)), 1.3 * r.published);
    }
    if (r.pp > 1) {  // each TP rank's NIC carries 1/TP of the sends
      PlanLayout whole = l;
      whole.scatter_gather_p2p = false;
      EXPECT_LT(make_plan(c, l, a100).time[5].value, make_plan(c, whole, a100).time[5].value);
    }
  }
}

// MoE models are searched under TP (with SP, as Megatron requires for MoE) and CP: the tiny
// MoE model's fitting layouts include both, and every TP > 1 one runs SP.
TEST(Plan, SearchTriesMoeModelsUnderTensorAndContextParallelism) {
  PlanLayout base;
  base.gpus = 8, base.global_batch = 64;
  const PlanSearch s = search_plans(tiny_moe(), base, h100(), 1000);
  ASSERT_FALSE(s.fitting.empty());
  bool tensor_parallel = false, context_parallel = false;
  for (const Plan& p : s.fitting) {
    if (p.layout.tp > 1) {
      EXPECT_TRUE(p.layout.sequence_parallel) << p.layout.describe();
    }
    tensor_parallel = tensor_parallel || p.layout.tp > 1;
    context_parallel = context_parallel || p.layout.cp > 1;
  }
  EXPECT_TRUE(tensor_parallel);
  EXPECT_TRUE(context_parallel);
}

// One MoE layer too big for a rank's memory at TP 1, which neither PP (one layer), CP (8190
// tokens: not a multiple of 2 CP) nor recompute can shrink: only TP > 1 + SP layouts fit, and the
// search finds them. The plan's MoE figures follow TP: the experts' parameters and rows 1/TP wide.
TEST(Plan, SearchSplitsAnMoeModelThatOnlyFitsUnderTensorParallelism) {
  TransformerConfig c = tiny_llama();
  c.qk_layernorm = false, c.init_method_std = 0.02;
  c.num_layers = 1, c.hidden_size = 8192, c.num_attention_heads = 64, c.num_query_groups = 8;
  c.ffn_hidden_size = 28672, c.seq_length = 8190, c.vocab_size = 32000;
  c.num_moe_experts = 8, c.moe_router_topk = 8, c.moe_ffn_hidden_size = 57344;
  c.moe_token_dispatcher_type = "alltoall";
  PlanLayout base;
  base.gpus = 8, base.global_batch = 16, base.precision = "bf16";
  const PlanSearch s = search_plans(c, base, h100(), 1000);
  ASSERT_FALSE(s.fitting.empty());
  for (const Plan& p : s.fitting) {
    EXPECT_GT(p.layout.tp, 1) << p.layout.describe();
    EXPECT_TRUE(p.layout.sequence_parallel) << p.layout.describe();
  }
  PlanLayout one = base, two = base;
  one.dp = 8, two.tp = 2, two.dp = 4, two.sequence_parallel = true;
  one.micro_batch = two.micro_batch = 2;
  EXPECT_FALSE(make_plan(c, one, h100()).fits());
  const int64_t experts1 = plan_rank_expert_parameters(c, one, 0);
  EXPECT_EQ(plan_rank_expert_parameters(c, two, 0), experts1 / 2);
  // Each TP rank routes the micro-batch's 2 x 8190 tokens to top-8 rows of half the width.
  const double rows = 2.0 * 8190 * 8;
  const double one_b = double(plan_moe_layer_bytes(c, one, 2));
  const double two_b = double(plan_moe_layer_bytes(c, two, 2));
  EXPECT_NEAR(one_b - two_b, rows * (3.0 * 57344 / 2) * 2, 0.001 * one_b);
}

// --search varies expert parallelism over the divisors of the experts count (4) that training's
// world rule lets the layout take, and the experts' tensor parallelism (TP, 1 under TP > 1, 2 TP);
// a given EP (keep_ep) or ETP (keep_etp) stays in every layout tried.
TEST(Plan, SearchVariesExpertParallelismUnlessGiven) {
  PlanLayout base;
  base.gpus = 8, base.global_batch = 64;
  const PlanSearch s = search_plans(tiny_moe(), base, h100(), 1000);
  EXPECT_TRUE(s.searched_ep);
  std::vector<int> seen;
  EXPECT_TRUE(s.searched_etp);
  bool etp1 = false, wider = false;
  for (const Plan& p : s.fitting) {
    const PlanLayout& l = p.layout;
    EXPECT_EQ(4 % l.ep, 0) << l.describe();
    // The experts' grid ETP x EP x PP divides the GPUs (with ETP = TP: EP divides DP).
    EXPECT_EQ(l.gpus % (l.expert_tp() * l.ep * l.pp), 0) << l.describe();
    if (l.expert_tp() == l.tp) {
      EXPECT_EQ(l.dp % l.ep, 0) << l.describe();
    }
    EXPECT_TRUE(l.expert_tp() == l.tp || l.expert_tp() == 1 || l.expert_tp() == 2 * l.tp)
        << l.describe();
    etp1 = etp1 || l.expert_tp() < l.tp;
    wider = wider || l.expert_tp() > l.tp;
    if (std::find(seen.begin(), seen.end(), l.ep) == seen.end()) seen.push_back(l.ep);
  }
  EXPECT_TRUE(etp1);
  EXPECT_TRUE(wider);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 4}));
  // A given ETP (keep_etp) stays: ETP 1 also under TP 1, never TP's above it.
  PlanLayout one = base;
  one.etp = 1;
  const PlanSearch kept_etp = search_plans(tiny_moe(), one, h100(), 1000, false, true);
  EXPECT_FALSE(kept_etp.searched_etp);
  ASSERT_FALSE(kept_etp.fitting.empty());
  for (const Plan& p : kept_etp.fitting) EXPECT_EQ(p.layout.expert_tp(), 1) << p.layout.describe();
  base.ep = 2;
  const PlanSearch kept = search_plans(tiny_moe(), base, h100(), 1000, true);
  EXPECT_FALSE(kept.searched_ep);
  ASSERT_FALSE(kept.fitting.empty());
  for (const Plan& p : kept.fitting) EXPECT_EQ(p.layout.ep, 2) << p.layout.describe();
  EXPECT_LT(kept.tried, s.tried);
  // A dense model has no EP to vary.
  base.ep = 1;
  EXPECT_FALSE(search_plans(tiny_llama(), base, h100(), 1).searched_ep);
}

// Layers that do not divide among the stages split unevenly, as --decoder-first/last-pipeline-
// num-layers do: 5 layers over PP 2 as 3 + 2, over PP 4 as 2 + 1 + 1 + 1; every stage's share
// adds up to the model.
TEST(Plan, SearchSplitsLayersUnevenlyOverTheStages) {
  TransformerConfig c = tiny_llama();
  c.num_layers = 5;
  PlanLayout base;
  base.gpus = 4, base.global_batch = 16;
  const PlanSearch s = search_plans(c, base, h100(), 1000);
  std::vector<int> pipelines;
  for (const Plan& p : s.fitting) {
    if (p.layout.pp == 1) continue;
    int layers = 0;
    for (int stage = 0; stage < p.layout.pp; ++stage)
      for (const LayerRange& r : plan_stage_layers(c, p.layout, stage)) layers += r.size();
    EXPECT_EQ(layers, 5) << p.layout.describe();
    EXPECT_EQ(p.layout.first_stage_layers, p.layout.pp == 2 ? 3 : 2) << p.layout.describe();
    EXPECT_EQ(p.layout.last_stage_layers, p.layout.pp == 2 ? 2 : 1) << p.layout.describe();
    if (std::find(pipelines.begin(), pipelines.end(), p.layout.pp) == pipelines.end())
      pipelines.push_back(p.layout.pp);
  }
  std::sort(pipelines.begin(), pipelines.end());
  EXPECT_EQ(pipelines, (std::vector<int>{2, 4}));
}

// The GPU time model takes each product at its own size: an MoE layer of 64 experts (top-8, each
// 1/8 of the dense MLP's width, so the same FLOPs by the model's count) runs its experts on
// 1/8 of the tokens each, small products at a lower fraction of peak, and its router besides:
// the same FLOPs take longer. Expert parallelism gathers more rows per expert (EP x as many):
// larger products, faster per FLOP.
TEST(Plan, SmallExpertsTakeLongerPerFlopThanADenseMlp) {
  TransformerConfig dense = llama3_8b();
  dense.num_layers = 4, dense.seq_length = 4096;
  TransformerConfig moe = dense;
  moe.num_moe_experts = 64, moe.moe_router_topk = 8;
  moe.moe_ffn_hidden_size = dense.ffn_hidden_size / 8;
  moe.moe_token_dispatcher_type = "alltoall";
  ASSERT_DOUBLE_EQ(narayanan_flops_per_iteration(moe, 64),
                   narayanan_flops_per_iteration(dense, 64));
  PlanLayout l = layout(1, 1, 1, 1, 8, 8, false);
  l.micro_batch = 1, l.global_batch = 64, l.precision = "bf16";
  const Plan d = make_plan(dense, l, h100()), m = make_plan(moe, l, h100());
  ASSERT_EQ(d.time[0].name, "compute");
  // 1 x 4096 tokens: the dense fc1 is 2 x 4096 x 4096 x 2 x 14336 = 962 GFLOP (0.7 of peak), an
  // expert's 4096 x 8 / 64 = 512 rows of 1792: 15 GFLOP (0.6), its fc2 7.5 GFLOP.
  EXPECT_GT(m.time[0].value, 1.05 * d.time[0].value);
  EXPECT_NE(m.time[0].why.find("64 experts of 512 rows each"), std::string::npos) << m.time[0].why;
  l.ep = 8;  // 4096 rows per expert, 8 experts per rank
  const Plan m8 = make_plan(moe, l, h100());
  EXPECT_NE(m8.time[0].why.find("8 experts of 4096 rows each"), std::string::npos)
      << m8.time[0].why;
  EXPECT_LT(m8.time[0].value, m.time[0].value);
}

// The EP figure: alltoall moves top-k x tokens rows, (EP-1)/EP of them; allgather every
// rank's tokens and routing, (EP-1) x a rank's.
TEST(Plan, ExpertDispatchTimeFollowsTheDispatcher) {
  TransformerConfig c = tiny_moe();
  c.moe_router_topk = 2;
  PlanLayout l = layout(1, 1, 1, 1, 4, 1, false);
  l.ep = 4;
  c.moe_token_dispatcher_type = "alltoall";
  const Plan a = make_plan(c, l, h100());
  c.moe_token_dispatcher_type = "allgather";
  const Plan g = make_plan(c, l, h100());
  ASSERT_EQ(a.time[8].name, "EP dispatch");
  // Per MoE layer (4, one micro-batch of 16 tokens of 32 floats): alltoall 4 x 3/4 x 32 rows;
  // allgather 3 x (the routing, 1 + 2 x 16 x 2 floats, the tokens, the outputs; the output
  // and input gradients and the probabilities' 16 x 2), so allgather / alltoall is about
  // EP / top-k = 2 and a little more for the routing.
  const double alltoall = 4 * (4 * 0.75 * 32 * 32 * 4);
  const double allgather = 4 * 3 * ((1 + 2 * 16 * 2) * 4 + (4 * 16 * 32 + 16 * 2) * 4.0);
  c.moe_token_dispatcher_type = "alltoall";
  EXPECT_DOUBLE_EQ(plan_expert_traffic(c, l, 0, 4).ep, alltoall);
  c.moe_token_dispatcher_type = "allgather";
  EXPECT_DOUBLE_EQ(plan_expert_traffic(c, l, 0, 4).gather, allgather);
  EXPECT_NEAR(g.time[8].value / a.time[8].value, allgather / alltoall, 1e-9);
}

// Expert tensor parallelism 1 under TP 2 + SP, EP 2 on 4 GPUs: each rank routes half the
// micro-batch's tokens (half ETP 2's all-to-all bytes, over a node's link either way), holds
// whole experts (twice ETP 2's expert parameters) and shards their optimizer states over the
// expert grid's 2 EDP ranks, as the dense ones over DP 2 (ETP 2: EDP 1, not sharded). Without
// SP, training's refusal.
TEST(Plan, ExpertTensorParallelismOfOne) {
  TransformerConfig c = tiny_moe();
  c.moe_token_dispatcher_type = "alltoall";
  const PlanLayout l2 = with_ep(layout(2, 1, 1, 1, 2, 1, true), 2);
  const PlanLayout l1 = with_ep(l2, 2, 1);
  const Plan e2 = make_plan(c, l2, h100()), e1 = make_plan(c, l1, h100());
  const Plan dense = make_plan(tiny_llama(), layout(2, 1, 1, 1, 2, 1, true), h100());
  auto figure = [](const std::vector<PlanFigure>& f, const std::string& name) {
    for (const PlanFigure& x : f)
      if (x.name == name) return x;
    ADD_FAILURE() << "no figure " << name;
    return PlanFigure{};
  };
  EXPECT_NEAR(figure(e1.time, "EP dispatch").value, figure(e2.time, "EP dispatch").value / 2,
              1e-15);
  EXPECT_EQ(plan_rank_expert_parameters(c, l1, 0), 2 * plan_rank_expert_parameters(c, l2, 0));
  auto optimizer_per_parameter = [&](const Plan& p) {
    return figure(p.memory, "optimizer").value / figure(p.memory, "parameters").value;
  };
  EXPECT_DOUBLE_EQ(optimizer_per_parameter(e1), optimizer_per_parameter(dense));
  EXPECT_GT(optimizer_per_parameter(e2), optimizer_per_parameter(dense));
  // ETP 2's experts reduce over their own EDP 1; ETP 1's over 2 ranks, as the dense layers'.
  EXPECT_NE(figure(e2.time, "DP grad reduce").why.find("over the 1 expert-data-parallel ranks"),
            std::string::npos);
  EXPECT_EQ(figure(e1.time, "DP grad reduce").why.find("expert-data-parallel"), std::string::npos);
  // Without a shared expert the MoE layers (every other one) move nothing on the tp group at
  // ETP 1 (model/moe_layer.h's moe_takes_block_rows): their MLP's two of a layer's four pairs.
  TransformerConfig unshared = c;
  unshared.moe_shared_expert_intermediate_size = 0;
  const double tp_comm = figure(make_plan(unshared, l2, h100()).time, "TP/SP comm").value;
  const PlanFigure block = figure(make_plan(unshared, l1, h100()).time, "TP/SP comm");
  EXPECT_NEAR(block.value, tp_comm * 0.75, 1e-9 * tp_comm);
  EXPECT_NE(block.why.find("over their ETP 1 block: none"), std::string::npos) << block.why;
  EXPECT_DOUBLE_EQ(figure(e1.time, "TP/SP comm").value, figure(e2.time, "TP/SP comm").value);
  PlanLayout no_sp = l1;
  no_sp.sequence_parallel = false;
  try {
    make_plan(c, no_sp, h100());
    ADD_FAILURE() << "ETP 1 without SP planned";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("needs --sequence-parallel"), std::string::npos)
        << e.what();
  }
}

// ETP above TP (TP 1, ETP 2 over DP 2): each expert 1/ETP wide (half ETP 1's expert
// parameters), their optimizer states over the expert grid's data-parallel ranks (GPUs /
// (ETP x EP x PP) = 1: not sharded, the dense ones over DP 2), their gradients reduced over
// those (none here); each MoE layer's experts run both ranks' rows, gathered and their
// outputs reduce-scattered over the ETP group under alltoall ("ETP exchange"; allgather
// gathers the tokens over ETP x EP instead, "EP dispatch"); at TP 2 + SP, ETP 4, without a
// shared expert, the MoE layers move nothing over TP (each rank's rows come back whole).
// The bytes against a counted step: test_plan_etp.cpp.
TEST(Plan, ExpertTensorParallelismAboveTensorIsPriced) {
  auto figure = [](const std::vector<PlanFigure>& f, const std::string& name) {
    for (const PlanFigure& x : f)
      if (x.name == name) return x;
    ADD_FAILURE() << "no figure " << name;
    return PlanFigure{};
  };
  TransformerConfig c = alltoall_moe();
  const PlanLayout l1 = with_ep(layout(1, 1, 1, 1, 2, 1, false), 1, 1);
  const PlanLayout l2 = with_ep(l1, 1, 2);
  const Plan e1 = make_plan(c, l1, h100()), e2 = make_plan(c, l2, h100());
  const int64_t experts1 = plan_rank_expert_parameters(c, l1, 0);
  EXPECT_EQ(plan_rank_expert_parameters(c, l2, 0) * 2, experts1);
  const double P2 = double(plan_rank_parameters(c, l2, 0));
  const double Pe2 = double(plan_rank_expert_parameters(c, l2, 0));
  // fp32 on a GPU: 8 B of AdamW state per parameter, the dense over DP 2, the experts over
  // their one expert-data-parallel rank.
  EXPECT_DOUBLE_EQ(figure(e2.memory, "optimizer").value, (P2 - Pe2) * 8 / 2 + Pe2 * 8);
  EXPECT_NE(figure(e2.memory, "optimizer").why.find("over the 1 expert-data-parallel ranks"),
            std::string::npos);
  // The expert rows: both ranks' top-2 x 16 tokens, 1/2 of the width; ETP 1's its own.
  EXPECT_NE(figure(e2.memory, "activations").why.find("64 expert rows each (ETP 2 ranks' top-2"),
            std::string::npos)
      << figure(e2.memory, "activations").why;
  const PlanFigure x = figure(e2.time, "ETP exchange");
  EXPECT_GT(x.value, 0.0);
  EXPECT_NE(x.why.find("with 1 other ETP rank: "), std::string::npos) << x.why;
  EXPECT_EQ(figure(e1.time, "ETP exchange").value, 0.0);
  // Per step: 4 MoE layers x 4 x (ETP-1) x 32 rows x 32 x 4 B + their counts.
  const PlanExpertTraffic t = plan_expert_traffic(c, l2, 0, 4);
  EXPECT_DOUBLE_EQ(t.expert_tp, 4 * (4 * 32 * 32 * 4.0 + 4 * 8));
  const PlanDevice d = h100();  // the ETP group in one node
  EXPECT_DOUBLE_EQ(x.value, t.expert_tp / (d.intra_gbps * d.link_efficiency * 1e9));
  // The same FLOPs by the model's count (flops.h); each expert's products run both ranks'
  // rows (ETP 1: 8 each).
  EXPECT_NE(figure(e2.time, "compute").why.find("4 experts of 16 rows each"), std::string::npos)
      << figure(e2.time, "compute").why;
  // allgather: the tokens over the tp-ep group of ETP x EP = 2 ranks, nothing exchanged.
  c.moe_token_dispatcher_type = "allgather";
  const Plan g2 = make_plan(c, l2, h100());
  EXPECT_EQ(figure(g2.time, "ETP exchange").value, 0.0);
  EXPECT_GT(figure(g2.time, "EP dispatch").value, 0.0);
  EXPECT_NE(figure(g2.time, "EP dispatch").why.find("over 2 ranks (ETP 2 x EP 1)"),
            std::string::npos)
      << figure(g2.time, "EP dispatch").why;
  // TP 2 + SP, ETP 4 over DP 2, no shared expert: the MoE layers' (every other) MLP pairs
  // leave TP, as at ETP 1.
  TransformerConfig unshared = alltoall_moe();
  unshared.moe_shared_expert_intermediate_size = 0;
  const PlanLayout t2 = layout(2, 1, 1, 1, 2, 1, true);
  const double tp_comm = figure(make_plan(unshared, t2, h100()).time, "TP/SP comm").value;
  const PlanFigure wide = figure(make_plan(unshared, with_ep(t2, 1, 4), h100()).time, "TP/SP comm");
  EXPECT_NEAR(wide.value, tp_comm * 0.75, 1e-9 * tp_comm);
  EXPECT_NE(wide.why.find("none (ETP 4: each rank's rows whole)"), std::string::npos) << wide.why;
  // Training's refusal of ETP 4 at TP 2 without SP; biased experts split over ETP ranks are
  // built and planned.
  try {
    make_plan(unshared, with_ep(layout(2, 1, 1, 1, 2, 1, false), 1, 4), h100());
    ADD_FAILURE() << "ETP 4 at TP 2 without SP: planned";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("needs --sequence-parallel"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(make_plan(tiny_gpt2_moe(), l2, h100()).fits());
}

TEST(Plan, SearchListsFittingLayoutsFastestFirst) {
  PlanLayout base;
  base.gpus = 8, base.global_batch = 64, base.precision = "bf16";
  const PlanSearch s = search_plans(llama3_8b(), base, h100(), 5);
  ASSERT_FALSE(s.fitting.empty());
  EXPECT_LE(s.fitting.size(), 5u);
  EXPECT_GT(s.too_big, 0);  // TP 1 without recompute at 8192 tokens does not fit
  for (size_t i = 0; i < s.fitting.size(); ++i) {
    EXPECT_TRUE(s.fitting[i].fits());
    EXPECT_EQ(s.fitting[i].layout.gpus, 8);
    if (i) {
      EXPECT_LE(s.fitting[i - 1].step_seconds(), s.fitting[i].step_seconds());
    }
  }
}

TEST(Plan, UnknownDeviceNamesTheKnownOnes) {
  try {
    plan_device("V100", 1);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'V100'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MI325X"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace omni
