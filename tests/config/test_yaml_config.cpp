// YAML configs as omnitron writes them: inheritance through `bases:` and `extends:`, deep
// merging, an experiment's `model:` and `overrides:`, ${VAR} substitution, and the model
// zoo in configs/models checked against the published architecture numbers.
#include "config/yaml_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/config_test_helpers.h"
#include "config/options.h"
#include "model/gpt_model.h"
#include "train/flops.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

const fs::path kConfigs = fs::path(OMNITRON_FIXTURE_DIR).parent_path().parent_path() / "configs";

// A fresh directory per test, for the test's YAML files.
class YamlConfig : public YamlFiles {};

Options parse(const Args& args) {
  Options o;
  parse_options(args, o);
  return o;
}

TEST_F(YamlConfig, KeysBecomeMegatronFlags) {
  const auto path = write("a.yaml", "num_layers: 24\nhidden_size: 1024\nlr_decay_style: cosine\n");
  EXPECT_EQ(yaml_to_args(path, {}),
            (Args{"--num-layers", "24", "--hidden-size", "1024", "--lr-decay-style", "cosine"}));
}

TEST_F(YamlConfig, SwitchTrueIsTheFlagAndFalseIsOmitted) {
  const auto path = write("a.yaml", "swiglu: true\nadd_qkv_bias: false\nmock_data: True\n");
  EXPECT_EQ(yaml_to_args(path, {}), (Args{"--swiglu", "--mock-data"}));
  const auto bad = write("b.yaml", "swiglu: 3\n");
  EXPECT_NE(usage_error([&] { yaml_to_args(bad, {}); }).find("swiglu is a switch"),
            std::string::npos);
}

TEST_F(YamlConfig, FirstBaseAndIncludingFileWin) {
  write("a.yaml", "num_layers: 2\nhidden_size: 64\nseq_length: 32\n");
  write("b.yaml", "hidden_size: 128\n");
  const auto path = write("c.yaml", "bases: [a.yaml, b.yaml]\nseq_length: 16\n");
  const Options o = parse(yaml_to_args(path, {}));
  EXPECT_EQ(o.model.num_layers, 2);
  EXPECT_EQ(o.model.hidden_size, 64);  // Primus: the first base listed wins
  EXPECT_EQ(o.model.seq_length, 16);
}

TEST_F(YamlConfig, ExtendsTakesOneFileOrAListRelativeToTheIncludingFile) {
  write("family/base.yaml", "num_layers: 3\n");
  write("family/more.yaml", "hidden_size: 96\n");
  const auto one = write("one.yaml", "extends: family/base.yaml\n");
  const auto many = write("many.yaml", "extends:\n  - family/base.yaml\n  - family/more.yaml\n");
  EXPECT_EQ(yaml_to_args(one, {}), (Args{"--num-layers", "3"}));
  EXPECT_EQ(yaml_to_args(many, {}), (Args{"--num-layers", "3", "--hidden-size", "96"}));
}

TEST_F(YamlConfig, MapsMergeDeeplyAndListsAreReplaced) {
  // Deep merging shows in `overrides:` maps inherited and extended; a list (a blended
  // --data-path) is replaced whole, never concatenated.
  write("base.yaml",
        "data_path: [0.5, corpus_a, 0.5, corpus_b]\n"
        "overrides:\n  num_layers: 4\n  hidden_size: 64\n");
  const auto path = write("child.yaml",
                          "extends: base.yaml\n"
                          "data_path: [1, corpus_c]\n"
                          "overrides:\n  hidden_size: 32\n");
  EXPECT_EQ(yaml_to_args(path, {}),
            (Args{"--data-path", "1", "corpus_c", "--num-layers", "4", "--hidden-size", "32"}));
  EXPECT_EQ(parse(yaml_to_args(path, {})).data_path, "1 corpus_c");
}

TEST_F(YamlConfig, CycleIsReportedWithItsChain) {
  write("a.yaml", "bases: [b.yaml]\n");
  write("b.yaml", "extends: a.yaml\n");
  const std::string msg = usage_error([&] { yaml_to_args((dir_ / "a.yaml").string(), {}); });
  EXPECT_NE(msg.find("a.yaml -> b.yaml -> a.yaml"), std::string::npos) << msg;
}

