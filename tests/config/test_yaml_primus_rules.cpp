// Primus's loader rules (its primus/core/utils/yaml_utils.py and launcher/parser.py at
// 2d42400), each on a small YAML written here: bases and includes, nulls, ${VAR} in keys,
// ${X:}, 1/0 switches, empty lists, Megatron's argument names as keys, Primus's own keys and
// the experiment layout.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "cli/process.h"
#include "config/config_test_helpers.h"
#include "config/megatron_dests.h"
#include "config/megatron_flag_list.h"
#include "config/options.h"
#include "config/yaml_config.h"
#include "data/tokenizers/hf_hub.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

class PrimusRules : public YamlFiles {
 protected:
  Args args_of(const std::string& text, const Env& env = {}) {
    return yaml_to_args(write("a.yaml", text), env);
  }
};

TEST_F(PrimusRules, TheFirstBaseListedWinsAndTheFileBeatsItsBases) {
  write("a.yaml", "num_layers: 2\nhidden_size: 64\nseq_length: 32\n");
  write("b.yaml", "num_layers: 3\nhidden_size: 128\nlr: 0.5\n");
  const auto path = write("c.yaml", "bases: [a.yaml, b.yaml]\nseq_length: 16\n");
  Options o;
  parse_options(yaml_to_args(path, {}), o);
  EXPECT_EQ(o.model.num_layers, 2);
  EXPECT_EQ(o.model.hidden_size, 64);
  EXPECT_EQ(o.model.seq_length, 16);
  EXPECT_DOUBLE_EQ(o.lr, 0.5);  // only b has it
}

TEST_F(PrimusRules, IncludesFillInWhatTheFileLeavesTheFirstWinning) {
  write("sub/x.yaml", "num_layers: 5\nseed: 1\n");
  write("y.yaml", "num_layers: 6\nseed: 2\nlr: 0.25\n");
  EXPECT_EQ(args_of("includes:\n  - sub/x.yaml\n  - y.yaml\nseed: 3\n"),
            (Args{"--num-layers", "5", "--seed", "3", "--lr", "0.25"}));
}

TEST_F(PrimusRules, NullsAreDroppedBeforeUnknownKeysAreJudged) {
  EXPECT_EQ(args_of("yaml_cfg: null\nno_such_key: ~\nnum_layers: 2\nspec:\n"),
            (Args{"--num-layers", "2"}));
  EXPECT_NE(usage_error([&] { args_of("no_such_key: 3\n"); }).find("unknown key 'no_such_key'"),
            std::string::npos);
}

TEST_F(PrimusRules, VariablesAreSubstitutedInKeysToo) {
  EXPECT_EQ(args_of("${WHAT:num_layers}: 4\n${WIDTH}: 8\n", {{"WIDTH", "hidden_size"}}),
            (Args{"--num-layers", "4", "--hidden-size", "8"}));
}

TEST_F(PrimusRules, AnEmptyDefaultIsAnEmptyStringAndNullIsNull) {
  EXPECT_EQ(args_of("tensorboard_dir: ${TB:}\nsave: ${CKPT:null}\n"),
            (Args{"--tensorboard-dir", ""}));
  EXPECT_EQ(args_of("save: ${CKPT:null}\n", {{"CKPT", "/ckpt"}}), (Args{"--save", "/ckpt"}));
}

TEST_F(PrimusRules, OneAndZeroAreSwitches) {
  EXPECT_EQ(args_of("swiglu: 1\nmock_data: 0\nsequence_parallel: ${SP:1}\n"),
            (Args{"--swiglu", "--sequence-parallel"}));
}

TEST_F(PrimusRules, AnEmptyListAsksForNothing) {
  EXPECT_EQ(args_of("retriever_report_topk_accuracies: []\ndata_path: []\nseed: 3\n"),
            (Args{"--seed", "3"}));
}

TEST_F(PrimusRules, MegatronArgumentNamesAreTheirFlags) {
  EXPECT_EQ(args_of("add_bias_linear: false\nmasked_softmax_fusion: false\n"
                    "apply_rope_fusion: false\ngradient_accumulation_fusion: false\n"
                    "untie_embeddings_and_output_weights: true\nnum_query_groups: 8\n"),
            (Args{"--disable-bias-linear", "--no-masked-softmax-fusion", "--no-rope-fusion",
                  "--no-gradient-accumulation-fusion", "--untie-embeddings-and-output-weights",
                  "--num-query-groups", "8"}));
  // The other way round each asks for Megatron's default: nothing.
  EXPECT_EQ(args_of("add_bias_linear: true\nmasked_softmax_fusion: true\n"
                    "untie_embeddings_and_output_weights: false\n"),
            Args{});
  Options o;
  parse_options(args_of("add_bias_linear: false\n"), o);
  EXPECT_FALSE(o.model.add_bias_linear);
}

