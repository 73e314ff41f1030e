// Mixture-of-experts models on a GPU (GPTModel<float> with a GPU Exec: MoELayer through the
// MoE ops' seam, backend/gpu/moe_*.cu) against the same models on the CPU: a tiny
// Mixtral-shaped model (softmax top-2, aux and z losses) and a tiny DeepSeek-shaped one
// (sigmoid scores with the aux-loss-free expert bias, group-limited routing, top-k scaling, a
// gated shared expert, seq_aux_loss, a dense first layer). One micro-batch's loss and
// gradients, then a few AdamW steps with the expert-bias update after each: the losses, the
// reported token counts and the biases are the CPU's.
//
// Tolerances as test_gpu_model.cpp's float ones: the same arithmetic in another order (loss
// 1e-5 relative, gradients 2e-4 of each tensor's largest element, the loss curve 1e-4
// relative over 4 steps). The token counts are integers and the biases move by +-rate: equal.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "gpu/gpu_test.h"
#include "model/gpt_model.h"
#include "model/moe_layer.h"
#include "optim/optimizer.h"

namespace omni::gpu_test {
namespace {

TransformerConfig tiny_mixtral() {
  TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 32, c.num_attention_heads = 4, c.seq_length = 8;
  c.ffn_hidden_size = 48, c.vocab_size = 40, c.make_vocab_size_divisible_by = 8;
  c.normalization = Normalization::RMSNorm, c.position_embedding_type = PositionEmbedding::Rope;
  c.swiglu = true, c.add_bias_linear = false, c.untie_embeddings_and_output_weights = true;
  c.init_method_std = 0.1;
  c.num_moe_experts = 4, c.moe_ffn_hidden_size = 24, c.moe_router_topk = 2;
  c.moe_aux_loss_coeff = 0.1, c.moe_z_loss_coeff = 0.01;
  return c;
}

TransformerConfig tiny_deepseek() {
  TransformerConfig c = tiny_mixtral();
  c.num_layers = 3, c.moe_layer_freq = "([0]*1+[1]*2)";
  c.num_moe_experts = 6, c.moe_ffn_hidden_size = 16, c.moe_router_topk = 3;
  c.moe_router_score_function = MoEScoreFunction::Sigmoid;
  c.moe_router_num_groups = 3, c.moe_router_group_topk = 2;
  c.moe_router_topk_scaling_factor = 2.5;
  c.moe_router_enable_expert_bias = true, c.moe_router_bias_update_rate = 0.05;
  c.moe_router_load_balancing_type = MoELoadBalancing::SeqAuxLoss;
  c.moe_shared_expert_intermediate_size = 20, c.moe_shared_expert_gate = true;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, labels;
  MicroBatch mb(int seq) const { return MicroBatch{tokens.data(), labels.data(), nullptr, 2, seq}; }
};
Batch random_batch(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  for (int i = 0; i < n; ++i) {
    b.tokens.push_back(int32_t(rng() % vocab));
    b.labels.push_back(int32_t(rng() % vocab));
  }
  return b;
}

ops::Exec device() {
  return ops::Exec{&gpu::backend()};
}

std::vector<float> host_copy(const ops::Exec& e, const float* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  ops::download(e, out.data(), p, out.size());
  return out;
}

// A model of storage T on the device against the float CPU model: the loss within loss_rtol
// (relative), each gradient within grad_rtol of its tensor's largest element.
template <typename T>
void expect_gradients_match(const TransformerConfig& cfg, double loss_rtol = 1e-5,
                            double grad_rtol = 2e-4) {
  const Batch data = random_batch(2 * cfg.seq_length, cfg.vocab_size, 3);
  GPTModel<float> cpu(cfg, 2, 42);
  GPTModel<T> dev(cfg, 2, 42, {}, device());
  ASSERT_EQ(dev.params().size(), cpu.params().size());
  cpu.params().zero_grads();
  const double want = cpu.forward_backward(data.mb(cfg.seq_length), 1.0);
  const double got = dev.forward_backward(data.mb(cfg.seq_length), 1.0);
  EXPECT_NEAR(got, want, loss_rtol * want);
  const std::vector<float> g = host_copy(dev.exec(), dev.params().grads(), dev.params().size());
  double worst = 0;
  for (const ParamInfo& p : cpu.params().infos()) {
    double err = 0, scale = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      err = std::max(err, std::abs(double(g[p.offset + i]) - cpu.params().grads()[p.offset + i]));
      scale = std::max(scale, std::abs(double(cpu.params().grads()[p.offset + i])));
    }
    const double e = scale == 0 ? err : err / scale;
    EXPECT_LE(e, grad_rtol) << p.name;
    worst = std::max(worst, e);
  }
  std::printf("loss %.9f (cpu %.9f); worst gradient error %.2e\n", got, want, worst);
}

TEST(GpuModel, MoEMixtralAndDeepSeekGradientsMatchTheCpuModel) {
  OMNI_REQUIRE_GPU();
  expect_gradients_match<float>(tiny_mixtral());
  expect_gradients_match<float>(tiny_deepseek());
}

// 16-bit storage (the router in float32, the experts in 16 bits with float accumulation):
// as test_gpu_model.cpp's bf16 models, every weight and activation rounded (2^-9 relative
// in bf16, 2^-12 in fp16), so the loss moves by about 1e-3 and gradients by a few percent of
// their largest element (measured: 2.2e-2 Mixtral, 7.8e-2 DeepSeek, whose top-k scaling 2.5
// and sigmoid scores amplify the rounding, hence its 1.2e-1; fp16 2.8e-3). A router whose
// input gradient is lost misses by 0.3 to 0.6.
TEST(GpuModel, MoEBf16AndFp16GradientsAreCloseToTheFloat32CpuModel) {
  OMNI_REQUIRE_GPU();
  expect_gradients_match<bf16>(tiny_mixtral(), 1e-2, 8e-2);
  expect_gradients_match<bf16>(tiny_deepseek(), 1e-2, 1.2e-1);
  expect_gradients_match<f16>(tiny_deepseek(), 2e-3, 1e-2);
}

// Two backwards of one training forward give the same gradients: the aux and z losses'
// gradient is scaled in a copy, not in the forward's buffer.
TEST(GpuModel, MoELayerBackwardLeavesTheForwardsAuxGradientUnscaled) {
  OMNI_REQUIRE_GPU();
  TransformerConfig c;
  c.hidden_size = 8, c.num_moe_experts = 4, c.moe_router_topk = 2, c.moe_ffn_hidden_size = 4;
  c.moe_aux_loss_coeff = 0.1, c.moe_z_loss_coeff = 0.01;
  const ops::Exec e = device();
  MoELayer<float> layer(c, nullptr, nullptr, nullptr, e);
  const int N = 6, C = 8;
  const size_t P = size_t(moe_parameter_count(c));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> hp(P), hx(size_t(N) * C);
  for (float& v : hp) v = normal(rng);
  for (float& v : hx) v = normal(rng);
  Device<float> params(hp), grads(P), x(hx), y(hx.size()), dy(hx), dx(hx.size());
  const MoEParams<float> p = moe_param_views(params.get(), c), g = moe_param_views(grads.get(), c);
  layer.forward(y.get(), x.get(), N, N, p, true);
  std::vector<float> first;
  for (int pass = 0; pass < 2; ++pass) {
    ops::zero(e, grads.get(), P);
    layer.backward(dx.get(), dy.get(), p, g, 0.5);
    const std::vector<float> got = grads.host();
    if (pass == 0)
      first = got;
    else
      EXPECT_EQ(got, first);
  }
}

// Steps of AdamW and the expert-bias update (train/moe_step.cpp's order) on one model.
struct TrainRun {
  TrainRun(const TransformerConfig& cfg, const ops::Exec& e) : model(cfg, 2, 7, {}, e) {
    OptimizerConfig oc;
    oc.adam_beta2 = 0.95, oc.weight_decay = 0.1;
    opt = std::make_unique<Optimizer<float>>(oc, model.params(), e);
  }
  double step(const MicroBatch& mb) {
    ops::zero(model.exec(), model.params().grads(), size_t(model.params().size()));
    const double loss = model.forward_backward(mb, 1.0);
    opt->step(model.params(), 3e-3);
    model.update_expert_bias();
    return loss;
  }
  GPTModel<float> model;
  std::unique_ptr<Optimizer<float>> opt;
};

TEST(GpuModel, MoETrainingStepsGiveTheCpusLossesTokenCountsAndExpertBias) {
  OMNI_REQUIRE_GPU();
  for (const TransformerConfig& cfg : {tiny_mixtral(), tiny_deepseek()}) {
    SCOPED_TRACE(cfg.moe_router_enable_expert_bias ? "deepseek" : "mixtral");
    const Batch data = random_batch(2 * cfg.seq_length, cfg.vocab_size, 11);
    TrainRun cpu(cfg, {}), dev(cfg, device());
    for (int s = 1; s <= 4; ++s) {
      const double want = cpu.step(data.mb(cfg.seq_length));
      const double got = dev.step(data.mb(cfg.seq_length));
      EXPECT_NEAR(got, want, 1e-4 * want) << "step " << s;
      const auto rc = cpu.model.take_moe_report(), rd = dev.model.take_moe_report();
      EXPECT_EQ(rd.tokens_per_expert, rc.tokens_per_expert) << "step " << s;
      for (size_t l = 0; l < rc.load_balancing_loss.size(); ++l)
        EXPECT_NEAR(rd.load_balancing_loss[l], rc.load_balancing_loss[l],
                    1e-4 * std::abs(rc.load_balancing_loss[l]))
            << "step " << s;
    }
    for (const ParamInfo& p : cpu.model.params().infos()) {
      if (p.name.find("expert_bias") == std::string::npos) continue;
      const std::vector<float> got =
          host_copy(dev.model.exec(), dev.model.params().value(p.name), p.numel);
      const float* want = cpu.model.params().value(p.name);
      EXPECT_EQ(got, std::vector<float>(want, want + p.numel)) << p.name;
      EXPECT_NE(*std::max_element(want, want + p.numel), 0.0f) << "the bias moved";
    }
  }
}

}  // namespace
}  // namespace omni::gpu_test
