// The MoE ops' backwards and the whole MoE layer's, against central finite differences of
// their forwards in float64 (tests/model/gradient_check.h). For routing with probs = f(logits)
// the objective is sum(dprobs * probs) with random dprobs; for the layer it is
// sum(dy * y) + s (aux + z), the loss whose gradient Megatron's MoEAuxLossAutoScaler makes.
// The expert choice is piecewise constant; the random inputs keep every choice (and every
// capacity decision) away from ties, so the differences see one smooth piece.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/moe_ops.h"
#include "gradient_check.h"
#include "model/moe_layer.h"

namespace omni {
namespace {

using gradient_check::difference;
using gradient_check::dot;
using gradient_check::gradients_match;
using gradient_check::numerical_gradient;
using gradient_check::TestRng;
using gradient_check::Vec;

constexpr double kJunk = 7.0;

// ---------------------------------------------------------------------------------------------
// Top-k routing

void check_routing(ops::MoERoutingArgs a, bool with_expert_bias, uint64_t seed = 3) {
  a.tokens = 9;
  TestRng rng(seed);
  Vec logits = rng.normal(size_t(a.tokens) * a.experts);
  const Vec bias = rng.normal(a.experts, 0.5);
  const Vec dprobs = rng.normal(size_t(a.tokens) * a.topk);
  Vec probs(dprobs.size());
  std::vector<int32_t> indices(dprobs.size());
  auto objective = [&] {
    ops::moe_topk_routing_forward(probs.data(), indices.data(), logits.data(),
                                  with_expert_bias ? bias.data() : nullptr, a);
    return dot(dprobs, probs);
  };
  objective();
  const std::vector<int32_t> chosen = indices;
  Vec dlogits(logits.size(), kJunk);
  ops::moe_topk_routing_backward(dlogits.data(), dprobs.data(), logits.data(), chosen.data(), a);
  EXPECT_TRUE(gradients_match("dlogits", dlogits, numerical_gradient(logits, objective)));
  objective();
  EXPECT_EQ(indices, chosen) << "the expert choice moved during the differences";
}

ops::MoERoutingArgs routing(int experts, int topk, MoEScoreFunction f, bool pre_softmax = false) {
  ops::MoERoutingArgs a;
  a.experts = experts;
  a.topk = topk;
  a.score_function = f;
  a.pre_softmax = pre_softmax;
  return a;
}

TEST(MoERoutingBackward, SoftmaxAfterTopKMatchesFiniteDifferences) {
  check_routing(routing(6, 2, MoEScoreFunction::Softmax), false);
}
TEST(MoERoutingBackward, SoftmaxBeforeTopKMatchesFiniteDifferences) {
  check_routing(routing(6, 3, MoEScoreFunction::Softmax, true), false);
}
TEST(MoERoutingBackward, TopOneBeforeSoftmaxMatchesFiniteDifferences) {
  check_routing(routing(5, 1, MoEScoreFunction::Softmax, true), false);
}
TEST(MoERoutingBackward, SigmoidRenormalisedOverTopKMatchesFiniteDifferences) {
  check_routing(routing(6, 3, MoEScoreFunction::Sigmoid), false);
}
TEST(MoERoutingBackward, SigmoidTopOneMatchesFiniteDifferences) {
  check_routing(routing(6, 1, MoEScoreFunction::Sigmoid), false);
}
TEST(MoERoutingBackward, TopKScalingFactorMatchesFiniteDifferences) {
  ops::MoERoutingArgs a = routing(6, 2, MoEScoreFunction::Softmax);
  a.scaling_factor = 2.5;
  check_routing(a, false);
}
TEST(MoERoutingBackward, GroupLimitedSigmoidWithExpertBiasMatchesFiniteDifferences) {
  ops::MoERoutingArgs a = routing(8, 4, MoEScoreFunction::Sigmoid);
  a.num_groups = 4;
  a.group_topk = 2;
  a.scaling_factor = 2.5;
  check_routing(a, true);
}
TEST(MoERoutingBackward, GroupLimitedSoftmaxBeforeTopKMatchesFiniteDifferences) {
  ops::MoERoutingArgs a = routing(8, 2, MoEScoreFunction::Softmax, true);
  a.num_groups = 4;
  a.group_topk = 2;
  check_routing(a, false);
}

// ---------------------------------------------------------------------------------------------
// Load-balancing and z losses

void check_aux_loss(MoELoadBalancing type, MoEScoreFunction f) {
  ops::MoEAuxLossArgs a;
  a.tokens = 12;
  a.experts = 5;
  a.topk = 2;
  a.score_function = f;
  a.type = type;
  a.seq_length = 4;
  a.coeff = 0.3;
  const double scale = 0.7;
  TestRng rng(5);
  Vec logits = rng.normal(size_t(a.tokens) * a.experts);
  auto objective = [&] { return ops::moe_aux_loss<double>(nullptr, logits.data(), a, 1.0); };
  const Vec prior = rng.normal(logits.size());
  Vec dlogits = prior;
  ops::moe_aux_loss(dlogits.data(), logits.data(), a, scale);
  Vec numeric = numerical_gradient(logits, objective);
  for (double& g : numeric) g *= scale;
  EXPECT_TRUE(gradients_match("dlogits", difference(dlogits, prior), numeric));
}

TEST(MoEAuxLossBackward, SoftmaxAuxLossMatchesFiniteDifferences) {
  check_aux_loss(MoELoadBalancing::AuxLoss, MoEScoreFunction::Softmax);
}
TEST(MoEAuxLossBackward, SigmoidAuxLossMatchesFiniteDifferences) {
  check_aux_loss(MoELoadBalancing::AuxLoss, MoEScoreFunction::Sigmoid);
}
TEST(MoEAuxLossBackward, SoftmaxSequenceAuxLossMatchesFiniteDifferences) {
  check_aux_loss(MoELoadBalancing::SeqAuxLoss, MoEScoreFunction::Softmax);
}
TEST(MoEAuxLossBackward, SigmoidSequenceAuxLossMatchesFiniteDifferences) {
  check_aux_loss(MoELoadBalancing::SeqAuxLoss, MoEScoreFunction::Sigmoid);
}

TEST(MoEZLossBackward, MatchesFiniteDifferences) {
  const int T = 7, E = 5;
  TestRng rng(9);
  Vec logits = rng.normal(size_t(T) * E, 2.0);
  auto objective = [&] { return ops::moe_z_loss<double>(nullptr, logits.data(), T, E, 0.01, 1); };
  const Vec prior = rng.normal(logits.size());
  Vec dlogits = prior;
  ops::moe_z_loss(dlogits.data(), logits.data(), T, E, 0.01, 1.0);
  EXPECT_TRUE(gradients_match("dlogits", difference(dlogits, prior),
                              numerical_gradient(logits, objective)));
}

// ---------------------------------------------------------------------------------------------
// The whole layer

TransformerConfig layer_config() {
  TransformerConfig c;
  c.hidden_size = 6;
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 5;
  c.seq_length = 5;
  return c;
}

void check_layer(const TransformerConfig& c, uint64_t seed = 21) {
  const int batch = 2, N = batch * c.seq_length, C = c.hidden_size;
  const double aux_scale = 0.6;
  TestRng rng(seed);
  MoELayer<double> layer(c);
  if (c.moe_router_enable_expert_bias) {
    const Vec bias = rng.normal(c.num_moe_experts, 0.3);
    std::copy(bias.begin(), bias.end(), layer.expert_bias().begin());
  }
  Vec params = rng.normal(size_t(moe_parameter_count(c)), 0.5);
  Vec x = rng.normal(size_t(N) * C);
  const Vec dy = rng.normal(x.size());
  const MoEParams<double> P = moe_param_views(params.data(), c);
  Vec y(x.size());
  auto objective = [&] {
    const MoEStats& s = layer.forward(y.data(), x.data(), N, c.seq_length, P, true);
    return dot(dy, y) + aux_scale * (s.aux_loss + s.z_loss);
  };
  objective();
  const Vec prior = rng.normal(params.size());
  Vec grads = prior, dx(x.size(), kJunk);
  layer.backward(dx.data(), dy.data(), P, moe_param_views(grads.data(), c), aux_scale);

  EXPECT_TRUE(gradients_match("dx", dx, numerical_gradient(x, objective)));
  const Vec dparams = difference(grads, prior);
  for (const MoEParamInfo& p : moe_parameter_layout(c)) {
    const Vec analytic(dparams.begin() + p.offset, dparams.begin() + p.offset + p.numel());
    EXPECT_TRUE(gradients_match(
        p.name, analytic, numerical_gradient(params.data() + p.offset, p.numel(), objective)));
  }
}

TEST(MoELayerBackward, MixtralShapeWithAuxAndZLossesMatchesFiniteDifferences) {
  TransformerConfig c = layer_config();
  c.swiglu = true;
  c.add_bias_linear = false;
  c.moe_aux_loss_coeff = 0.2;
  c.moe_z_loss_coeff = 0.05;
  check_layer(c);
}

TEST(MoELayerBackward, DeepSeekShapeWithGroupsBiasSeqAuxLossAndGatedSharedExpert) {
  TransformerConfig c = layer_config();
  c.num_moe_experts = 8;
  c.moe_router_topk = 4;
  c.moe_router_score_function = MoEScoreFunction::Sigmoid;
  c.moe_router_num_groups = 4;
  c.moe_router_group_topk = 2;
  c.moe_router_topk_scaling_factor = 2.5;
  c.moe_router_enable_expert_bias = true;
  c.moe_router_load_balancing_type = MoELoadBalancing::SeqAuxLoss;
  c.moe_aux_loss_coeff = 0.2;
  c.moe_z_loss_coeff = 0.05;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.moe_shared_expert_intermediate_size = 7;
  c.moe_shared_expert_gate = true;
  check_layer(c);
}

TEST(MoELayerBackward, GeluExpertsWithBiasesAndCapacityDropsMatchFiniteDifferences) {
  TransformerConfig c = layer_config();
  c.moe_router_pre_softmax = true;
  c.moe_expert_capacity_factor = 0.75;
  c.moe_aux_loss_coeff = 0.2;
  check_layer(c);
}

TEST(MoELayerBackward, TopOnePaddedToCapacityByPositionMatchesFiniteDifferences) {
  TransformerConfig c = layer_config();
  c.moe_router_topk = 1;
  c.moe_router_pre_softmax = true;
  c.openai_gelu = true;
  c.moe_expert_capacity_factor = 1.5;
  c.moe_token_drop_policy = MoETokenDropPolicy::Position;
  c.moe_pad_expert_input_to_capacity = true;
  c.moe_router_load_balancing_type = MoELoadBalancing::None;
  c.moe_z_loss_coeff = 0.05;
  check_layer(c);
}

TEST(MoELayerBackward, UngatedSharedExpertWithGeluMatchesFiniteDifferences) {
  TransformerConfig c = layer_config();
  c.add_bias_linear = false;
  c.moe_shared_expert_intermediate_size = 4;
  check_layer(c);
}

}  // namespace
}  // namespace omni