TEST_F(YamlConfig, ExperimentPrecedenceIsOverridesThenOwnKeysThenModelThenBases) {
  write("models/m.yaml",
        "num_layers: 2\nhidden_size: 64\nseq_length: 32\nnum_attention_heads: 4\n");
  write("recipe.yaml", "num_layers: 9\nhidden_size: 9\nseq_length: 9\nlr: 0.5\nseed: 7\n");
  const auto path = write("exp.yaml",
                          "bases: [recipe.yaml]\n"
                          "model: m\n"
                          "hidden_size: 128\nseed: 8\n"
                          "overrides:\n  seq_length: 16\n  seed: 9\n");
  const Options o = parse(yaml_to_args(path, {}));
  EXPECT_EQ(o.model.num_layers, 2);     // model beats bases
  EXPECT_EQ(o.model.hidden_size, 128);  // own keys beat the model
  EXPECT_EQ(o.model.seq_length, 16);    // overrides beat the model
  EXPECT_EQ(o.seed, 9);                 // overrides beat own keys
  EXPECT_DOUBLE_EQ(o.lr, 0.5);          // bases fill in the rest
  EXPECT_EQ(o.model.num_attention_heads, 4);
}

TEST_F(YamlConfig, ModelIsAPathOrAZooNameAndCliArgumentsComeLater) {
  write("zoo/tiny.yaml", "num_layers: 5\n");
  const auto by_path = write("a.yaml", "model: zoo/tiny.yaml\n");
  const auto by_name = write("b.yaml", "model: tiny\n");
  EXPECT_EQ(yaml_to_args(by_path, {}), (Args{"--num-layers", "5"}));
  EXPECT_EQ(yaml_to_args(by_name, {{"OMNITRON_MODEL_DIR", (dir_ / "zoo").string()}}),
            (Args{"--num-layers", "5"}));
  const auto missing = write("c.yaml", "model: nonesuch\n");
  EXPECT_NE(usage_error([&] { yaml_to_args(missing, {}); }).find("model 'nonesuch' not found"),
            std::string::npos);
  // The CLI parses after the config, so its value wins.
  Args args = yaml_to_args(by_path, {});
  args.insert(args.end(), {"--num-layers", "7"});
  EXPECT_EQ(parse(args).model.num_layers, 7);
}

TEST_F(YamlConfig, VariablesAndDefaultsAreSubstituted) {
  const auto path = write("a.yaml",
                          "save: ${RUN_DIR}/ckpt\nseq_length: ${SEQ:2048}\n"
                          "lr_decay_style: \"${STYLE:cosine}\"\n");
  EXPECT_EQ(yaml_to_args(path, {{"RUN_DIR", "/runs/x"}, {"SEQ", "4096"}}),
            (Args{"--save", "/runs/x/ckpt", "--seq-length", "4096", "--lr-decay-style", "cosine"}));
  EXPECT_EQ(yaml_to_args(path, {{"RUN_DIR", "r"}})[3], "2048");
}

TEST_F(YamlConfig, UnsetVariableWithoutDefaultIsNamed) {
  const auto path = write("a.yaml", "num_layers: 2\nsave: ${CHECKPOINTS}\n");
  const std::string msg = usage_error([&] { yaml_to_args(path, {}); });
  EXPECT_NE(msg.find("CHECKPOINTS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a.yaml:2"), std::string::npos) << msg;
}

