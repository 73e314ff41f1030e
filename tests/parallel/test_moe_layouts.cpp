// Pipeline layouts of a mixture-of-experts model against the one-rank model, in float64 on
// in-process ranks (parallel/layout_run.h): MoE layers on several stages, micro-batches in
// flight through 1F1B and the interleaved schedule (each keeps its own routing for its
// backward), with and without full recompute. The parameters must be the one-rank model's
// values, and the gradients (the aux and z losses' included) and the loss equal to rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "parallel/layout_run.h"

namespace omni {
namespace {

using namespace layout_test;

// Eight Llama layers, every other one an MoE layer from layer 1, with sigmoid routing, the
// expert bias, a shared expert and both balancing losses.
TransformerConfig tiny_moe() {
  TransformerConfig c = tiny(true);
  c.num_moe_experts = 4;
  c.moe_ffn_hidden_size = 12;
  c.moe_router_topk = 2;
  c.moe_layer_freq = "[0,1,0,1,0,1,1,1]";
  c.moe_router_score_function = MoEScoreFunction::Sigmoid;
  c.moe_router_enable_expert_bias = true;
  c.moe_aux_loss_coeff = 0.05;
  c.moe_z_loss_coeff = 0.01;
  c.moe_shared_expert_intermediate_size = 8;
  c.validate();
  return c;
}

void check_moe_layout(const Layout& layout) {
  const TransformerConfig cfg = tiny_moe();
  const Data data = make_data(cfg, false);
  GPTModel<double> ref(cfg, kBatch, kSeed);
  double ref_loss = 0;
  for (const MicroBatch& mb : data.batches)
    ref_loss += ref.forward_backward(mb, 1.0 / kMicroBatches);
  const std::vector<RankResult<double>> ranks =
      run_layout<double>(cfg, layout, data, [](int) { return ops::Exec{}; });
  double loss = NAN, worst_grad = 0;
  size_t seen = 0;
  for (const RankResult<double>& r : ranks) {
    if (r.last_stage) loss = r.loss;
    for (const ParamInfo& p : r.infos) {
      const ParamInfo& full = ref.params().info(p.name);
      ASSERT_EQ(p.numel, full.numel) << p.name;
      for (int64_t i = 0; i < p.numel; ++i) {
        ASSERT_EQ(r.values[p.offset + i], ref.params().values()[full.offset + i]) << p.name;
        const double g = ref.params().grads()[full.offset + i];
        worst_grad =
            std::max(worst_grad, std::abs(r.grads[p.offset + i] - g) / (std::abs(g) + 1e-3));
      }
      ++seen;
    }
  }
  EXPECT_EQ(seen, ref.params().infos().size());
  EXPECT_NEAR(loss, ref_loss, 1e-12 * std::abs(ref_loss));
  EXPECT_LT(worst_grad, 1e-9);
}

TEST(MoELayouts, Pipeline2) {
  check_moe_layout({.pp = 2});
}
TEST(MoELayouts, Pipeline4Interleaved) {
  check_moe_layout({.pp = 4, .layers_per_virtual_stage = 1});
}
TEST(MoELayouts, Pipeline2FullRecompute) {
  check_moe_layout({.pp = 2, .recompute = Recompute::Full});
}

TEST(MoELayouts, TensorAndContextParallelAreRefusedByName) {
  const TransformerConfig cfg = tiny_moe();
  const Data data = make_data(cfg, false);
  for (const Layout& l : {Layout{.tp = 2}, Layout{.cp = 2}}) {
    std::string error;
    try {
      run_layout<double>(cfg, l, data, [](int) { return ops::Exec{}; });
    } catch (const UsageError& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(l.tp > 1 ? "--tensor-model-parallel-size 2" : "--context-parallel-size 2"),
              std::string::npos)
        << error;
  }
}

}  // namespace
}  // namespace omni