TEST_F(PrimusRules, ANullFfnSizeIsMegatronsDefault) {
  // Megatron: 4h, or with SwiGLU int((4 * h * 2 / 3) / 64) * 64.
  Options o;
  parse_options(args_of("hidden_size: 4096\nswiglu: true\nffn_hidden_size: null\n"), o);
  EXPECT_EQ(o.model.ffn_size(), 10880);
  o.model.hidden_size = 1024;
  EXPECT_EQ(o.model.ffn_size(), 2688);
  o.model.swiglu = false;
  EXPECT_EQ(o.model.ffn_size(), 4096);
}

TEST_F(PrimusRules, NamesOfTheMegatronPrimusPinsStillWork) {
  // Megatron renamed norm_epsilon's dest to layernorm_epsilon; Primus's files use the old one.
  EXPECT_EQ(args_of("norm_epsilon: 1.0e-6\nlayernorm_epsilon: 2.0e-6\n"),
            (Args{"--norm-epsilon", "1.0e-6", "--norm-epsilon", "2.0e-6"}));
  // A dropped flag at its default asks for nothing; set otherwise, it is refused by name.
  EXPECT_EQ(args_of("retro_encoder_layers: 2\nuse_legacy_models: false\n"), Args{});
  const std::string error = usage_error([&] { args_of("retro_encoder_layers: 3\n"); });
  EXPECT_NE(error.find("a.yaml:1: retro_encoder_layers: --retro-encoder-layers is a flag of the "
                       "Megatron that Primus pins"),
            std::string::npos)
      << error;
}

TEST_F(PrimusRules, MegatronsDefaultOfANotedOrRefusedFlagAsksForNothing) {
  // Primus's trainer_base.yaml spells out inference and vision defaults, which are refused
  // when set to anything else.
  EXPECT_EQ(args_of("max_tokens_to_oom: 12000\nnum_classes: 1000\n"), Args{});
  EXPECT_EQ(args_of("max_tokens_to_oom: 100\n"), (Args{"--max-tokens-to-oom", "100"}));
  // A built flag always takes its value, which may differ from omnitron's default.
  EXPECT_EQ(args_of("eval_iters: 100\nadam_beta2: 0.999\n"),
            (Args{"--eval-iters", "100", "--adam-beta2", "0.999"}));
}

TEST_F(PrimusRules, EveryCurrentRowNamesAFlagOfMegatron) {
  std::set<std::string> flags;
  for (const MegatronFlag& f : megatron_flags()) flags.insert(f.flag);
  int rows = 0;
  for (const MegatronDest& d : megatron_dest_rows()) {
    if (d.version != MegatronVersion::Current) continue;
    EXPECT_TRUE(flags.count(d.flag)) << d.dest << " -> " << d.flag;
    if (d.action == DestAction::Both) {
      EXPECT_TRUE(flags.count("--no-" + std::string(d.flag).substr(2))) << d.flag;
    }
    ++rows;
  }
  EXPECT_GT(rows, 350);
  // The plain rule's names too: every one is Megatron's --dest.
  for (const char* dest : {"num_layers", "calculate_per_token_loss", "swiglu", "data_path"}) {
    const MegatronDest* d = find_megatron_dest(dest);
    ASSERT_NE(d, nullptr) << dest;
    EXPECT_TRUE(flags.count(d->flag)) << d->flag;
  }
  EXPECT_EQ(find_megatron_dest("not_an_argument"), nullptr);
}

