// MoE routing and dispatch on hand-worked examples: capacity drops by Megatron's two
// policies, padding to capacity, group-limited choice, the expert bias (steering the choice,
// not the weights, and its update from token counts), dropless routing equal to a loop over
// tokens, and the configuration errors a user sees.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backend/moe_ops.h"
#include "base/error.h"
#include "gradient_check.h"
#include "model/moe_layer.h"

namespace omni {
namespace {

using gradient_check::TestRng;
using gradient_check::Vec;

// Rows of each expert as (token, slot) pairs, expert after expert.
std::vector<std::vector<std::pair<int, int>>> rows_by_expert(const ops::MoEDispatchPlan& p) {
  std::vector<std::vector<std::pair<int, int>>> out(p.experts);
  for (int e = 0; e < p.experts; ++e)
    for (int r = p.expert_offsets[e]; r < p.expert_offsets[e + 1]; ++r)
      out[e].emplace_back(p.row_token[r], p.row_slot[r]);
  return out;
}

using Rows = std::vector<std::pair<int, int>>;

// Six tokens, top-1 over two experts: expert 0 gets tokens 0-3 (probs .5 .9 .7 .6), expert 1
// tokens 4 and 5. Capacity factor 1: ceil(6 * 1 / 2 * 1) = 3 rows per expert.
const std::vector<int32_t> kIndices = {0, 0, 0, 0, 1, 1};
const std::vector<double> kProbs = {0.5, 0.9, 0.7, 0.6, 0.8, 0.4};

ops::MoECapacityArgs capacity(double factor, MoETokenDropPolicy policy, bool pad = false) {
  ops::MoECapacityArgs c;
  c.capacity_factor = factor;
  c.drop_policy = policy;
  c.pad_to_capacity = pad;
  return c;
}

TEST(MoEDispatch, DroplessKeepsEveryPairExpertByExpertInTokenOrder) {
  const std::vector<int32_t> indices = {2, 0, 0, 1, 2, 1};  // three tokens, top-2
  const std::vector<double> probs(6, 0.5);
  const ops::MoEDispatchPlan p = ops::moe_dispatch_plan(indices.data(), probs.data(), 3, 3, 2, {});
  EXPECT_EQ(rows_by_expert(p),
            (std::vector<Rows>{{{0, 1}, {1, 2}}, {{1, 3}, {2, 5}}, {{0, 0}, {2, 4}}}));
  EXPECT_EQ(p.dropped, 0);
  EXPECT_EQ(p.token_offsets, (std::vector<int32_t>{0, 2, 4, 6}));
}

TEST(MoEDispatch, ProbsPolicyDropsEachFullExpertsSmallestProbabilities) {
  const ops::MoEDispatchPlan p = ops::moe_dispatch_plan(kIndices.data(), kProbs.data(), 6, 2, 1,
                                                        capacity(1.0, MoETokenDropPolicy::Probs));
  EXPECT_EQ(p.capacity, 3);
  // Token 0 (0.5) is expert 0's smallest of four; expert 1 is under capacity.
  EXPECT_EQ(rows_by_expert(p), (std::vector<Rows>{{{1, 1}, {2, 2}, {3, 3}}, {{4, 4}, {5, 5}}}));
  EXPECT_EQ(p.dropped, 1);
}

TEST(MoEDispatch, PositionPolicyDropsEachFullExpertsLatestTokens) {
  const ops::MoEDispatchPlan p = ops::moe_dispatch_plan(
      kIndices.data(), kProbs.data(), 6, 2, 1, capacity(1.0, MoETokenDropPolicy::Position));
  EXPECT_EQ(rows_by_expert(p), (std::vector<Rows>{{{0, 0}, {1, 1}, {2, 2}}, {{4, 4}, {5, 5}}}));
  EXPECT_EQ(p.dropped, 1);
}

TEST(MoEDispatch, PaddingFillsEveryExpertToCapacityWithWeightlessRows) {
  const ops::MoEDispatchPlan p = ops::moe_dispatch_plan(
      kIndices.data(), kProbs.data(), 6, 2, 1, capacity(1.0, MoETokenDropPolicy::Probs, true));
  // Expert 1 is padded with the earliest token not routed to it (token 0, slot -1).
  EXPECT_EQ(rows_by_expert(p),
            (std::vector<Rows>{{{1, 1}, {2, 2}, {3, 3}}, {{0, -1}, {4, 4}, {5, 5}}}));
  std::vector<double> weights(p.rows());
  ops::moe_row_weights(weights.data(), kProbs.data(), p);
  EXPECT_EQ(weights, (std::vector<double>{0.9, 0.7, 0.6, 0.0, 0.8, 0.4}));
  // Gradients reach the kept pairs only: the dropped token 0 and the padding row get none.
  std::vector<double> dprobs(6, 7.0);
  ops::moe_row_weights_backward(dprobs.data(), std::vector<double>{1, 2, 3, 4, 5, 6}.data(), p);
  EXPECT_EQ(dprobs, (std::vector<double>{0, 1, 2, 3, 5, 6}));
}

TEST(MoEDispatch, CapacityAboveTheTokensDropsNothing) {
  // ceil(6 / 2 * 2.5) = 8 > 6 tokens: Megatron keeps every pair.
  const ops::MoEDispatchPlan p = ops::moe_dispatch_plan(kIndices.data(), kProbs.data(), 6, 2, 1,
                                                        capacity(2.5, MoETokenDropPolicy::Probs));
  EXPECT_EQ(p.dropped, 0);
  EXPECT_EQ(p.rows(), 6);
}

TEST(MoEDispatch, PaddingToACapacityAboveTheTokensIsRefusedNamingTheFlags) {
  try {
    ops::moe_dispatch_plan(kIndices.data(), kProbs.data(), 6, 2, 1,
                           capacity(2.5, MoETokenDropPolicy::Probs, true));
    FAIL() << "no error";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--moe-pad-expert-input-to-capacity"), std::string::npos) << m;
    EXPECT_NE(m.find("--moe-expert-capacity-factor 2.5"), std::string::npos) << m;
  }
}

TEST(MoEDispatch, UnpermuteOfPermuteSumsEachTokensWeightedRows) {
  const std::vector<int32_t> indices = {2, 0, 0, 1, 2, 1};
  const std::vector<double> probs = {0.25, 0.75, 0.5, 0.5, 0.125, 0.875};
  const ops::MoEDispatchPlan p = ops::moe_dispatch_plan(indices.data(), probs.data(), 3, 3, 2, {});
  const std::vector<double> x = {1, 2, 3, 4, 5, 6};  // three tokens of two channels
  std::vector<double> permuted(p.rows() * 2), w(p.rows()), y(6);
  ops::moe_permute(permuted.data(), x.data(), p, 2);
  ops::moe_row_weights(w.data(), probs.data(), p);
  ops::moe_unpermute(y.data(), permuted.data(), w.data(), p, 2);
  EXPECT_EQ(y, x);  // each token's probabilities sum to 1
}

TEST(MoERouting, GroupLimitedRoutingChoosesWithinTheBestGroups) {
  // Four experts in two groups; group scores are the sum of each group's top-2 logits:
  // {3, -1} -> 2, {2, 2} -> 4, so group 1 wins and expert 0, the largest logit, is not chosen.
  ops::MoERoutingArgs a;
  a.tokens = 1;
  a.experts = 4;
  a.topk = 2;
  a.num_groups = 2;
  a.group_topk = 1;
  const std::vector<double> logits = {3, -1, 2, 2};
  std::vector<double> probs(2);
  std::vector<int32_t> idx(2);
  ops::moe_topk_routing_forward<double>(probs.data(), idx.data(), logits.data(), nullptr, a);
  EXPECT_EQ(idx, (std::vector<int32_t>{2, 3}));
  EXPECT_DOUBLE_EQ(probs[0], 0.5);
  a.group_topk = 0;  // without the limit expert 0 is first
  ops::moe_topk_routing_forward<double>(probs.data(), idx.data(), logits.data(), nullptr, a);
  EXPECT_EQ(idx[0], 0);
}

TEST(MoERouting, ExpertBiasSteersTheChoiceButNotTheWeights) {
  ops::MoERoutingArgs a;
  a.tokens = 1;
  a.experts = 3;
  a.topk = 2;
  a.score_function = MoEScoreFunction::Sigmoid;
  const std::vector<double> logits = {1.0, 0.5, -1.0}, bias = {0.0, 0.0, 2.0};
  std::vector<double> probs(2);
  std::vector<int32_t> idx(2);
  ops::moe_topk_routing_forward(probs.data(), idx.data(), logits.data(), bias.data(), a);
  EXPECT_EQ(idx, (std::vector<int32_t>{2, 0}));  // sigmoid(-1) + 2 = 2.27 beats sigmoid(1)
  const double s2 = 1 / (1 + std::exp(1.0)), s0 = 1 / (1 + std::exp(-1.0));
  EXPECT_NEAR(probs[0], s2 / (s0 + s2 + 1e-20), 1e-15);
  EXPECT_NEAR(probs[1], s0 / (s0 + s2 + 1e-20), 1e-15);
}

TEST(MoERouting, ExpertBiasUpdateFollowsTheSignOfEachExpertsShortfall) {
  // Counts 3, 1, 2, 2 (mean 2): the busy expert's bias falls by the rate, the idle one's
  // rises, the balanced ones stay.
  std::vector<double> bias = {0.5, 0.0, 0.0, -0.25};
  const std::vector<double> counts = {3, 1, 2, 2};
  ops::moe_expert_bias_update(bias.data(), counts.data(), 4, 1e-3);
  EXPECT_EQ(bias, (std::vector<double>{0.5 - 1e-3, 1e-3, 0.0, -0.25}));
}

TEST(MoELayer, CountsRoutedTokensForTheExpertBiasAndUpdatesFromThem) {
  TransformerConfig c;
  c.hidden_size = 4;
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 3;
  c.moe_router_score_function = MoEScoreFunction::Sigmoid;
  c.moe_router_enable_expert_bias = true;
  c.moe_router_bias_update_rate = 0.01;
  MoELayer<double> layer(c);
  TestRng rng(4);
  Vec params = rng.normal(size_t(moe_parameter_count(c))), x = rng.normal(8 * 4), y(x.size());
  const MoEParams<double> P = moe_param_views(params.data(), c);
  std::vector<double> expected(4, 0.0);
  for (int step = 0; step < 2; ++step) {  // two micro-batches add up
    const MoEStats& s = layer.forward(y.data(), x.data(), 8, 8, P, true);
    for (int e = 0; e < 4; ++e) expected[e] += double(s.tokens_per_expert[e]);
  }
  layer.forward(y.data(), x.data(), 8, 8, P, /*train=*/false);  // evaluation does not count
  layer.forward(y.data(), x.data(), 8, 8, P, true, /*recomputing=*/true);  // nor recompute
  EXPECT_EQ(layer.local_tokens_per_expert(), expected);
  std::vector<double> bias(4, 0.0);
  ops::moe_expert_bias_update(bias.data(), expected.data(), 4, 0.01);
  layer.update_expert_bias();
  EXPECT_EQ(layer.expert_bias(), bias);
  EXPECT_EQ(layer.local_tokens_per_expert(), std::vector<double>(4, 0.0));
}

// Each token's output computed alone: sum over its k experts of p * fc2(swiglu(fc1 x)), plus
// the gated shared expert, with scalar loops.
TEST(MoELayer, DroplessRoutingComputesWhatALoopOverTokensComputes) {
  TransformerConfig c;
  c.hidden_size = 5;
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 3;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.moe_shared_expert_intermediate_size = 2;
  c.moe_shared_expert_gate = true;
  const int N = 11, C = 5, F = 3, Fs = 2, K = 2;
  MoELayer<double> layer(c);
  TestRng rng(8);
  Vec params = rng.normal(size_t(moe_parameter_count(c))), x = rng.normal(size_t(N) * C);
  const MoEParams<double> P = moe_param_views(params.data(), c);
  Vec y(x.size());
  layer.forward(y.data(), x.data(), N, N, P, false);

  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  // out += scale * fc2(swiglu(fc1 xt)) for fc1 [2f, C] and fc2 [C, f].
  auto mlp = [&](double* out, const double* xt, const double* fc1, const double* fc2, int f,
                 double scale) {
    std::vector<double> h(f);
    for (int j = 0; j < f; ++j) {
      double gate = 0, up = 0;
      for (int i = 0; i < C; ++i) {
        gate += fc1[j * C + i] * xt[i];
        up += fc1[(f + j) * C + i] * xt[i];
      }
      h[j] = silu(gate) * up;
    }
    for (int i = 0; i < C; ++i)
      for (int j = 0; j < f; ++j) out[i] += scale * fc2[i * f + j] * h[j];
  };
  for (int t = 0; t < N; ++t) {
    const double* xt = x.data() + t * C;
    std::vector<double> expect(C, 0.0), shared(C, 0.0);
    for (int k = 0; k < K; ++k) {
      const int e = layer.indices()[t * K + k];
      mlp(expect.data(), xt, P.fc1_weight + e * 2 * F * C, P.fc2_weight + e * C * F, F,
          layer.probs()[t * K + k]);
    }
    mlp(shared.data(), xt, P.shared_fc1_weight, P.shared_fc2_weight, Fs, 1.0);
    double z = 0;
    for (int i = 0; i < C; ++i) z += P.shared_gate_weight[i] * xt[i];
    for (int i = 0; i < C; ++i) {
      expect[i] += shared[i] / (1 + std::exp(-z));
      EXPECT_NEAR(y[t * C + i], expect[i], 1e-13) << "token " << t << " channel " << i;
    }
  }
}

// On the CPU, with two or more experts per thread each expert runs whole on one thread and
// gathers its own input rows and output gradients (moe_permute_rows,
// moe_unpermute_backward_rows); with fewer they run one after another, each op over all
// threads and over all rows. Both give the same bits (float, through BLAS; SwiGLU, whose rows
// vectorise alike however they are split over threads, where GELU's flat loop does not).
TEST(MoELayer, ExpertsOnTheirOwnThreadsGiveTheBitsOfExpertsOneAfterAnother) {
  TransformerConfig c;
  c.hidden_size = 32;
  c.num_moe_experts = 8;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 32;
  c.swiglu = true;
  const int N = 48, C = 32;
  TestRng rng(13);
  std::vector<float> params, x, dy;
  for (double v : rng.normal(size_t(moe_parameter_count(c)))) params.push_back(float(0.3 * v));
  for (double v : rng.normal(size_t(N) * C)) x.push_back(float(v));
  for (double v : rng.normal(size_t(N) * C)) dy.push_back(float(v));
  const MoEParams<float> P = moe_param_views(params.data(), c);
  auto run = [&](int threads, bool expect_whole) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    MoELayer<float> layer(c);
    std::vector<float> grads(params.size(), 0.0f), y(x.size()), dx(x.size());
    const MoEParams<float> G = moe_param_views(grads.data(), c);
    const MoEStats& s = layer.forward(y.data(), x.data(), N, N, P, true);
    std::vector<int32_t> offsets = {0};
    for (int64_t n : s.tokens_per_expert) offsets.push_back(offsets.back() + int32_t(n));
    EXPECT_EQ(ops::moe_experts_run_whole(offsets.data(), 8), expect_whole) << threads;
    layer.backward(dx.data(), dy.data(), P, G, 1.0);
    omp_set_num_threads(before);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), grads.begin(), grads.end());
    return y;
  };
  const std::vector<float> whole = run(2, true), one_after_another = run(8, false);
  ASSERT_EQ(whole.size(), one_after_another.size());
  for (size_t i = 0; i < whole.size(); ++i)
    ASSERT_EQ(whole[i], one_after_another[i]) << "element " << i;
}

