// Hugging Face DeepseekV3ForCausalLM interchange, against the directories that
// tests/fixtures/make_hf_deepseek_fixtures.py writes: deepseek_v3_tiny (query latent, YaRN,
// interleaved rope rows, group-limited routing with e_score_correction_bias, a first dense
// layer, a shared expert, untied, one multi-token prediction layer) and deepseek_v3_plain_tiny
// (no query latent, plain rope, rope_interleave false, tied, every layer routed), each with
// logits of a float64 PyTorch forward pass written from the published formulas.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_fixtures.h"
#include "checkpoint/hf_interchange.h"
#include "checkpoint/safetensors.h"
#include "cli/process.h"
#include "config/options.h"
#include "model/gpt_model.h"

namespace {

namespace fs = std::filesystem;
using namespace hf_test;

TEST(HfDeepseek, LogitsMatchTheReference) {
  EXPECT_LT(max_logit_error("deepseek_v3_tiny"), 1e-5);
  EXPECT_LT(max_logit_error("deepseek_v3_plain_tiny"), 1e-5);
}

TEST(HfDeepseek, ConfigMapsToMegatronFlags) {
  omni::Options o;
  omni::load_checkpoint_model_options(kHf + "deepseek_v3_tiny", o);
  const omni::TransformerConfig& c = o.model;
  EXPECT_TRUE(c.multi_latent_attention);
  EXPECT_TRUE(c.qk_layernorm);
  EXPECT_EQ(c.q_lora_rank, 16);
  EXPECT_EQ(c.kv_lora_rank, 12);
  EXPECT_EQ(c.qk_head_dim, 8);
  EXPECT_EQ(c.qk_pos_emb_head_dim, 4);
  EXPECT_EQ(c.v_head_dim, 6);
  EXPECT_TRUE(c.yarn);
  EXPECT_EQ(c.rotary_scaling_factor, 4.0);
  EXPECT_EQ(c.mscale_all_dim, 1.0);
  EXPECT_EQ(c.num_moe_experts, 8);
  EXPECT_EQ(c.moe_router_topk, 4);
  EXPECT_EQ(c.moe_ffn_size(), 8);
  EXPECT_EQ(c.ffn_size(), 40);
  EXPECT_EQ(c.moe_shared_expert_intermediate_size, 8);
  EXPECT_EQ(c.moe_layer_pattern(), (std::vector<int>{0, 1}));
  EXPECT_EQ(c.moe_router_num_groups, 4);
  EXPECT_EQ(c.moe_router_group_topk, 2);
  EXPECT_EQ(c.moe_router_topk_scaling_factor, 2.5);
  EXPECT_TRUE(c.moe_router_enable_expert_bias);
  EXPECT_TRUE(c.untie_embeddings_and_output_weights);
  omni::Options p;
  omni::load_checkpoint_model_options(kHf + "deepseek_v3_plain_tiny", p);
  EXPECT_EQ(p.model.q_lora_rank, 0);
  EXPECT_FALSE(p.model.yarn);
  EXPECT_EQ(p.model.moe_router_num_groups, 0);
  EXPECT_FALSE(p.model.untie_embeddings_and_output_weights);
}

// Export then import: the same parameters bit for bit; the exported file holds the imported
// one's tensors byte for byte (the rope rows permuted back to the interleaved order), less the
// multi-token prediction layer, which is not imported.
TEST(HfDeepseek, ExportThenImportIsBitIdentical) {
  for (const std::string name : {"deepseek_v3_tiny", "deepseek_v3_plain_tiny"}) {
    omni::Options o;
    auto m = load_model(kHf + name, &o);
    const std::string dir = fresh_dir("export_" + name);
    omni::save_hf_model(dir, o.model, m->params());
    omni::Options back;
    EXPECT_EQ(values(*load_model(dir, &back)), values(*m)) << name;
    EXPECT_EQ(omni::hf_model_args(dir), omni::hf_model_args(kHf + name)) << name;
    if (name != "deepseek_v3_tiny") continue;  // rope_interleave false: exported as true
    const omni::SafetensorsFile original(kHf + name + "/model.safetensors");
    const omni::SafetensorsFile exported(dir + "/model.safetensors");
    size_t compared = 0;
    for (const omni::SafetensorsTensor& t : original.tensors()) {
      if (t.name.rfind("model.layers.2.", 0) == 0) continue;  // the MTP layer
      ++compared;
      const omni::SafetensorsTensor* e = exported.find(t.name);
      ASSERT_NE(e, nullptr) << t.name;
      EXPECT_EQ(e->shape, t.shape) << t.name;
      EXPECT_TRUE(e->bytes == t.bytes && std::memcmp(e->data, t.data, t.bytes) == 0) << t.name;
    }
    EXPECT_EQ(exported.tensors().size(), compared);
  }
}

// transformers 5 writes rope_parameters (with rope_type and rope_theta) for rope_scaling.
TEST(HfDeepseek, RopeParametersReadAsRopeScaling) {
  const std::string dir =
      edited_copy("deepseek_v3_tiny", "\"rope_scaling\": {",
                  "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, "
                  "\"attention_factor\": 1.0, ");
  EXPECT_EQ(omni::hf_model_args(dir), omni::hf_model_args(kHf + "deepseek_v3_tiny"));
  expect_load_error(edited_copy("deepseek_v3_tiny", "\"rope_scaling\": {",
                                "\"rope_scaling\": {\"attention_factor\": 1.2, "),
                    "rope_scaling attention_factor is not supported unless 1");
}

TEST(HfDeepseek, UnsupportedConfigValuesAreRefusedNamingTheField) {
  const std::string ds = "deepseek_v3_tiny";
  expect_load_error(
      edited_copy(ds, "\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\""),
      "scoring_func 'softmax' is not supported");
  expect_load_error(edited_copy(ds, "\"topk_method\": \"noaux_tc\"", "\"topk_method\": \"greedy\""),
                    "topk_method 'greedy' is not supported");
  expect_load_error(edited_copy(ds, "\"norm_topk_prob\": true", "\"norm_topk_prob\": false"),
                    "norm_topk_prob = false is not supported");
  expect_load_error(edited_copy(ds, "\"topk_group\": 2", "\"topk_group\": 1"),
                    "topk_group (1) is not supported");
  expect_load_error(edited_copy(ds, "\"mscale\": 1.0", "\"mscale\": 0.707"),
                    "rope_scaling mscale (0.707) is not supported");
  expect_load_error(edited_copy(ds, "\"type\": \"yarn\"", "\"type\": \"linear\""),
                    "rope_scaling type 'linear' is not supported");
  expect_load_error(edited_copy(ds, "\"beta_fast\": 32", "\"beta_fast\": 16"),
                    "beta_fast and beta_slow are supported only as 4096, 32 and 1");
  expect_load_error(edited_copy(ds, "\"num_key_value_heads\": 4", "\"num_key_value_heads\": 2"),
                    "num_key_value_heads (2) is not supported");
  expect_load_error(edited_copy(ds, "\"attention_bias\": false", "\"attention_bias\": true"),
                    "attention_bias = true is not supported");
  expect_load_error(edited_copy(ds, "\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2"),
                    "moe_layer_freq is not supported");
  expect_load_error(edited_copy(ds, "\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 3"),
                    "first_k_dense_replace should be a layer count from 0 to 2");
}

// A DeepSeek model of ours that DeepseekV3ForCausalLM cannot hold is refused naming the flag.
TEST(HfDeepseek, ModelsWithoutAnEquivalentAreRefused) {
  omni::Options o;
  auto m = load_model(kHf + "deepseek_v3_tiny", &o);
  o.model.moe_router_enable_expert_bias = false;
  try {
    omni::save_hf_model(fresh_dir("refused"), o.model, m->params());
    ADD_FAILURE() << "no error";
  } catch (const omni::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no --moe-router-enable-expert-bias, which has no "
                                         "Hugging Face equivalent"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfDeepseek, TrainAndGenerateLoadTheDirectory) {
  const std::string run = fresh_dir("run");
  const std::string hf = kHf + "deepseek_v3_tiny";
  auto [c1, o1] = run_omnitron("train --load " + hf +
                               " --mock-data --seq-length 8 --micro-batch-size 2 "
                               "--train-iters 2 --eval-iters 0 --no-progress --save " +
                               run);
  ASSERT_EQ(c1, 0) << o1;
  EXPECT_NE(o1.find("loaded " + hf + " at iteration 0"), std::string::npos) << o1;
  EXPECT_NE(o1.find("multi-token prediction layer(s) (num_nextn_predict_layers) are not imported"),
            std::string::npos)
      << o1;
  const std::string plain = kHf + "deepseek_v3_plain_tiny";
  auto [c2, o2] = run_omnitron("generate --load " + plain + " --prompt ab --max-new-tokens 5");
  ASSERT_EQ(c2, 0) << o2;
  EXPECT_EQ(o2.rfind("ab", 0), 0u) << o2;
}

}  // namespace