TEST_F(PrimusRules, PrimusKeysAreImplementedOrNoted) {
  Options o;
  parse_options(args_of("disable_last_saving: true\nauto_continue_train: 1\n"
                        "enable_primus_turbo: true\nuse_turbo_attention: true\n"
                        "disable_wandb: false\nstderr_sink_level: DEBUG\n"
                        "trainable: true\nfile_sink_level: DEBUG\n"),
                o);
  EXPECT_TRUE(o.disable_last_saving);
  EXPECT_TRUE(o.auto_continue_train);
  std::string notes;
  for (const std::string& n : o.notes) notes += n + "\n";
  for (const char* flag :
       {"--enable-primus-turbo", "--use-turbo-attention", "--disable-wandb", "--stderr-sink-level"})
    EXPECT_NE(notes.find(flag), std::string::npos) << flag << " in\n" << notes;
  // Primus's defaults (trainable, file_sink_level DEBUG) ask for nothing.
  EXPECT_EQ(notes.find("--trainable"), std::string::npos) << notes;
  EXPECT_EQ(notes.find("--file-sink-level"), std::string::npos) << notes;
  Options bad;
  EXPECT_NE(usage_error([&] {
              parse_options(args_of("stderr_sink_level: LOUD\n"), bad);
            }).find("'LOUD' is not one of DEBUG, INFO, WARNING, ERROR"),
            std::string::npos);
  EXPECT_NE(usage_error([&] {
              parse_options(args_of("enable_turbo_gemm_float8: true\n"), bad);
            }).find("not built yet: fp8 training"),
            std::string::npos);
}

TEST_F(PrimusRules, DisableTensorboardClearsTheDirectoryGivenBeforeIt) {
  Options o;
  parse_options({"--tensorboard-dir", "tb", "--disable-tensorboard"}, o);
  EXPECT_EQ(o.tensorboard_dir, "");
  parse_options({"--disable-tensorboard", "--tensorboard-dir", "tb"}, o);
  EXPECT_EQ(o.tensorboard_dir, "tb");
}

// ---------------------------------------------------------------------------------------------
// The experiment layout, on a small Primus tree written here.

class PrimusExperiment : public PrimusRules {
 protected:
  void SetUp() override {
    PrimusRules::SetUp();
    write("primus/configs/modules/megatron/trainer.yaml",
          "bases: [base.yaml]\ntrain_iters: 10\nseq_length: 64\n");
    write("primus/configs/modules/megatron/base.yaml",
          "train_iters: 1\nseq_length: 1\nlr: 0.5\ndisable_tensorboard: true\nprofile: false\n"
          "mock_data: false\ndata_path: null\nsave: null\n");
    write("primus/configs/models/megatron/tiny.yaml",
          "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\ngroup_query_attention: true\n"
          "num_query_groups: null\n");
  }
  std::string experiment(const std::string& module) {
    return write("examples/exp.yaml",
                 "work_group: ${TEAM:amd}\nuser_name: ${USER:me}\nexp_name: e1\n"
                 "workspace: ./out\nmodules:\n  pre_trainer:\n    framework: megatron\n" +
                     module);
  }
};

TEST_F(PrimusExperiment, ModuleConfigModelAndOverridesMerge) {
  const auto path = experiment(
      "    config: trainer.yaml\n    model: tiny.yaml\n"
      "    overrides:\n      seq_length: 32\n      mock_data: true\n      data_path: x\n");
  Options o;
  parse_options(yaml_to_args(path, {}), o);
  EXPECT_EQ(o.train_iters, 10);          // the module config over its base
  EXPECT_EQ(o.model.seq_length, 32);     // the overrides
  EXPECT_EQ(o.model.hidden_size, 64);    // the model
  EXPECT_EQ(o.model.query_groups(), 4);  // a null num_query_groups: one group per head
  EXPECT_TRUE(o.mock_data);
  EXPECT_EQ(o.data_path, "");  // mock data drops the data paths, as Primus's trainer
  EXPECT_EQ(o.save, "out/amd/me/e1/checkpoints");
  EXPECT_EQ(o.tensorboard_dir, "");
}

TEST_F(PrimusExperiment, TensorboardGoesToTheRunFolderUnlessDisabled) {
  const auto path = experiment(
      "    config: trainer.yaml\n    model: tiny.yaml\n"
      "    overrides:\n      disable_tensorboard: false\n");
  Options o;
  parse_options(yaml_to_args(path, {{"TEAM", "t"}}), o);
  EXPECT_EQ(o.tensorboard_dir, "out/t/me/e1/tensorboard");
}

