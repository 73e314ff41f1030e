// AMD Primus's own files, unchanged (Primus 2d42400: its 18 Megatron experiments and the 31
// model files they name, read from OMNITRON_PRIMUS_SPECS_DIR), through the path `omnitron
// train --config` takes: every experiment parses and passes validation with its mock data,
// or stops naming the features not built yet, and each dense model resolves
// to the model Primus builds, checked against the published configurations.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/config_test_helpers.h"
#include "config/megatron_flag_list.h"
#include "config/options.h"
#include "config/yaml_config.h"
#include "train/run_options.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

const fs::path kPrimus = OMNITRON_PRIMUS_SPECS_DIR;
const fs::path kLlama3Tokenizer = fs::path(OMNITRON_FIXTURE_DIR).parent_path().parent_path() /
                                  "data" / "tokenizers" / "llama3" / "tokenizer.json";

// A Hugging Face cache (HF_HUB_CACHE) holding Llama 3's tokenizer.json under the hub ids
// Primus's Llama 3 models name; the other models' tokenizers have no local copy.
class PrimusFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::is_directory(kPrimus / "examples" / "megatron" / "configs"))
      GTEST_SKIP() << "Primus's files are not at " << kPrimus
                   << " (a copy of Primus's examples/ and primus/configs/; configure with "
                      "-DOMNITRON_PRIMUS_SPECS_DIR=DIR)";
    ASSERT_TRUE(fs::exists(kLlama3Tokenizer))
        << kLlama3Tokenizer << " is missing: run scripts/setup.sh (it fetches tokenizer files)";
    // One per test: ctest runs tests as separate processes, two at a time.
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    cache_ = fs::path(::testing::TempDir()) / (std::string("primus_hf_cache_") + info->name());
    fs::remove_all(cache_);
    for (const char* id :
         {"Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Llama-3.3-70B-Instruct"}) {
      const fs::path snapshot =
          cache_ / (std::string("models--meta-llama--") + id) / "snapshots" / "0123abcd";
      fs::create_directories(snapshot);
      fs::create_symlink(kLlama3Tokenizer, snapshot / "tokenizer.json");
    }
    if (const char* old = std::getenv("HF_HUB_CACHE")) old_cache_ = old;
    setenv("HF_HUB_CACHE", cache_.c_str(), 1);
  }
  void TearDown() override {
    if (cache_.empty()) return;
    if (old_cache_.empty())
      unsetenv("HF_HUB_CACHE");
    else
      setenv("HF_HUB_CACHE", old_cache_.c_str(), 1);
  }
  fs::path cache_;
  std::string old_cache_;
};

fs::path experiment(const std::string& name) {
  return name == "exp_pretrain" ? kPrimus / "examples" / "megatron" / "exp_pretrain.yaml"
                                : kPrimus / "examples" / "megatron" / "configs" / (name + ".yaml");
}

// `all`, less (when `without_refused`) each flag with its values that alone is refused as not
// built yet.
std::vector<std::string> filtered(const std::vector<std::string>& all, bool without_refused) {
  std::vector<std::string> args;
  for (size_t i = 0; i < all.size();) {
    std::vector<std::string> group = {all[i++]};
    while (i < all.size() && all[i].rfind("--", 0) != 0) group.push_back(all[i++]);
    if (without_refused) {
      Options scratch;
      try {
        parse_options(group, scratch);
      } catch (const UsageError& e) {
        if (std::string(e.what()).find(": not built yet: ") != std::string::npos) continue;
      }
    }
    args.insert(args.end(), group.begin(), group.end());
  }
  return args;
}

