// GPTModel with mixture-of-experts layers (model/gpt_moe.cpp): every parameter's gradient of a
// whole tiny MoE model against float64 central differences of its training objective, the
// language-model loss plus the MoE layers' aux and z losses as Megatron's
// MoEAuxLossAutoScaler weighs them; Megatron-Core's parameter names; --moe-layer-freq; the
// expert bias's update; recompute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"
#include "gradient_check.h"
#include "model/gpt_model.h"

namespace omni {
namespace {

using gradient_check::gradients_match;
using gradient_check::numerical_gradient;
using gradient_check::TestRng;
using gradient_check::Vec;

constexpr int kBatch = 2;
constexpr uint64_t kSeed = 4321;

// Two layers, four experts, top-2 softmax routing with both balancing losses on.
TransformerConfig tiny_moe() {
  TransformerConfig c = gradient_check::tiny_gpt2();
  c.num_moe_experts = 4;
  c.moe_ffn_hidden_size = 12;
  c.moe_router_topk = 2;
  c.moe_aux_loss_coeff = 0.1;
  c.moe_z_loss_coeff = 0.01;
  return c;
}

// DeepSeek-shaped: Llama layers, sigmoid scores with group-limited routing, top-k scaling,
// the expert bias, a gated shared expert and seq_aux_loss, the first layer dense.
TransformerConfig tiny_deepseek() {
  TransformerConfig c = tiny_moe();
  c.normalization = Normalization::RMSNorm;
  c.position_embedding_type = PositionEmbedding::Rope;
  c.swiglu = true;
  c.ffn_hidden_size = 24;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  c.num_layers = 3;
  c.moe_layer_freq = "([0]*1+[1]*2)";
  c.num_moe_experts = 6;
  c.moe_ffn_hidden_size = 8;
  c.moe_router_topk = 3;
  c.moe_router_score_function = MoEScoreFunction::Sigmoid;
  c.moe_router_num_groups = 3;
  c.moe_router_group_topk = 2;
  c.moe_router_topk_scaling_factor = 2.5;
  c.moe_router_enable_expert_bias = true;
  c.moe_router_load_balancing_type = MoELoadBalancing::SeqAuxLoss;
  c.moe_shared_expert_intermediate_size = 10;
  c.moe_shared_expert_gate = true;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, labels;
  MicroBatch micro_batch(int seq) const {
    return MicroBatch{tokens.data(), labels.data(), nullptr, kBatch, seq};
  }
};

Batch random_batch(const TransformerConfig& c, TestRng& rng) {
  const size_t n = size_t(kBatch) * c.seq_length;
  return {rng.ints(n, 0, c.vocab_size - 1), rng.ints(n, 0, c.vocab_size - 1)};
}

// The objective whose gradient a training step takes: grad_scale x (mean lm loss + every MoE
// layer's aux and z losses, coefficients included), from a training forward.
double training_objective(GPTModel<double>& model, const MicroBatch& mb, double grad_scale) {
  double loss = 0;
  model.chunk_forward(0, 0, mb, nullptr, true, grad_scale, &loss);
  const TransformerConfig& c = model.config();
  // Multi-token prediction's depths (model/mtp.cpp), their MoE layers' losses among the rest.
  for (double d : model.take_mtp_losses()) loss += c.mtp_loss_scaling_factor / c.mtp_num_layers * d;
  const auto r = model.take_moe_report();
  for (size_t l = 0; l < r.z_loss.size(); ++l)
    loss += c.moe_aux_loss_coeff * r.load_balancing_loss[l] + c.moe_z_loss_coeff * r.z_loss[l];
  model.expert_token_counts().assign(model.expert_token_counts().size(), 0.0);
  return grad_scale * loss;
}

// `only`: check the tensors whose names hold it (every tensor when empty).
void check_moe_model_gradients(const TransformerConfig& cfg, double grad_scale = 1.0,
                               const std::string& only = "") {
  GPTModel<double> model(cfg, kBatch, kSeed);
  ParameterSet<double>& params = model.params();
  TestRng rng(kSeed);
  // Move norm weights and biases off 1 and 0 (and the expert bias off 0, where it would
  // change no routing).
  for (const ParamInfo& p : params.infos()) {
    if (p.init != ParamInit::Ones && p.init != ParamInit::Zeros) continue;
    const Vec noise = rng.normal(p.numel, 0.2);
    for (int64_t i = 0; i < p.numel; ++i) params.value(p.name)[i] += noise[i];
  }
  const Batch batch = random_batch(cfg, rng);
  const MicroBatch mb = batch.micro_batch(cfg.seq_length);
  const Vec prior = rng.normal(params.size());
  std::copy(prior.begin(), prior.end(), params.grads());
  model.forward_backward(mb, grad_scale);
  (void)model.take_moe_report(), (void)model.take_mtp_losses();
  // The objective's training forwards add the head's gradients again: keep this backward's.
  const Vec grads(params.grads(), params.grads() + params.size());
  auto objective = [&] { return training_objective(model, mb, grad_scale); };

  double largest = 0;
  for (int64_t i = 0; i < params.size(); ++i)
    largest = std::max(largest, std::abs(grads[i] - prior[i]));
  for (const ParamInfo& p : params.infos()) {
    if (p.name.find(only) == std::string::npos) continue;
    const std::vector<size_t> picked = rng.sample_indices(p.numel, 8);
    Vec analytic;
    for (size_t i : picked) analytic.push_back(grads[p.offset + i] - prior[p.offset + i]);
    if (p.name.find("expert_bias") != std::string::npos) {
      // Routing is piecewise constant in the bias: no gradient, and none given.
      for (double d : analytic) EXPECT_EQ(d, 0.0) << p.name;
      continue;
    }
    EXPECT_TRUE(gradients_match(
        p.name, analytic, numerical_gradient(params.value(p.name), p.numel, objective, picked),
        gradient_check::kGradientTolerance, 1e-6 * largest));
  }
}

TEST(MoEModelGradient, MatchesFiniteDifferencesWithAuxAndZLosses) {
  check_moe_model_gradients(tiny_moe());
}

TEST(MoEModelGradient, MatchesFiniteDifferencesWithAGradScale) {
  check_moe_model_gradients(tiny_moe(), 0.25);  // the aux losses' share scales with it
}

TEST(MoEModelGradient, MatchesFiniteDifferencesForADeepSeekShapedModel) {
  check_moe_model_gradients(tiny_deepseek());
}

TEST(MoEModelGradient, MatchesFiniteDifferencesWithCapacityDrops) {
  TransformerConfig c = tiny_moe();
  c.moe_expert_capacity_factor = 0.75;
  c.moe_token_drop_policy = MoETokenDropPolicy::Position;
  c.moe_pad_expert_input_to_capacity = true;
  check_moe_model_gradients(c);
}

// Multi-token prediction after a DeepSeek-shaped model: its depths' layers are MoE layers
// (the last decoder layer's spec), with their routers' aux losses and expert biases.
TransformerConfig tiny_deepseek_mtp() {
  TransformerConfig c = tiny_deepseek();
  c.num_layers = 2;
  c.moe_layer_freq = "[0,1]";
  c.mtp_num_layers = 1;
  c.mtp_loss_scaling_factor = 0.3;
  c.moe_z_loss_coeff = 0.01;
  return c;
}

TEST(MoEModelGradient, MatchesFiniteDifferencesWithMultiTokenPrediction) {
  check_moe_model_gradients(tiny_deepseek_mtp(), 0.5);
}

// DeepSeek-V3's whole shape: multi-latent attention in the decoder and in the prediction
// depth's layer too (its tensors under mtp.layers.0.mtp_model_layer.self_attention; the
// depth's attention once looked them up under decoder.layers.2 and read null weights).
TEST(MoEModelGradient, MatchesFiniteDifferencesWithMultiTokenPredictionAndLatentAttention) {
  TransformerConfig c = tiny_deepseek_mtp();
  c.multi_latent_attention = true, c.q_lora_rank = 6, c.kv_lora_rank = 8;
  c.qk_head_dim = 4, c.qk_pos_emb_head_dim = 4, c.v_head_dim = 6;
  // (The decoder's latent attention is checked in test_gradients.cpp; here the depth's.)
  check_moe_model_gradients(c, 0.5, "mtp.layers.0.mtp_model_layer.self_attention.");
}

TEST(MoEModel, MultiTokenPredictionLayersAreMoELayersReportedAfterTheDecoders) {
  const TransformerConfig c = tiny_deepseek_mtp();
  GPTModel<double> model(c, kBatch, kSeed);
  for (const char* name : {"mtp.layers.0.mtp_model_layer.mlp.router.weight",
                           "mtp.layers.0.mtp_model_layer.mlp.experts.linear_fc1.weight",
                           "mtp.layers.0.mtp_model_layer.mlp.shared_experts.gate_weight",
                           "mtp.layers.0.mtp_model_layer.mlp.router.expert_bias"})
    EXPECT_TRUE(model.params().has(name)) << name;
  EXPECT_FALSE(model.params().has("mtp.layers.0.mtp_model_layer.mlp.linear_fc1.weight"));
  TestRng rng(13);
  const Batch batch = random_batch(c, rng);
  model.forward_backward(batch.micro_batch(c.seq_length), 1.0);
  const int E = c.num_moe_experts, L = c.num_layers + c.mtp_num_layers;
  const auto r = model.take_moe_report();
  ASSERT_EQ(r.z_loss.size(), size_t(L));
  ASSERT_EQ(r.tokens_per_expert.size(), size_t(L * E));
  const double routed = double(kBatch * c.seq_length * c.moe_router_topk);
  for (int l = 1; l < L; ++l) {  // layer 0 dense; 1 the decoder's MoE layer; 2 the depth's
    EXPECT_GT(r.z_loss[size_t(l)], 0.0) << l;
    EXPECT_EQ(std::accumulate(r.tokens_per_expert.begin() + l * E,
                              r.tokens_per_expert.begin() + (l + 1) * E, 0.0),
              routed)
        << l;
  }
  // Counted as TransformerConfig counts them (the expert bias and vocabulary padding aside).
  int64_t counted = -int64_t(c.padded_vocab_size() - c.vocab_size) * c.hidden_size * 2;
  for (const ParamInfo& i : model.params().infos())
    if (i.name.find("expert_bias") == std::string::npos) counted += i.numel;
  EXPECT_EQ(counted, c.num_parameters());
  const std::vector<double> counts = model.expert_token_counts();
  ASSERT_EQ(counts.size(), size_t(L * E));
  model.update_expert_bias();
  const double* bias = model.params().value("mtp.layers.0.mtp_model_layer.mlp.router.expert_bias");
  for (int e = 0; e < E; ++e) {
    const double d = counts[size_t(2 * E + e)], mean = routed / E;
    EXPECT_DOUBLE_EQ(bias[e], d < mean ? 1e-3 : d > mean ? -1e-3 : 0.0) << "expert " << e;
  }
}

TEST(MoEModel, ParametersHaveMegatronCoreNamesAndShapes) {
  const TransformerConfig c = tiny_deepseek();
  GPTModel<double> model(c, kBatch, kSeed);
  const ParameterSet<double>& p = model.params();
  // Layer 0 is dense, layers 1 and 2 are MoE layers.
  EXPECT_TRUE(p.has("decoder.layers.0.mlp.linear_fc1.weight"));
  EXPECT_FALSE(p.has("decoder.layers.0.mlp.router.weight"));
  EXPECT_FALSE(p.has("decoder.layers.1.mlp.linear_fc1.weight"));
  EXPECT_EQ(p.info("decoder.layers.1.mlp.router.weight").shape, (Shape{6, 16}));
  EXPECT_EQ(p.info("decoder.layers.1.mlp.experts.linear_fc1.weight").shape, (Shape{6, 16, 16}));
  EXPECT_EQ(p.info("decoder.layers.2.mlp.experts.linear_fc2.weight").shape, (Shape{6, 16, 8}));
  EXPECT_EQ(p.info("decoder.layers.2.mlp.shared_experts.linear_fc1.weight").shape, (Shape{20, 16}));
  EXPECT_EQ(p.info("decoder.layers.2.mlp.shared_experts.gate_weight").shape, (Shape{1, 16}));
  EXPECT_EQ(p.info("decoder.layers.2.mlp.router.expert_bias").shape, (Shape{6}));
  EXPECT_FALSE(p.info("decoder.layers.2.mlp.router.expert_bias").weight_decay);
  // Every parameter but the expert bias (a buffer Megatron saves with the weights) and the
  // padded vocabulary rows (of the embedding and the output layer) counts.
  int64_t counted = 0;
  for (const ParamInfo& i : p.infos())
    if (i.name.find("expert_bias") == std::string::npos) counted += i.numel;
  const int64_t padding = int64_t(c.padded_vocab_size() - c.vocab_size) * c.hidden_size * 2;
  EXPECT_EQ(counted - padding, c.num_parameters());
}

TEST(MoEModel, LayerFrequencyFollowsMegatron) {
  TransformerConfig c = tiny_moe();
  c.num_layers = 5;
  c.moe_layer_freq = "2";  // every second layer, from layer 0
  EXPECT_EQ(c.moe_layer_pattern(), (std::vector<int>{1, 0, 1, 0, 1}));
  c.moe_layer_freq = "[0,1,1,0,1]";
  EXPECT_EQ(c.moe_layer_pattern(), (std::vector<int>{0, 1, 1, 0, 1}));
  c.moe_layer_freq = "([0]*2+[1]*3)";
  EXPECT_EQ(c.moe_layer_pattern(), (std::vector<int>{0, 0, 1, 1, 1}));
  c.moe_layer_freq = "[0]*2+[1]*2";
  EXPECT_THROW(c.validate(), UsageError);  // four layers named, five built
  c.moe_layer_freq = "[0,2]";
  EXPECT_THROW(c.validate(), UsageError);
  c.num_moe_experts = 0;
  EXPECT_EQ(c.moe_layer_pattern(), (std::vector<int>(5, 0)));
}

TEST(MoEModel, ExpertBiasMovesTowardsTheLessUsedExperts) {
  TransformerConfig c = tiny_deepseek();
  c.moe_router_bias_update_rate = 0.01;
  GPTModel<double> model(c, kBatch, kSeed);
  TestRng rng(7);
  const Batch batch = random_batch(c, rng);
  model.forward_backward(batch.micro_batch(c.seq_length), 1.0);
  const int E = c.num_moe_experts;
  const std::vector<double> counts = model.expert_token_counts();
  // Layer 0 is dense: nothing counted; layer 1 routed every token to top-k experts.
  EXPECT_EQ(std::accumulate(counts.begin(), counts.begin() + E, 0.0), 0.0);
  EXPECT_EQ(std::accumulate(counts.begin() + E, counts.begin() + 2 * E, 0.0),
            double(kBatch * c.seq_length * c.moe_router_topk));
  model.update_expert_bias();
  const double mean = double(kBatch * c.seq_length * c.moe_router_topk) / E;
  const double* bias = model.params().value("decoder.layers.1.mlp.router.expert_bias");
  for (int e = 0; e < E; ++e) {
    const double d = counts[E + e];
    EXPECT_DOUBLE_EQ(bias[e], d < mean ? 0.01 : d > mean ? -0.01 : 0.0) << "expert " << e;
  }
  for (double n : model.expert_token_counts()) EXPECT_EQ(n, 0.0);  // restarted
}

TEST(MoEModel, FullRecomputeGivesTheSameGradientsAndCountsTokensOnce) {
  const TransformerConfig c = tiny_deepseek();
  GPTModel<double> plain(c, kBatch, kSeed), recomputed(c, kBatch, kSeed);
  recomputed.set_recompute({Recompute::Full, 0});
  TestRng rng(9);
  const Batch batch = random_batch(c, rng);
  const MicroBatch mb = batch.micro_batch(c.seq_length);
  EXPECT_EQ(plain.forward_backward(mb, 0.5), recomputed.forward_backward(mb, 0.5));
  for (int64_t i = 0; i < plain.params().size(); ++i)
    ASSERT_EQ(plain.params().grads()[i], recomputed.params().grads()[i]) << i;
  EXPECT_EQ(plain.expert_token_counts(), recomputed.expert_token_counts());
  const auto a = plain.take_moe_report(), b = recomputed.take_moe_report();
  EXPECT_EQ(a.load_balancing_loss, b.load_balancing_loss);
  EXPECT_EQ(a.tokens_per_expert, b.tokens_per_expert);
}

TEST(MoEModel, EvaluationReportsNothing) {
  const TransformerConfig c = tiny_moe();
  GPTModel<double> model(c, kBatch, kSeed);
  TestRng rng(11);
  const Batch batch = random_batch(c, rng);
  model.forward_loss(batch.micro_batch(c.seq_length));
  const auto r = model.take_moe_report();
  for (double v : r.tokens_per_expert) EXPECT_EQ(v, 0.0);
  for (double v : r.load_balancing_loss) EXPECT_EQ(v, 0.0);
}

}  // namespace
}  // namespace omni
