// `omnitron plan`'s activation bytes for 16-bit storage on a GPU against what GPTModel<bf16>
// keeps there (tests/train/test_plan.cpp checks float on the CPU at many layouts): a tiny
// DeepSeek-shaped model, multi-latent attention and MoE layers with a gated shared expert, one
// micro-batch's training forward and backward on the device. 16-bit activations, float
// per-row statistics, the MoE router's float logits, probabilities and its copies of x and of
// its weights: the plan's figure within 1 % (the CPU test's tolerance; they agree exactly);
// the workspace exactly.
#include <cstdio>
#include <random>
#include <vector>

#include "gpu/gpu_test.h"
#include "model/gpt_model.h"
#include "parallel/layout_run.h"
#include "train/plan.h"

namespace omni::gpu_test {
namespace {

// layout_run.h's DeepSeek-shaped latent attention with three MoE layers after a dense one.
TransformerConfig tiny_deepseek_mla() {
  TransformerConfig c = layout_test::mla_layout_config({});
  c.num_moe_experts = 4, c.moe_ffn_hidden_size = 12, c.moe_layer_freq = "[0,1,1,1]";
  c.moe_router_score_function = MoEScoreFunction::Sigmoid, c.moe_router_enable_expert_bias = true;
  c.moe_shared_expert_intermediate_size = 8, c.moe_shared_expert_gate = true;
  return c;
}

TEST(GpuModel, MoEAndLatentAttentionBf16ActivationBytesAreThePlans) {
  OMNI_REQUIRE_GPU();
  const TransformerConfig cfg = tiny_deepseek_mla();
  const int batch = 2, n = batch * cfg.seq_length;
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(n), labels(n);
  for (int i = 0; i < n; ++i)
    tokens[i] = int32_t(rng() % cfg.vocab_size), labels[i] = int32_t(rng() % cfg.vocab_size);
  GPTModel<bf16> model(cfg, batch, 42, {}, ops::Exec{&gpu::backend()});
  model.forward_backward(MicroBatch{tokens.data(), labels.data(), nullptr, batch, cfg.seq_length},
                         1.0);
  PlanLayout l;
  l.micro_batch = batch, l.global_batch = batch, l.precision = "bf16";
  const int64_t planned = plan_activation_bytes(cfg, l, 0, 2);
  std::printf("activations %lld B (plan %lld)\n", (long long)model.activation_bytes(),
              (long long)planned);
  EXPECT_NEAR(double(planned), double(model.activation_bytes()),
              0.01 * double(model.activation_bytes()));
  // The workspace (the scratch, MLA's and the MoE layers' backward scratch, the final norm's
  // float statistics, the float rope table in device memory): exactly the plan's.
  const int64_t workspace = plan_workspace_bytes(cfg, l, 0, 2);
  std::printf("workspace %lld B (plan %lld)\n", (long long)model.workspace_bytes(),
              (long long)workspace);
  EXPECT_EQ(workspace, model.workspace_bytes());
}

}  // namespace
}  // namespace omni::gpu_test