// The experiment's command line, filtered, and `extra` after it (the command line's own).
std::vector<std::string> experiment_args(const std::string& name, bool without_refused,
                                         const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args =
      filtered(yaml_to_args(experiment(name).string(), {}), without_refused);
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Options for as many ranks as the experiment's layout needs (data parallel 1, or the
// expert-parallel size, whose ranks are data-parallel ranks).
RunOptions resolve(const std::vector<std::string>& args) {
  Options layout;
  parse_options(args, layout);
  return resolve_run_options(
      args, layout.tensor_model_parallel_size * layout.context_parallel_size *
                layout.pipeline_model_parallel_size * layout.expert_model_parallel_size);
}

// The error of the experiment as written, or "".
std::string error_as_written(const std::string& name) {
  try {
    resolve(experiment_args(name, false));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// The experiment less what is refused: its error, or "".
std::string run_error(const std::string& name, const std::vector<std::string>& extra = {}) {
  try {
    resolve(experiment_args(name, true, extra));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

Options run(const std::string& name, const std::vector<std::string>& extra = {}) {
  return resolve(experiment_args(name, true, extra)).opts;
}

const std::vector<std::string> kLlama3 = {"llama3_8B-pretrain",     "llama3_70B-pretrain",
                                          "llama3.1_8B-pretrain",   "llama3.1_70B-pretrain",
                                          "llama3.1_405B-pretrain", "llama3.3_70B-pretrain"};
// Dense models whose tokenizer has no local copy here (Llama 2's, Qwen2.5's).
const std::vector<std::string> kNoTokenizer = {"llama2_7B-pretrain", "llama2_70B-pretrain",
                                               "qwen2.5_7B-pretrain", "qwen2.5_72B-pretrain",
                                               "exp_pretrain"};

TEST_F(PrimusFiles, EveryExperimentIsChecked) {
  int count = 1;  // exp_pretrain
  for (const auto& e : fs::directory_iterator(kPrimus / "examples" / "megatron" / "configs"))
    count += e.path().extension() == ".yaml";
  EXPECT_EQ(count, 18);
}

TEST_F(PrimusFiles, Llama3ExperimentsPassValidationWithTheirTokenizer) {
  for (const std::string& name : kLlama3) {
    SCOPED_TRACE(name);
    const Options o = run(name);
    EXPECT_TRUE(o.mock_data);
    EXPECT_EQ(o.model.vocab_size, 128256);  // Llama 3's tokenizer.json
    EXPECT_EQ(o.tokenizer.type, "Llama3Tokenizer");
  }
}

// The experiments less their refused flags pass validation: what follows.
TEST_F(PrimusFiles, ATokenizerWithNoLocalCopySaysWhereToPutIt) {
  for (const std::string& name : kNoTokenizer) {
    SCOPED_TRACE(name);
    const std::string error = run_error(name);
    EXPECT_NE(error.find("a Hugging Face model id with no local copy"), std::string::npos) << error;
    EXPECT_NE(error.find((cache_ / "models--").string()), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
  EXPECT_NE(run_error("qwen2.5_7B-pretrain").find("models--Qwen--Qwen2.5-7B/snapshots"),
            std::string::npos);
}

TEST_F(PrimusFiles, DenseExperimentsPassValidationGivenAVocabulary) {
  for (const std::string& name : kNoTokenizer) {
    SCOPED_TRACE(name);
    const std::string error =
        run_error(name, {"--tokenizer-type", "NullTokenizer", "--vocab-size", "32000"});
    EXPECT_EQ(error, "");
  }
}

// As written, each experiment stops only at features not built yet, each named: none now
// (expert parallelism and multi-token prediction are built). The cyclic data loader that Primus's
// pre_trainer.yaml sets for every experiment, and the torch FSDP2 of the 70B and 72B experiments
// (trained with the sharded optimizer state), are accepted with a note.
TEST_F(PrimusFiles, AsWrittenEachStopsOnlyAtFeaturesNotBuilt) {
  std::map<std::string, std::set<std::string>> expected = {
      {"mixtral_8x7B_v0.1-pretrain", {}}, {"mixtral_8x22B_v0.1-pretrain", {}},
      {"llama4_17B16E-pretrain", {}},     {"llama4_17B128E-pretrain", {}},
      {"deepseek_v2_lite-pretrain", {}},  // its experiment turns MLA off
      {"deepseek_v2-pretrain", {}},       {"deepseek_v3-pretrain", {}},
      {"llama2_70B-pretrain", {}},        {"llama3_70B-pretrain", {}},
      {"llama3.1_70B-pretrain", {}},      {"llama3.3_70B-pretrain", {}},
      {"qwen2.5_72B-pretrain", {}},
  };
  for (const std::string& name : kLlama3) expected.emplace(name, std::set<std::string>{});
  for (const std::string& name : kNoTokenizer) expected.emplace(name, std::set<std::string>{});
  ASSERT_EQ(expected.size(), 18u);
  for (auto& [name, features] : expected) {
    SCOPED_TRACE(name);
    const std::string error = error_as_written(name);
    EXPECT_EQ(error.find("unknown"), std::string::npos) << error;
    EXPECT_EQ(refused_features(error), features) << error;
  }
}

// What Primus builds from each dense model file (its experiment's overrides included),
// against the published configurations (Llama 2 paper table 1 and config.json files of
// meta-llama/Llama-2-*, Llama-3-*, Llama-3.1-*, Qwen/Qwen2.5-*).
struct Dense {
  std::string experiment;
  int layers, hidden, ffn, heads, groups;
  double rotary_base;
};

TEST_F(PrimusFiles, DenseModelsAreThePublishedArchitectures) {
  const std::vector<Dense> models = {
      {"llama2_7B-pretrain", 32, 4096, 11008, 32, 32, 1e4},
      {"llama2_70B-pretrain", 80, 8192, 28672, 64, 8, 1e4},
      {"llama3_8B-pretrain", 32, 4096, 14336, 32, 8, 5e5},
      {"llama3_70B-pretrain", 80, 8192, 28672, 64, 8, 5e5},
      {"llama3.1_8B-pretrain", 32, 4096, 14336, 32, 8, 5e5},
      {"llama3.1_70B-pretrain", 80, 8192, 28672, 64, 8, 5e5},
      {"llama3.1_405B-pretrain", 126, 16384, 53248, 128, 8, 5e5},
      {"llama3.3_70B-pretrain", 80, 8192, 28672, 64, 8, 5e5},
      {"qwen2.5_7B-pretrain", 28, 3584, 18944, 28, 4, 1e6},
      {"qwen2.5_72B-pretrain", 80, 8192, 29568, 64, 8, 1e6},
  };
  for (const Dense& d : models) {
    SCOPED_TRACE(d.experiment);
    const Options o =
        run(d.experiment, {"--tokenizer-type", "NullTokenizer", "--vocab-size", "32000"});
    const TransformerConfig& m = o.model;
    EXPECT_EQ(m.num_layers, d.layers);
    EXPECT_EQ(m.hidden_size, d.hidden);
    EXPECT_EQ(m.ffn_size(), d.ffn);
    EXPECT_EQ(m.num_attention_heads, d.heads);
    EXPECT_EQ(m.query_groups(), d.groups);
    EXPECT_EQ(m.rotary_base, d.rotary_base);
    EXPECT_EQ(m.normalization, Normalization::RMSNorm);
    EXPECT_EQ(m.position_embedding_type, PositionEmbedding::Rope);
    EXPECT_TRUE(m.swiglu);
    EXPECT_FALSE(m.add_bias_linear);
    EXPECT_FALSE(m.add_qkv_bias);  // Primus's qwen2.5 files leave Qwen's QKV bias out
    EXPECT_TRUE(m.untie_embeddings_and_output_weights);
    EXPECT_FALSE(m.qk_layernorm);
    EXPECT_EQ(m.norm_epsilon, 1e-6);  // every experiment overrides it
  }
}

TEST_F(PrimusFiles, Llama31_8bIsMetasModelWithItsTokenizer) {
  const Options o = run("llama3.1_8B-pretrain");
  const TransformerConfig& m = o.model;
  EXPECT_EQ(m.hidden_size, 4096);
  EXPECT_EQ(m.ffn_size(), 14336);
  EXPECT_EQ(m.num_layers, 32);
  EXPECT_EQ(m.num_attention_heads, 32);
  EXPECT_EQ(m.query_groups(), 8);
  EXPECT_EQ(m.vocab_size, 128256);
  EXPECT_EQ(m.padded_vocab_size(), 128256);
  EXPECT_EQ(m.seq_length, 8192);  // the experiment's, over the model's 131072 positions
  EXPECT_EQ(m.max_positions(), 8192);
  EXPECT_NEAR(double(m.num_parameters()), 8.030e9, 0.005e9);  // Meta's 8.03B
  // The experiment's training recipe and run folder.
  EXPECT_EQ(o.micro_batch_size, 2);
  EXPECT_EQ(o.global_batch_size, 128);
  EXPECT_EQ(o.train_iters, 50);
  EXPECT_EQ(o.lr_decay_style, "cosine");
  EXPECT_TRUE(o.bf16);
  EXPECT_TRUE(o.use_distributed_optimizer);
  EXPECT_TRUE(o.disable_last_saving);
  EXPECT_EQ(o.save, "output/amd/root/llama3.1_8B-pretrain/checkpoints");
  EXPECT_EQ(o.tensorboard_dir, "");  // Primus's disable_tensorboard: true
}

TEST_F(PrimusFiles, NotesNameWhatHasNoEffectHere) {
  const Options o = run("llama3.1_8B-pretrain");
  std::string notes;
  for (const std::string& n : o.notes) notes += n + "\n";
  for (const char* flag : {"--use-turbo-attention", "--enable-primus-turbo", "--stderr-sink-level",
                           "--no-masked-softmax-fusion", "--use-flash-attn"})
    EXPECT_NE(notes.find(flag), std::string::npos) << flag << " in\n" << notes;
  // Megatron's own defaults, spelled out in Primus's files, ask for nothing.
  EXPECT_EQ(notes.find("--max-tokens-to-oom"), std::string::npos) << notes;
}

}  // namespace
}  // namespace omni

namespace omni {
namespace {

// Each of Primus's 31 model files as the model of a pre_trainer experiment written here (the
// Primus tree found through PRIMUS_PATH): every one resolves, and with its refused flags left
// out and a vocabulary given, passes validation (but the base of all, which keeps Megatron's
// deprecated --no-position-embedding).
TEST_F(PrimusFiles, EveryModelFileResolvesAndValidates) {
  const fs::path dir = fs::path(::testing::TempDir()) / "primus_models";
  fs::create_directories(dir);
  int count = 0;
  for (const auto& entry :
       fs::directory_iterator(kPrimus / "primus" / "configs" / "models" / "megatron")) {
    const std::string model = entry.path().filename().string();
    SCOPED_TRACE(model);
    const fs::path exp = dir / model;
    std::ofstream(exp) << "work_group: g\nuser_name: u\nexp_name: e\nworkspace: ./w\nmodules:\n"
                          "  pre_trainer:\n    framework: megatron\n    config: pre_trainer.yaml\n"
                          "    model: "
                       << model << "\n    overrides:\n      mock_data: true\n";
    std::vector<std::string> all;
    ASSERT_NO_THROW(all = yaml_to_args(exp.string(), {{"PRIMUS_PATH", kPrimus.string()}}));
    std::vector<std::string> args = filtered(all, true);
    args.insert(args.end(), {"--tokenizer-type", "NullTokenizer", "--vocab-size", "32000"});
    std::string error;
    try {
      resolve(args);
    } catch (const UsageError& e) {
      error = e.what();
    }
    EXPECT_EQ(error, model == "language_model.yaml"
                         ? "--no-position-embedding is deprecated (as in Megatron), use "
                           "--position-embedding-type: none for a model without position "
                           "embedding"
                         : "");
    ++count;
  }
  EXPECT_EQ(count, 31);
}

// A Primus model file as the model of a pre_trainer experiment, its refused flags left out,
// with a vocabulary: the options it resolves to.
Options model_file(const std::string& model, int vocab_size) {
  const fs::path exp = fs::path(::testing::TempDir()) / ("primus_model_" + model);
  std::ofstream(exp) << "work_group: g\nuser_name: u\nexp_name: e\nworkspace: ./w\nmodules:\n"
                        "  pre_trainer:\n    framework: megatron\n    config: pre_trainer.yaml\n"
                        "    model: "
                     << model << "\n    overrides:\n      mock_data: true\n";
  std::vector<std::string> args =
      filtered(yaml_to_args(exp.string(), {{"PRIMUS_PATH", kPrimus.string()}}), true);
  args.insert(args.end(),
              {"--tokenizer-type", "NullTokenizer", "--vocab-size", std::to_string(vocab_size)});
  return resolve(args).opts;
}

// Primus's MoE model files build the published models: total and active parameters of
// Mixtral 8x7B (46.7B, 12.9B) and 8x22B (141B, 39B), and Llama 4 Scout's 17B active (its
// 109B total counts the vision encoder); DeepSeek-V2-Lite's first dense layer.
TEST_F(PrimusFiles, MoeModelFilesAreThePublishedModels) {
  const TransformerConfig m7 = model_file("mixtral_8x7B_v0.1.yaml", 32000).model;
  EXPECT_EQ(m7.num_moe_experts, 8);
  EXPECT_EQ(m7.moe_router_topk, 2);
  EXPECT_EQ(m7.moe_aux_loss_coeff, 0.01);
  EXPECT_NEAR(double(m7.num_parameters()), 46.7e9, 0.05e9);
  EXPECT_NEAR(double(m7.num_active_parameters()), 12.9e9, 0.05e9);
  const TransformerConfig m22 = model_file("mixtral_8x22B_v0.1.yaml", 32000).model;
  EXPECT_NEAR(double(m22.num_parameters()), 141e9, 0.5e9);
  EXPECT_NEAR(double(m22.num_active_parameters()), 39e9, 0.5e9);
  const TransformerConfig scout = model_file("llama4_17B16E.yaml", 202048).model;
  EXPECT_EQ(scout.num_moe_experts, 16);
  EXPECT_EQ(scout.moe_router_topk, 1);
  EXPECT_TRUE(scout.moe_router_pre_softmax);
  EXPECT_NEAR(double(scout.num_active_parameters()), 17e9, 0.5e9);
  const TransformerConfig lite = model_file("deepseek_v2_lite.yaml", 102400).model;
  std::vector<int> pattern(27, 1);
  pattern[0] = 0;
  EXPECT_EQ(lite.moe_layer_pattern(), pattern);
  EXPECT_EQ(lite.num_moe_experts, 64);
  EXPECT_EQ(lite.moe_shared_expert_intermediate_size, 2816);
  // Multi-latent attention, as configs/models/deepseek_*.yaml (test_yaml_config.cpp) count it.
  EXPECT_TRUE(lite.multi_latent_attention);
  EXPECT_EQ(lite.q_lora_rank, 0);
  EXPECT_EQ(lite.head_dim(), 192);
  EXPECT_NEAR(double(lite.num_parameters()), 15.7e9, 0.01 * 15.7e9);
  TransformerConfig v3 = model_file("deepseek_v3.yaml", 129280).model;
  EXPECT_TRUE(v3.multi_latent_attention);
  EXPECT_EQ(v3.q_lora_rank, 1536);
  EXPECT_EQ(v3.mscale_all_dim, 1.0);
  EXPECT_EQ(v3.mtp_num_layers, 1);  // num_nextn_predict_layers
  EXPECT_EQ(v3.mtp_loss_scaling_factor, 0.1);
  // 685B with the MTP module's published 14B (which holds its own embedding and head copies,
  // shared here: test_yaml_config.cpp), 671B without.
  EXPECT_NEAR(double(v3.num_parameters() + 2 * int64_t(129280) * 7168), 685e9, 0.005 * 685e9);
  v3.mtp_num_layers = 0;
  EXPECT_NEAR(double(v3.num_parameters()), 671e9, 0.01 * 671e9);
  EXPECT_NEAR(double(v3.num_active_parameters() - int64_t(129280) * 7168), 37e9, 0.015 * 37e9);
}

}  // namespace
}  // namespace omni
