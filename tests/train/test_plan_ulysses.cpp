// `omnitron plan` under Ulysses context parallelism (--cp-comm-type a2a, parallel/ulysses.h):
// the bytes a training step sends over the context-parallel group, counted by
// comm/counting_communicator.h on in-process ranks (a tiny Llama-shaped model at CP 2, with and
// without full recompute), equal plan_ulysses_bytes exactly; the plan refuses the heads that
// training refuses, in one line, and prices the all-to-alls instead of the ring. (The kept
// activations: Plan.MemoryModelMatchesWhatTheTrainerAllocates's Ulysses cases.)
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/counting_communicator.h"
#include "comm/local_communicator.h"
#include "comm/process_grid.h"
#include "model/gpt_model.h"
#include "parallel/context_parallel.h"
#include "parallel/layout_run.h"
#include "parallel/pipeline.h"
#include "train/plan.h"

namespace omni {
namespace {

// Llama-shaped (grouped queries: 8 heads, 4 groups of width 4; qk-layernorm, rope), 4 layers.
TransformerConfig model() {
  TransformerConfig c = layout_test::tiny(true);
  c.num_layers = 4;
  c.validate();
  return c;
}

PlanLayout ulysses_layout(int tp, int cp, bool recompute) {
  PlanLayout l;
  l.tp = tp, l.cp = cp, l.gpus = tp * cp, l.cp_comm_type = "a2a";
  l.sequence_parallel = tp > 1;
  l.micro_batch = 2, l.global_batch = 2 * 2;  // two micro-batches
  if (recompute) l.recompute = "full", l.recompute_method = "uniform";
  return l;
}

// One training step (forward and backward of the micro-batches) on l.gpus local ranks with
// Ulysses attention; the algorithmic bytes each rank sent over its cp group: by all-to-alls,
// and by anything else.
struct Sent {
  double all_to_all = 0, other = 0;
};

std::vector<Sent> count_cp_bytes(const TransformerConfig& cfg, const PlanLayout& l) {
  const int n = l.micro_batch * cfg.seq_length, M = l.micro_batches();
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> id(0, cfg.vocab_size - 1);
  std::vector<std::vector<int32_t>> tokens(M, std::vector<int32_t>(n)), labels = tokens;
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < n; ++i) tokens[m][i] = id(rng), labels[m][i] = id(rng);
  std::vector<Sent> out(l.gpus);
  run_ranks(l.gpus, [&](Communicator& world) {
    Tally tally;
    CountingCommunicator counted(world, tally);
    ProcessGrid grid(counted, ParallelLayout{.tp = l.tp, .cp = l.cp});
    ModelParallel mp;
    mp.tp = &grid.tp(), mp.cp = &grid.cp(), mp.sequence_parallel = l.sequence_parallel;
    mp.ulysses = l.cp_comm_type == "a2a";
    mp.chunks = {{0, cfg.num_layers}};
    GPTModel<float> model(cfg, l.micro_batch, 5, mp);
    if (l.recompute == "full") model.set_recompute({Recompute::Full, 0});
    std::vector<MicroBatch> full(M);
    std::vector<ContextParallelBatch> local(M);
    for (int m = 0; m < M; ++m) {
      full[m] =
          MicroBatch{tokens[m].data(), labels[m].data(), nullptr, l.micro_batch, cfg.seq_length};
      local[m].slice(full[m], l.cp, grid.cp_rank());
    }
    PipelineExecutor<float> pipe(model, grid.pp());
    tally.on = true;
    pipe.run(M, [&](int m) -> const MicroBatch& { return local[m].batch(); }, true, 1.0 / M);
    tally.on = false;
    Sent& s = out[world.rank()];
    for (const auto& [key, e] : tally.entries) {
      if (key.first != "cp") continue;
      (key.second == Call::AllToAll ? s.all_to_all : s.other) += e.algorithmic;
    }
  });
  return out;
}

void expect_planned(const PlanLayout& l) {
  SCOPED_TRACE(l.describe());
  const TransformerConfig cfg = model();
  const double planned = plan_ulysses_bytes(cfg, l, 0, 4);
  EXPECT_GT(planned, 0.0);
  // Besides Ulysses, the cp group carries only the loss head's sums over the sequence (the
  // masked loss and the token count, one double each per micro-batch, all-reduced: 2 (CP-1)/CP
  // x 8 B each), which the plan leaves out (ring attention's plans too).
  const double loss_sums = l.micro_batches() * 2 * (2.0 * (l.cp - 1) / l.cp * 8);
  for (const Sent& s : count_cp_bytes(cfg, l)) {
    std::printf("%s: cp group all-to-alls %.0f B sent (plan %.0f), other %.0f B\n",
                l.describe().c_str(), s.all_to_all, planned, s.other);
    EXPECT_DOUBLE_EQ(s.all_to_all, planned);
    EXPECT_DOUBLE_EQ(s.other, loss_sums);
  }
}

TEST(PlanUlysses, AllToAllBytesMatchTheCountedStep) {
  expect_planned(ulysses_layout(1, 2, false));
  expect_planned(ulysses_layout(1, 2, true));
}

// Under TP 2 + SP each rank exchanges its TP share of the heads (8/2 queries, 4/2 groups).
TEST(PlanUlysses, AllToAllBytesUnderTensorParallelMatchTheCountedStep) {
  expect_planned(ulysses_layout(2, 2, false));
}

TEST(PlanUlysses, RefusesHeadsThatDoNotSplitAndPricesTheAllToAlls) {
  const TransformerConfig cfg = model();  // 8 heads, 4 query groups
  const PlanDevice h100 = plan_device("h100", 8);
  // TP 2 x CP 4 = 8 does not divide the 4 groups: refused, as training refuses it.
  PlanLayout bad = ulysses_layout(2, 4, false);
  try {
    make_plan(cfg, bad, h100);
    ADD_FAILURE() << "TP 2 x CP 4 Ulysses with 4 query groups was planned";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(what.find("--num-query-groups (4)"), std::string::npos) << what;
    EXPECT_NE(what.find("--context-parallel-size (4)"), std::string::npos) << what;
  }
  // The ring takes the same layout.
  PlanLayout ring = bad;
  ring.cp_comm_type = "p2p";
  EXPECT_NO_THROW(make_plan(cfg, ring, h100));

  const PlanLayout a2a = ulysses_layout(1, 2, true);
  ring = a2a;
  ring.cp_comm_type = "p2p";
  const Plan u = make_plan(cfg, a2a, h100), r = make_plan(cfg, ring, h100);
  const PlanFigure *u_cp = nullptr, *r_cp = nullptr;
  for (const PlanFigure& f : u.time) u_cp = f.name == "CP comm" ? &f : u_cp;
  for (const PlanFigure& f : r.time) r_cp = f.name == "CP comm" ? &f : r_cp;
  ASSERT_TRUE(u_cp && r_cp);
  EXPECT_GT(u_cp->value, 0.0);
  EXPECT_NE(u_cp->value, r_cp->value);
  EXPECT_NE(u_cp->why.find("Ulysses"), std::string::npos) << u_cp->why;
  // The all-to-alls at the node's link, and the packing and reordering copies (4 x each whole
  // exchange, CP/(CP-1) x the bytes sent) at the memory bandwidth.
  const double sent = plan_ulysses_bytes(cfg, a2a, 0, 4);
  const double expected = sent / (h100.intra_gbps * h100.link_efficiency * 1e9) +
                          4 * sent * 2 / (h100.hbm_gbps * h100.hbm_efficiency * 1e9);
  EXPECT_NEAR(u_cp->value, expected, 1e-9 * expected);
  EXPECT_NE(u.layout.describe().find("CP 2 (Ulysses)"), std::string::npos);
  // The same FLOPs per rank: only the CP row (and memory) differ.
  EXPECT_DOUBLE_EQ(u.time[0].value, r.time[0].value);
  EXPECT_NE(u.memory_bytes(), r.memory_bytes());
}

// --search tries Ulysses beside the ring under CP > 1 where TP x CP splits the 4 query groups,
// and only the given kind when --cp-comm-type was given (keep_cp_comm).
TEST(PlanUlysses, SearchTriesUlyssesWhereTheHeadsSplit) {
  PlanLayout base;
  base.gpus = 8, base.global_batch = 64;
  const PlanDevice h100 = plan_device("h100", 8);
  const PlanSearch s = search_plans(model(), base, h100, 100000);
  EXPECT_TRUE(s.searched_cp_comm);
  int ulysses = 0, ring = 0;
  for (const Plan& p : s.fitting) {
    if (p.layout.ulysses()) {
      ++ulysses;
      EXPECT_EQ(4 % (p.layout.tp * p.layout.cp), 0) << p.layout.describe();
    }
    ring += p.layout.cp > 1 && !p.layout.ulysses();
  }
  EXPECT_GT(ulysses, 0);
  EXPECT_GT(ring, 0);
  const PlanSearch kept = search_plans(model(), base, h100, 100000, false, false, true);
  EXPECT_FALSE(kept.searched_cp_comm);
  EXPECT_LT(kept.tried, s.tried);
  for (const Plan& p : kept.fitting) EXPECT_FALSE(p.layout.ulysses()) << p.layout.describe();
}

}  // namespace
}  // namespace omni
