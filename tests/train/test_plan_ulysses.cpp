// `omnitron plan` under Ulysses context parallelism (--cp-comm-type a2a, parallel/ulysses.h):
// the plan refuses the heads that training refuses, in one line, prices the all-to-alls (and
// their copies) instead of the ring, and --search tries Ulysses beside the ring. (The kept
// activations and the all-to-alls' bytes against a counted training step:
// Plan.MemoryModelMatchesWhatTheTrainerAllocates's Ulysses cases.)
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "parallel/layout_run.h"
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