// ---- Configuration errors ----------------------------------------------------------------

void expect_refused(const TransformerConfig& c, const std::string& fragment) {
  try {
    validate_moe_config(c);
    ADD_FAILURE() << "accepted; expected an error naming " << fragment;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TransformerConfig valid_moe() {
  TransformerConfig c;
  c.num_moe_experts = 8;
  c.moe_router_topk = 2;
  return c;
}

TEST(MoEConfig, DefaultsOfEightExpertsTopTwoAreValid) {
  EXPECT_NO_THROW(validate_moe_config(valid_moe()));
}
TEST(MoEConfig, TopKAboveTheExpertsIsRefused) {
  TransformerConfig c = valid_moe();
  c.moe_router_topk = 9;
  expect_refused(c, "--moe-router-topk (9) must be between 1 and --num-experts (8)");
}
TEST(MoEConfig, TopOneSoftmaxNeedsPreSoftmax) {
  TransformerConfig c = valid_moe();
  c.moe_router_topk = 1;
  expect_refused(c, "--moe-router-pre-softmax");
  c.moe_router_pre_softmax = true;
  EXPECT_NO_THROW(validate_moe_config(c));
}
// NaN passes no comparison: a NaN or negative capacity factor was read as dropless and an
// infinite loss weight failed at the first step's gradient norm; each is refused up front.
TEST(MoEConfig, RealValuedFlagsMustBeFiniteAndNotNegative) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& [flag, field] : std::vector<std::pair<std::string, double TransformerConfig::*>>{
           {"--moe-expert-capacity-factor", &TransformerConfig::moe_expert_capacity_factor},
           {"--moe-aux-loss-coeff", &TransformerConfig::moe_aux_loss_coeff},
           {"--moe-z-loss-coeff", &TransformerConfig::moe_z_loss_coeff},
           {"--moe-router-topk-scaling-factor", &TransformerConfig::moe_router_topk_scaling_factor},
           {"--moe-router-bias-update-rate", &TransformerConfig::moe_router_bias_update_rate}}) {
    for (const double v : {-1.0, nan, inf}) {
      TransformerConfig c = valid_moe();
      c.*field = v;
      expect_refused(c, flag + " must be a finite number, 0 or more");
    }
    TransformerConfig c = valid_moe();
    c.*field = 0.5;
    EXPECT_NO_THROW(validate_moe_config(c)) << flag;
  }
}
TEST(MoEConfig, SharedExpertGateWithoutSharedExpertIsRefused) {
  TransformerConfig c = valid_moe();
  c.moe_shared_expert_gate = true;
  expect_refused(c, "--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size");
  c.moe_shared_expert_intermediate_size = 16;
  c.add_bias_linear = false;
  EXPECT_NO_THROW(validate_moe_config(c));
}
TEST(MoEConfig, GroupTopKWithoutGroupsIsRefused) {
  TransformerConfig c = valid_moe();
  c.moe_router_group_topk = 2;
  expect_refused(c, "--moe-router-group-topk (2) needs --moe-router-num-groups");
  c.moe_router_num_groups = 3;
  expect_refused(c, "--moe-router-num-groups (3) must divide --num-experts (8)");
}
TEST(MoEConfig, ExpertBiasNeedsSigmoidScores) {
  TransformerConfig c = valid_moe();
  c.moe_router_enable_expert_bias = true;
  expect_refused(c, "--moe-router-score-function sigmoid");
}
TEST(MoEConfig, PaddingNeedsACapacityFactor) {
  TransformerConfig c = valid_moe();
  c.moe_pad_expert_input_to_capacity = true;
  expect_refused(c, "--moe-expert-capacity-factor");
}
TEST(MoEConfig, SharedExpertNeedsLinearLayersWithoutBiases) {
  TransformerConfig c = valid_moe();
  c.moe_shared_expert_intermediate_size = 64;
  expect_refused(c, "--disable-bias-linear");
}

}  // namespace
}  // namespace omni