TEST_F(YamlConfig, UnknownKeyNamesFileAndClosestOption) {
  write("base.yaml", "num_layer: 4\n");
  const auto path = write("a.yaml", "extends: base.yaml\nhidden_size: 64\n");
  const std::string msg = usage_error([&] { yaml_to_args(path, {}); });
  EXPECT_NE(msg.find("unknown key 'num_layer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("base.yaml:1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean num_layers?"), std::string::npos) << msg;
}

TEST_F(YamlConfig, MalformedYamlNamesFileAndLine) {
  const auto path = write("bad.yaml", "num_layers: 2\nhidden_size: [64\nseq_length: 3\n");
  const std::string msg = usage_error([&] { yaml_to_args(path, {}); });
  EXPECT_NE(msg.find("bad.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed YAML"), std::string::npos) << msg;
  const auto tabs = write("tabs.yaml", "num_layers: 2\n\tseq_length: 3\n");
  EXPECT_NE(usage_error([&] { yaml_to_args(tabs, {}); }).find("tabs.yaml:2"), std::string::npos);
}

TEST_F(YamlConfig, PrintConfigNamesTheFileOfEachKey) {
  write("base.yaml", "num_layers: 2\nhidden_size: 64\n");
  const auto path = write("a.yaml", "extends: base.yaml\nhidden_size: 128\n");
  const auto entries = resolve_yaml_config(path, {});
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].key, "num_layers");
  EXPECT_EQ(fs::path(entries[0].file).filename(), "base.yaml");
  EXPECT_EQ(entries[1].key, "hidden_size");
  EXPECT_EQ(fs::path(entries[1].file).filename(), "a.yaml");
  EXPECT_EQ(entries[1].line, 2);
  const std::string text = format_config_entries(entries);
  EXPECT_NE(text.find("hidden_size: 128  # " + (dir_ / "a.yaml").string() + ":2"),
            std::string::npos)
      << text;
}

TEST_F(YamlConfig, NullResetsAnInheritedKey) {
  write("base.yaml", "num_layers: 2\nsave: somewhere\n");
  const auto path = write("a.yaml", "extends: base.yaml\nsave: null\n");
  EXPECT_EQ(yaml_to_args(path, {}), (Args{"--num-layers", "2"}));
}

// ---------------------------------------------------------------------------------------------
// The model zoo

TransformerConfig zoo_model(const std::string& name, int vocab_size) {
  Options o = parse(yaml_to_args((kConfigs / "models" / (name + ".yaml")).string(), {}));
  o.model.vocab_size = vocab_size;
  o.model.validate();
  return o.model;
}

TEST(ModelZoo, EveryFileResolvesAndParses) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(kConfigs / "models")) {
    SCOPED_TRACE(entry.path().string());
    Options o;
    EXPECT_NO_THROW(parse_options(yaml_to_args(entry.path().string(), {}), o));
    const std::string name = entry.path().stem().string();
    if (name.find("_base") == std::string::npos) {
      o.model.vocab_size = 32000;
      EXPECT_NO_THROW(o.model.validate());
    }
    ++count;
  }
  EXPECT_GE(count, 20);
}

TEST(ModelZoo, ExamplesResolveAndParse) {
  const Env env = {{"DATA_PATH", "/data/x"},
                   {"TOKENIZER_MODEL", "/tok"},
                   {"VOCAB_FILE", "v"},
                   {"MERGE_FILE", "m"}};
  for (const auto& entry : fs::directory_iterator(kConfigs / "examples")) {
    SCOPED_TRACE(entry.path().string());
    Options o;
    EXPECT_NO_THROW(parse_options(yaml_to_args(entry.path().string(), env), o));
  }
}

TEST(ModelZoo, TinyModelsBuildAndRun) {
  for (const std::string name : {"tiny_gpt2", "tiny_llama", "tiny_mixtral", "tiny_deepseek"}) {
    SCOPED_TRACE(name);
    const TransformerConfig cfg = zoo_model(name, 256);
    GPTModel<float> model(cfg, 1, 1234);
    std::vector<int32_t> tokens(16), labels(16);
    for (int i = 0; i < 16; ++i) tokens[i] = (i * 37) % 256, labels[i] = (i * 37 + 1) % 256;
    MicroBatch mb;
    mb.tokens = tokens.data();
    mb.labels = labels.data();
    mb.batch = 1;
    mb.seq = 16;
    const double loss = model.forward_loss(mb);
    EXPECT_NEAR(loss, std::log(256.0), 1.0);  // near-uniform predictions at initialisation
  }
}

