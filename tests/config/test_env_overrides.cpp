// Megatron-DeepSpeed launcher variables as flags, with the meanings argonne-lcf/
// Megatron-DeepSpeed's ALCF/helpers.sh gives them (the reference for every expectation here).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/env_overrides.h"
#include "config/options.h"

namespace omni {
namespace {

using Env = std::map<std::string, std::string>;
using Args = std::vector<std::string>;

Args flags(const Env& env, int world_size = 1) {
  Args args;
  for (const EnvOverride& o : env_overrides(env, world_size))
    args.insert(args.end(), o.args.begin(), o.args.end());
  return args;
}

std::string notes(const Env& env) {
  std::string all;
  for (const EnvOverride& o : env_overrides(env)) all += o.note + "\n";
  return all;
}

std::string error_of(const Env& env, int world_size = 1) {
  try {
    env_overrides(env, world_size);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(EnvOverrides, LauncherVariablesBecomeTheFlagsTheyStandFor) {
  Options o;
  parse_options(flags({{"NLAYERS", "6"},
                       {"HIDDEN", "256"},
                       {"HEADS", "8"},
                       {"NUM_KV_HEAD", "2"},
                       {"FFN_HIDDEN_SIZE", "704"},
                       {"SEQ", "128"},
                       {"MICRO_BATCH", "4"},
                       {"GRAD_ACC_STEPS", "8"},
                       {"LR", "3e-4"},
                       {"WEIGHT_DECAY", "0.1"},
                       {"OPT", "sgd"},
                       {"TP", "1"},
                       {"PP", "1"},
                       {"DTYPE", "fp32"},
                       {"ZERO_STAGE", "0"},
                       {"TRAIN_TOKENS", "1000000"}}),
                o);
  EXPECT_EQ(o.model.num_layers, 6);
  EXPECT_EQ(o.model.hidden_size, 256);
  EXPECT_TRUE(o.model.group_query_attention);
  EXPECT_EQ(o.model.num_query_groups, 2);
  EXPECT_EQ(o.model.ffn_hidden_size, 704);
  EXPECT_EQ(o.global_batch_size, 32);  // MICRO_BATCH x GRAD_ACC_STEPS x 1 data-parallel rank
  EXPECT_EQ(o.train_iters, 244);       // helpers.sh: 1000000 / 128 / 32, rounded down
  EXPECT_DOUBLE_EQ(o.lr, 3e-4);
  EXPECT_EQ(o.optimizer, "sgd");
}

// helpers.sh passes each of these as one flag with the variable's value.
TEST(EnvOverrides, OneFlagVariablesPassTheirValue) {
  const std::pair<const char*, Args> cases[] = {
      {"ADAM_EPS", {"--adam-eps", "1e-5"}},
      {"ADAM_BETA1", {"--adam-beta1", "1e-5"}},
      {"ADAM_BETA2", {"--adam-beta2", "1e-5"}},
      {"CLIP_GRAD", {"--clip-grad", "1e-5"}},
      {"INIT_METHOD_STD", {"--init-method-std", "1e-5"}},
      {"ROPE_THETA", {"--rotary-base", "1e-5"}},
      {"LR_WARMUP_FRAC", {"--lr-warmup-fraction", "1e-5"}},
      {"LR_DECAY_ITERS", {"--lr-decay-iters", "7"}},
      {"EVAL_INTERVAL", {"--eval-interval", "7"}},
      {"EVAL_ITERS", {"--eval-iters", "7"}},
      {"LOG_INTERVAL", {"--log-interval", "7"}},
      {"SAVE_INTERVAL", {"--save-interval", "7"}},
      {"TRAIN_ITERS", {"--train-iters", "7"}},
      {"GLOBAL_BATCH", {"--global-batch-size", "7"}},
      {"TOKENIZER_MODEL", {"--tokenizer-model", "google/gemma-7b"}},
      {"SAVE", {"--save", "ck/out"}},
      {"LOAD", {"--load", "ck/in"}},
      {"LR_DECAY_STYLE", {"--lr-decay-style", "cosine"}},
  };
  for (const auto& [var, expected] : cases) EXPECT_EQ(flags({{var, expected[1]}}), expected) << var;
}

TEST(EnvOverrides, OneFlagVariablesSetTheOptions) {
  Options o;
  parse_options(flags({{"ADAM_EPS", "1e-5"},
                       {"CLIP_GRAD", "0.5"},
                       {"INIT_METHOD_STD", "0.0006"},
                       {"ROPE_THETA", "50000"},
                       {"LR_DECAY_STYLE", "cosine"},
                       {"LR_WARMUP_FRAC", "0.05"},
                       {"LR_DECAY_ITERS", "900"},
                       {"EVAL_INTERVAL", "100"},
                       {"EVAL_ITERS", "20"},
                       {"LOG_INTERVAL", "1"},
                       {"SAVE_INTERVAL", "50"},
                       {"GLOBAL_BATCH", "64"}}),
                o);
  EXPECT_DOUBLE_EQ(o.optim.adam_eps, 1e-5);
  EXPECT_DOUBLE_EQ(o.optim.clip_grad, 0.5);
  EXPECT_DOUBLE_EQ(o.model.init_method_std, 0.0006);
  EXPECT_DOUBLE_EQ(o.model.rotary_base, 50000);
  EXPECT_EQ(o.lr_decay_style, "cosine");
  EXPECT_DOUBLE_EQ(o.lr_warmup_fraction, 0.05);
  EXPECT_EQ(o.lr_decay_iters, 900);
  EXPECT_EQ(o.eval_interval, 100);
  EXPECT_EQ(o.eval_iters, 20);
  EXPECT_EQ(o.log_interval, 1);
  EXPECT_EQ(o.save_interval, 50);
  EXPECT_EQ(o.global_batch_size, 64);
}

// helpers.sh: HEADS=${HEADS:-${NHEADS}}, NLAYERS=${NLAYERS:-${NUM_LAYERS}},
// OPT=${OPT:-${OPTIMIZER:-${OPTIM}}}, TRAIN_ITERS=${TRAIN_ITERS:-${TRAIN_ITER}}.
TEST(EnvOverrides, AliasesApplyWhenTheMainNameIsUnset) {
  EXPECT_EQ(flags({{"NUM_LAYERS", "4"}}), (Args{"--num-layers", "4"}));
  EXPECT_EQ(flags({{"NUM_LAYERS", "4"}, {"NLAYERS", "6"}}), (Args{"--num-layers", "6"}));
  EXPECT_EQ(flags({{"NHEADS", "4"}}), (Args{"--num-attention-heads", "4"}));
  EXPECT_EQ(flags({{"NHEADS", "4"}, {"HEADS", "8"}}), (Args{"--num-attention-heads", "8"}));
  EXPECT_EQ(flags({{"TRAIN_ITER", "9"}}), (Args{"--train-iters", "9"}));
  EXPECT_EQ(flags({{"TRAIN_ITER", "9"}, {"TRAIN_ITERS", "5"}}), (Args{"--train-iters", "5"}));
  EXPECT_EQ(flags({{"OPTIM", "sgd"}}), (Args{"--optimizer", "sgd"}));
  EXPECT_EQ(flags({{"OPTIM", "sgd"}, {"OPTIMIZER", "adamw"}}), (Args{"--optimizer", "adamw"}));
  EXPECT_EQ(flags({{"OPTIM", "sgd"}, {"OPTIMIZER", "sgd"}, {"OPT", "adamw"}}),
            (Args{"--optimizer", "adamw"}));
}

TEST(EnvOverrides, AnEmptyValueIsUnsetAsInHelpersSh) {
  EXPECT_TRUE(flags({{"LR", ""}, {"NO_TENSORBOARD", ""}, {"NLAYERS", ""}}).empty());
  EXPECT_EQ(flags({{"NLAYERS", ""}, {"NUM_LAYERS", "3"}}), (Args{"--num-layers", "3"}));
}

// GLOBAL_BATCH_MAX = WORLD_SIZE x MICRO_BATCH x GRAD_ACC_STEPS / TP / PP / SP.
TEST(EnvOverrides, GradAccStepsCountsTheDataParallelRanks) {
  EXPECT_EQ(flags({{"MICRO_BATCH", "2"}, {"GRAD_ACC_STEPS", "4"}, {"TP", "2"}}, 8),
            (Args{"--tensor-model-parallel-size", "2", "--micro-batch-size", "2",
                  "--global-batch-size", "32"}));  // 2 x 4 x (8 / 2)
  EXPECT_EQ(flags({{"MICRO_BATCH", "1"}, {"GRAD_ACC_STEPS", "2"}, {"SP", "2"}}, 4),
            (Args{"--micro-batch-size", "1", "--ds-sequence-parallel-size", "2",
                  "--global-batch-size", "4"}));  // 1 x 2 x (4 / 2)
  EXPECT_NE(error_of({{"MICRO_BATCH", "1"}, {"GRAD_ACC_STEPS", "2"}, {"TP", "3"}}, 4)
                .find("4 rank(s) do not divide into TP 3 x PP 1 x SP 1"),
            std::string::npos);
}

TEST(EnvOverrides, GlobalBatchWinsAndMustAgreeWithGradAccSteps) {
  EXPECT_EQ(flags({{"GLOBAL_BATCH", "16"}, {"MICRO_BATCH", "2"}, {"GRAD_ACC_STEPS", "4"}}, 2),
            (Args{"--micro-batch-size", "2", "--global-batch-size", "16"}));
  const std::string e =
      error_of({{"GLOBAL_BATCH", "16"}, {"MICRO_BATCH", "2"}, {"GRAD_ACC_STEPS", "4"}});
  EXPECT_NE(e.find("GLOBAL_BATCH=16 but MICRO_BATCH x GRAD_ACC_STEPS x data-parallel ranks = "
                   "2 x 4 x 1 = 8"),
            std::string::npos)
      << e;
}

TEST(EnvOverrides, TrainTokensBecomeIterationsAndWinOverTrainIters) {
  // 10000 tokens / 16 per sequence / global batch 8 = 78 (rounded down).
  const Env env = {
      {"TRAIN_TOKENS", "10000"}, {"SEQ", "16"}, {"GLOBAL_BATCH", "8"}, {"TRAIN_ITERS", "3"}};
  EXPECT_EQ(flags(env),
            (Args{"--seq-length", "16", "--global-batch-size", "8", "--train-iters", "78"}));
  EXPECT_NE(notes(env).find("TRAIN_ITERS=3 is ignored: TRAIN_TOKENS sets the iterations"),
            std::string::npos);
  // Without GLOBAL_BATCH: MICRO_BATCH x data-parallel ranks (GRAD_ACC_STEPS 1).
  EXPECT_EQ(flags({{"TRAIN_TOKENS", "10000"}, {"SEQ", "16"}, {"MICRO_BATCH", "2"}}, 4),
            (Args{"--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "78"}));
  EXPECT_NE(error_of({{"TRAIN_TOKENS", "100"}, {"SEQ", "16"}, {"GLOBAL_BATCH", "8"}})
                .find("less than one iteration"),
            std::string::npos);
  EXPECT_NE(error_of({{"TRAIN_TOKENS", "100"}}).find("TRAIN_TOKENS needs SEQ"), std::string::npos);
}

// helpers.sh: --split=${TRAIN_SPLIT:-990},${VAL_SPLIT:-10},${TEST_SPLIT:-0}
TEST(EnvOverrides, SplitVariablesFillTheOthersWithHelpersDefaults) {
  EXPECT_EQ(flags({{"VAL_SPLIT", "5"}}), (Args{"--split", "990,5,0"}));
  EXPECT_EQ(flags({{"TRAIN_SPLIT", "98"}, {"VAL_SPLIT", "1"}, {"TEST_SPLIT", "1"}}),
            (Args{"--split", "98,1,1"}));
  const std::vector<EnvOverride> o = env_overrides({{"TRAIN_SPLIT", "98"}, {"TEST_SPLIT", "2"}});
  ASSERT_EQ(o.size(), 1u);
  EXPECT_EQ(o[0].source, "TRAIN_SPLIT=98 TEST_SPLIT=2");
}

TEST(EnvOverrides, CkptDirHoldsCheckpointsAndTensorBoard) {
  EXPECT_EQ(flags({{"CKPT_DIR", "ck"}}),
            (Args{"--save", "ck", "--load", "ck", "--tensorboard-dir", "ck/tensorboard"}));
  EXPECT_EQ(flags({{"CKPT_DIR", "ck"}, {"SAVE", "out"}}),
            (Args{"--save", "out", "--load", "ck", "--tensorboard-dir", "ck/tensorboard"}));
  EXPECT_EQ(flags({{"CKPT_DIR", "ck"}, {"LOAD", "in"}, {"NO_TENSORBOARD", "1"}}),
            (Args{"--load", "in", "--save", "ck", "--disable-tensorboard"}));
  Options o;
  parse_options({"--tensorboard-dir", "from_yaml"}, o);
  parse_options(flags({{"NO_TENSORBOARD", "1"}}), o);
  EXPECT_EQ(o.tensorboard_dir, "");
}

TEST(EnvOverrides, NoTensorboardIsASwitchByBeingSetEvenToZero) {
  EXPECT_EQ(flags({{"NO_TENSORBOARD", "0"}}), (Args{"--disable-tensorboard"}));
  EXPECT_NE(notes({{"NO_TENSORBOARD", "0"}}).find("unset it to keep TensorBoard"),
            std::string::npos);
}

TEST(EnvOverrides, TokenizerTypeUsesHelpersNames) {
  EXPECT_EQ(flags({{"TOKENIZER_TYPE", "gpt2"}}), (Args{"--tokenizer-type", "GPT2BPETokenizer"}));
  EXPECT_EQ(flags({{"TOKENIZER_TYPE", "GPT2BPETokenizer"}}),
            (Args{"--tokenizer-type", "GPT2BPETokenizer"}));
  EXPECT_EQ(flags({{"TOKENIZER_TYPE", "HFTokenizer"}}),
            (Args{"--tokenizer-type", "HuggingFaceTokenizer"}));
  EXPECT_EQ(flags({{"TOKENIZER_TYPE", "Llama2Tokenizer"}}),
            (Args{"--tokenizer-type", "Llama2Tokenizer"}));
}

TEST(EnvOverrides, OptimizerNamesMapToTheSameUpdate) {
  EXPECT_EQ(flags({{"OPT", "apex.adam"}}), (Args{"--optimizer", "adamw"}));
  EXPECT_EQ(flags({{"OPT", "apex.sgd"}}), (Args{"--optimizer", "sgd"}));
  EXPECT_EQ(flags({{"OPT", "adam"}}), (Args{"--optimizer", "adam"}));
  EXPECT_NE(notes({{"OPT", "adam"}}).find("torch.optim.Adam"), std::string::npos);
  EXPECT_THROW(env_overrides({{"OPT", "galoreadamw"}}), NotBuiltError);
  EXPECT_NE(error_of({{"OPTIM", "ds.onebitlamb"}}).find("OPTIM=ds.onebitlamb: not built yet"),
            std::string::npos);
  EXPECT_THROW(env_overrides({{"LR_DECAY_STYLE", "infinite-cosine"}}), NotBuiltError);
}

TEST(EnvOverrides, ParallelLayoutVariablesSetTheirFlags) {
  Options o;
  parse_options(
      flags({{"ZERO_STAGE", "1"}, {"DTYPE", "bf16"}, {"USE_ACTIVATION_CHECKPOINTING", "1"}}), o);
  EXPECT_TRUE(o.use_distributed_optimizer);
  EXPECT_TRUE(o.bf16);
  EXPECT_EQ(o.recompute_granularity, "full");
  parse_options(flags({{"SP", "2"}, {"TP", "2"}}), o);
  EXPECT_EQ(o.context_parallel_size, 2);  // SP is DeepSpeed-Ulysses's degree
  EXPECT_EQ(o.cp_comm_type, "a2a");
  EXPECT_FALSE(o.sequence_parallel);
  EXPECT_EQ(o.tensor_model_parallel_size, 2);
  EXPECT_TRUE(flags({{"SP", "1"}}).empty());  // helpers.sh's default: no sequence split
}

TEST(EnvOverrides, ActCkptNumLayersOnlyWithActivationCheckpointing) {
  EXPECT_EQ(flags({{"USE_ACTIVATION_CHECKPOINTING", "1"}, {"ACT_CKPT_NUM_LAYERS", "1"}}),
            (Args{"--checkpoint-activations", "--recompute-num-layers", "1"}));
  EXPECT_EQ(flags({{"USE_ACTIVATION_CHECKPOINTING", "true"}, {"ACT_CKPT_NUM_LAYERS", "2"}}),
            (Args{"--checkpoint-activations"}));
  EXPECT_NE(notes({{"USE_ACTIVATION_CHECKPOINTING", "1"}, {"ACT_CKPT_NUM_LAYERS", "2"}})
                .find("note: ACT_CKPT_NUM_LAYERS=2: recomputing groups of layers"),
            std::string::npos);
  EXPECT_TRUE(flags({{"ACT_CKPT_NUM_LAYERS", "2"}}).empty());
  EXPECT_NE(notes({{"ACT_CKPT_NUM_LAYERS", "2"}}).find("without USE_ACTIVATION_CHECKPOINTING"),
            std::string::npos);
}

TEST(EnvOverrides, DeepSpeedOnlyVariablesAreAcceptedWithANote) {
  for (const char* var : {"CPU_OPTIMIZER", "ZERO_HPZ_PARTITION_SIZE", "MICS_SHARD_SIZE",
                          "COMMS_LOGGER", "NO_FLASH_ATTN"}) {
    const std::vector<EnvOverride> o = env_overrides({{var, "1"}});
    ASSERT_EQ(o.size(), 1u) << var;
    EXPECT_TRUE(o[0].args.empty()) << var;
    EXPECT_EQ(o[0].note.rfind("note: " + std::string(var) + "=1: ", 0), 0u) << o[0].note;
    EXPECT_EQ(o[0].note.find('\n'), std::string::npos) << o[0].note;  // one line
  }
}

TEST(EnvOverrides, BadValuesNameTheVariable) {
  EXPECT_NE(error_of({{"GRAD_ACC_STEPS", "x"}, {"MICRO_BATCH", "2"}}).find("GRAD_ACC_STEPS=x"),
            std::string::npos);
  EXPECT_NE(error_of({{"ADAM_EPS", "tiny"}}).find("ADAM_EPS=tiny: --adam-eps expects a number"),
            std::string::npos);
  EXPECT_NE(error_of({{"NUM_LAYERS", "2.5"}}).find("NUM_LAYERS=2.5"), std::string::npos);
  EXPECT_NE(error_of({{"SP", "true"}}).find("SP=true: expected a positive integer"),
            std::string::npos);
  EXPECT_THROW(env_overrides({{"DTYPE", "int8"}}), UsageError);
  EXPECT_THROW(env_overrides({{"GRAD_ACC_STEPS", "4"}}), UsageError);  // needs MICRO_BATCH
}

}  // namespace
}  // namespace omni