TEST_F(PrimusExperiment, WhatPrimusRefusesIsRefusedNamingTheFile) {
  const std::string unknown_override = usage_error([&] {
    yaml_to_args(experiment("    config: trainer.yaml\n    model: tiny.yaml\n"
                            "    overrides:\n      num_layer: 3\n"),
                 {});
  });
  EXPECT_NE(unknown_override.find("exp.yaml:11: override 'num_layer' is neither a key of "
                                  "trainer.yaml nor of tiny.yaml"),
            std::string::npos)
      << unknown_override;
  write("primus/configs/models/megatron/clash.yaml", "num_layers: 2\nlr: 0.1\n");
  const std::string clash = usage_error(
      [&] { yaml_to_args(experiment("    config: trainer.yaml\n    model: clash.yaml\n"), {}); });
  EXPECT_NE(clash.find("'lr' of the model is also set by the module config"), std::string::npos)
      << clash;
  const std::string missing = usage_error(
      [&] { yaml_to_args(experiment("    config: nonesuch.yaml\n    model: tiny.yaml\n"), {}); });
  EXPECT_NE(missing.find("primus/configs/modules/megatron/nonesuch.yaml not found"),
            std::string::npos)
      << missing;
}

TEST_F(PrimusExperiment, ThePrimusTreeIsFoundFromPrimusPath) {
  const std::string elsewhere = (fs::path(::testing::TempDir()) / "primus_elsewhere.yaml").string();
  fs::copy_file(experiment("    config: trainer.yaml\n    model: tiny.yaml\n"), elsewhere,
                fs::copy_options::overwrite_existing);
  EXPECT_NE(usage_error([&] { yaml_to_args(elsewhere, {}); }).find("set PRIMUS_PATH"),
            std::string::npos);
  Options o;
  parse_options(yaml_to_args(elsewhere, {{"PRIMUS_PATH", dir_.string()}}), o);
  EXPECT_EQ(o.train_iters, 10);
}

TEST_F(PrimusExperiment, TheBinaryRunsAnExperimentFromThePrimusRootAsItsUsersDo) {
  experiment(
      "    config: trainer.yaml\n    model: tiny.yaml\n"
      "    overrides:\n      mock_data: true\n");
  const std::string root = "cd " + dir_.string() + " && ";
  for (const std::string& how : {root + "EXP=examples/exp.yaml " + OMNITRON_BINARY + " train",
                                 root + OMNITRON_BINARY + " train --config examples/exp.yaml"}) {
    SCOPED_TRACE(how);
    const ProcessResult r = run_command(how + " --vocab-size 64 --print-config");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("num_layers: 2  # " +
                            (dir_ / "primus/configs/models/megatron/tiny.yaml").string()),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("save: out/amd/"), std::string::npos) << r.output;
  }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer files by Hugging Face hub id, in the hub's cache layout.

TEST_F(PrimusRules, AHubIdIsFoundInTheLocalCache) {
  write("hub/models--meta-llama--Llama-3.1-8B/refs/main", "abc\n");
  write("hub/models--meta-llama--Llama-3.1-8B/snapshots/old/tokenizer.json", "{}");
  const std::string wanted =
      write("hub/models--meta-llama--Llama-3.1-8B/snapshots/abc/tokenizer.json", "{}");
  EXPECT_EQ(find_tokenizer_file("meta-llama/Llama-3.1-8B", {"tokenizer.json"},
                                {{"HF_HUB_CACHE", (dir_ / "hub").string()}}),
            wanted);
  EXPECT_EQ(find_tokenizer_file("meta-llama/Llama-3.1-8B", {"tokenizer.json"},
                                {{"HF_HOME", dir_.string()}}),
            wanted);
  // A directory, or the file itself.
  EXPECT_EQ(find_tokenizer_file(fs::path(wanted).parent_path().string(), {"tokenizer.json"}, {}),
            wanted);
  EXPECT_EQ(find_tokenizer_file(wanted, {"tokenizer.json"}, {}), wanted);
}

TEST_F(PrimusRules, AHubIdWithNoLocalCopySaysWhereToPutItsFiles) {
  const std::string error = usage_error([&] {
    find_tokenizer_file("Qwen/Qwen2.5-7B", {"tokenizer.json"}, {{"HOME", "/home/u"}});
  });
  EXPECT_EQ(error,
            "--tokenizer-model Qwen/Qwen2.5-7B: a Hugging Face model id with no local copy "
            "(nothing is downloaded); put its tokenizer.json in "
            "/home/u/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B/snapshots/main/ "
            "(HF_HUB_CACHE or HF_HOME choose the cache), or give --tokenizer-model a directory "
            "holding it");
}

}  // namespace
}  // namespace omni