TEST(ModelZoo, Gpt2SizesMatchThePublishedModels) {
  // GPT-2 paper table 2 (and the released checkpoints' parameter counts).
  EXPECT_NEAR(double(zoo_model("gpt2_124m", 50257).num_parameters()), 124.44e6, 0.05e6);
  EXPECT_NEAR(double(zoo_model("gpt2_355m", 50257).num_parameters()), 354.8e6, 0.5e6);
  EXPECT_NEAR(double(zoo_model("gpt2_774m", 50257).num_parameters()), 774.0e6, 1e6);
  EXPECT_NEAR(double(zoo_model("gpt2_1.5b", 50257).num_parameters()), 1557.6e6, 2e6);
  const TransformerConfig small = zoo_model("gpt2_124m", 50257);
  EXPECT_EQ(small.padded_vocab_size(), 50304);
  EXPECT_FALSE(small.untie_embeddings_and_output_weights);
  EXPECT_EQ(small.normalization, Normalization::LayerNorm);
  EXPECT_EQ(small.position_embedding_type, PositionEmbedding::LearnedAbsolute);
  EXPECT_TRUE(small.add_bias_linear);
  // OpenAI's GPT-2 (Hugging Face's gelu_new) is the tanh GELU, not Megatron's default erf.
  for (const char* name : {"gpt2_124m", "gpt2_355m", "gpt2_774m", "gpt2_1.5b", "tiny_gpt2"})
    EXPECT_TRUE(zoo_model(name, 50257).openai_gelu) << name;
}

TEST(ModelZoo, LlamaSizesMatchThePublishedModels) {
  const TransformerConfig l3 = zoo_model("llama3_8b", 128256);
  EXPECT_EQ(l3.num_layers, 32);
  EXPECT_EQ(l3.hidden_size, 4096);
  EXPECT_EQ(l3.ffn_size(), 14336);
  EXPECT_EQ(l3.num_attention_heads, 32);
  EXPECT_EQ(l3.query_groups(), 8);
  EXPECT_EQ(l3.rotary_base, 500000.0);
  EXPECT_EQ(l3.normalization, Normalization::RMSNorm);
  EXPECT_TRUE(l3.swiglu);
  EXPECT_FALSE(l3.add_bias_linear);
  EXPECT_TRUE(l3.untie_embeddings_and_output_weights);
  EXPECT_NEAR(double(l3.num_parameters()), 8.030e9, 0.005e9);

  EXPECT_NEAR(double(zoo_model("llama2_7b", 32000).num_parameters()), 6.738e9, 0.005e9);
  EXPECT_NEAR(double(zoo_model("llama2_13b", 32000).num_parameters()), 13.016e9, 0.01e9);
  EXPECT_NEAR(double(zoo_model("llama2_70b", 32000).num_parameters()), 68.98e9, 0.05e9);
  EXPECT_NEAR(double(zoo_model("llama3_70b", 128256).num_parameters()), 70.55e9, 0.05e9);
  EXPECT_NEAR(double(zoo_model("mistral_7b", 32000).num_parameters()), 7.242e9, 0.005e9);

  const TransformerConfig l31 = zoo_model("llama3.1_8b", 128256);
  EXPECT_EQ(l31.max_positions(), 131072);
  EXPECT_EQ(l31.rotary_base, 500000.0);

  // Llama 3.2's small models tie the output layer to the embedding.
  const TransformerConfig l1 = zoo_model("llama3.2_1b", 128256);
  EXPECT_FALSE(l1.untie_embeddings_and_output_weights);
  EXPECT_EQ(l1.head_dim(), 64);
  EXPECT_NEAR(double(l1.num_parameters()), 1.236e9, 0.005e9);
  const TransformerConfig l3b = zoo_model("llama3.2_3b", 128256);
  EXPECT_FALSE(l3b.untie_embeddings_and_output_weights);
  EXPECT_NEAR(double(l3b.num_parameters()), 3.213e9, 0.005e9);
}

TEST(ModelZoo, QwenHasQkvBiasAndItsOwnNormAndRope) {
  const TransformerConfig q = zoo_model("qwen2.5_7b", 152064);
  EXPECT_TRUE(q.add_qkv_bias);
  EXPECT_FALSE(q.add_bias_linear);
  EXPECT_EQ(q.norm_epsilon, 1e-6);
  EXPECT_EQ(q.rotary_base, 1e6);
  EXPECT_EQ(q.query_groups(), 4);
  EXPECT_NEAR(double(q.num_parameters()), 7.616e9, 0.005e9);
  EXPECT_NEAR(double(zoo_model("qwen2.5_72b", 152064).num_parameters()), 72.71e9, 0.05e9);
}

// Mixture-of-experts models: total and active (per token) parameters against the published
// figures (Mixtral paper: 46.7B total, 12.9B active; Qwen3 technical report table 2 and the
// Qwen3-30B-A3B model card: 30.5B total, 3.3B activated).
TEST(ModelZoo, MoeSizesMatchThePublishedModels) {
  const TransformerConfig mixtral = zoo_model("mixtral_8x7b", 32000);
  EXPECT_EQ(mixtral.num_moe_experts, 8);
  EXPECT_EQ(mixtral.moe_router_topk, 2);
  EXPECT_EQ(mixtral.moe_ffn_size(), 14336);
  EXPECT_NEAR(double(mixtral.num_parameters()), 46.7e9, 0.05e9);
  EXPECT_NEAR(double(mixtral.num_active_parameters()), 12.9e9, 0.05e9);
  const TransformerConfig qwen3 = zoo_model("qwen3_30b_a3b", 151936);
  EXPECT_EQ(qwen3.num_moe_experts, 128);
  EXPECT_EQ(qwen3.moe_router_topk, 8);
  EXPECT_TRUE(qwen3.qk_layernorm);
  EXPECT_NEAR(double(qwen3.num_parameters()), 30.5e9, 0.05e9);
  // 3.35B, which Qwen writes 3.3B (the first decimal kept, not rounded).
  EXPECT_GE(double(qwen3.num_active_parameters()), 3.3e9);
  EXPECT_LT(double(qwen3.num_active_parameters()), 3.4e9);
  std::printf("Mixtral 8x7B: %.4gB total, %.4gB active; Qwen3-30B-A3B: %.4gB total, %.4gB active\n",
              double(mixtral.num_parameters()) / 1e9, double(mixtral.num_active_parameters()) / 1e9,
              double(qwen3.num_parameters()) / 1e9, double(qwen3.num_active_parameters()) / 1e9);
  // Mixtral 8x22B: 141B total, 39B active (Mistral's announcement); Qwen3-235B-A22B: 235B
  // and 22B (its model card). Llama 4: 17B active; totals of the text model alone (the
  // published 109B and 400B include the vision encoder, under 1B, and are rounded).
  const TransformerConfig m22 = zoo_model("mixtral_8x22b", 32768);
  EXPECT_NEAR(double(m22.num_parameters()), 141e9, 0.5e9);
  EXPECT_NEAR(double(m22.num_active_parameters()), 39e9, 0.5e9);
  const TransformerConfig q235 = zoo_model("qwen3_235b_a22b", 151936);
  EXPECT_NEAR(double(q235.num_parameters()), 235e9, 0.5e9);
  EXPECT_NEAR(double(q235.num_active_parameters()), 22e9, 0.5e9);
  const TransformerConfig scout = zoo_model("llama4_scout", 202048);
  const TransformerConfig maverick = zoo_model("llama4_maverick", 202048);
  EXPECT_NEAR(double(scout.num_active_parameters()), 17e9, 0.5e9);
  EXPECT_NEAR(double(maverick.num_active_parameters()), 17e9, 0.5e9);
  EXPECT_LT(double(scout.num_parameters()), 109e9);
  EXPECT_GT(double(scout.num_parameters()), 105e9);
  EXPECT_NEAR(double(maverick.num_parameters()), 400e9, 2e9);
  for (const auto& [name, c] : {std::pair{"Mixtral 8x22B", m22},
                                {"Qwen3-235B-A22B", q235},
                                {"Llama 4 Scout", scout},
                                {"Llama 4 Maverick", maverick}})
    std::printf("%s: %.4gB total, %.4gB active\n", name, double(c.num_parameters()) / 1e9,
                double(c.num_active_parameters()) / 1e9);
  // DeepSeek-V3 (671B total, 37B activated: its paper's abstract, the main model) and
  // DeepSeek-V2-Lite (15.7B, 2.4B: the DeepSeek-V2 paper, appendix B). Their active figures fit
  // the parameters a token meets less the input embedding (a lookup): 36.6B and 2.45B; with
  // it, 37.6B and 2.66B. DeepSeek-V3's MTP module (its one depth) is published as 14B of the
  // 685B: its layer, eh_proj and norms, and its own copies of the embedding and output head,
  // which this model (as Megatron) shares with the main model.
  const TransformerConfig with_mtp = zoo_model("deepseek_v3", 129280);
  EXPECT_EQ(with_mtp.mtp_num_layers, 1);
  EXPECT_TRUE(with_mtp.is_moe_layer(with_mtp.num_layers));  // as the last decoder layer
  const int64_t head_copies = 2 * int64_t(129280) * 7168;
  EXPECT_NEAR(double(with_mtp.num_parameters() + head_copies), 685e9, 0.005 * 685e9);
  TransformerConfig v3 = with_mtp;
  v3.mtp_num_layers = 0;
  // 13.46B counted against the published, rounded 14B.
  EXPECT_NEAR(double(with_mtp.num_parameters() - v3.num_parameters() + head_copies), 14e9,
              0.05 * 14e9);
  const TransformerConfig lite = zoo_model("deepseek_v2_lite", 102400);
  EXPECT_EQ(v3.head_dim(), 192);
  EXPECT_EQ(v3.value_head_dim(), 128);
  EXPECT_EQ(v3.moe_layer_pattern()[2], 0);
  EXPECT_EQ(v3.moe_layer_pattern()[3], 1);
  EXPECT_NEAR(double(v3.num_parameters()), 671e9, 0.01 * 671e9);
  EXPECT_NEAR(double(v3.num_active_parameters() - int64_t(129280) * 7168), 37e9, 0.015 * 37e9);
  EXPECT_NEAR(double(lite.num_parameters()), 15.7e9, 0.01 * 15.7e9);
  EXPECT_NEAR(double(lite.num_active_parameters() - int64_t(102400) * 2048), 2.4e9, 0.025 * 2.4e9);
  for (const auto& [name, c] : {std::pair{"DeepSeek-V3", v3},
                                {"DeepSeek-V3 with MTP", with_mtp},
                                {"DeepSeek-V2-Lite", lite}})
    std::printf("%s: %.4gB total, %.4gB active\n", name, double(c.num_parameters()) / 1e9,
                double(c.num_active_parameters()) / 1e9);
  // A dense model's active parameters are all of them.
  const TransformerConfig dense = zoo_model("mistral_7b", 32000);
  EXPECT_EQ(dense.num_active_parameters(), dense.num_parameters());
}

// The throughput's FLOPs are Megatron's (train/flops.h): the figures its training.py gives for
// one sequence of four zoo models, from tests/fixtures/make_flops_reference.py (causal
// attention halved; DeepSeek-V3's multi-latent attention, dense first layers, shared expert
// and MTP depth with its own logits).
TEST(ModelZoo, FlopsPerIterationAreMegatronsFormula) {
  const struct {
    const char* name;
    int vocab;
    double flops;
  } rows[] = {{"gpt2_124m", 50257, 817184636928.0},
              {"llama3_8b", 128256, 421645529382912.0},
              {"mixtral_8x7b", 32000, 326477644038144.0},
              {"deepseek_v3", 129280, 1064931126411264.0}};
  for (const auto& r : rows) {
    const TransformerConfig c = zoo_model(r.name, r.vocab);
    EXPECT_NEAR(megatron_flops_per_iteration(c, 1) / r.flops, 1.0, 1e-12) << r.name;
    EXPECT_NEAR(megatron_flops_per_iteration(c, 8) / r.flops, 8.0, 1e-11) << r.name;
  }
  // The 2021 formula counts attention whole: more than today's for a dense model.
  const TransformerConfig gpt2 = zoo_model("gpt2_124m", 50257);
  EXPECT_NEAR(narayanan_flops_per_iteration(gpt2, 1) / (854654976.0 * 1024), 1.0, 1e-12);
}

}  // namespace
}  // namespace omni
