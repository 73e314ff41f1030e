// Megatron-DeepSpeed launcher variables as flags.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/env_overrides.h"
#include "config/options.h"

namespace omni {
namespace {

std::vector<std::string> flags(const std::map<std::string, std::string>& env) {
  std::vector<std::string> args;
  for (const EnvOverride& o : env_overrides(env))
    args.insert(args.end(), o.args.begin(), o.args.end());
  return args;
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
  EXPECT_EQ(o.global_batch_size, 32);  // MICRO_BATCH x GRAD_ACC_STEPS
  EXPECT_EQ(o.train_iters, 245);       // ceil(1e6 / (128 x 32))
  EXPECT_DOUBLE_EQ(o.lr, 3e-4);
  EXPECT_EQ(o.optimizer, "sgd");
}

TEST(EnvOverrides, ParallelLayoutVariablesSetTheirFlags) {
  Options o;
  parse_options(
      flags({{"ZERO_STAGE", "1"}, {"DTYPE", "bf16"}, {"USE_ACTIVATION_CHECKPOINTING", "1"}}), o);
  EXPECT_TRUE(o.use_distributed_optimizer);
  EXPECT_TRUE(o.bf16);
  EXPECT_EQ(o.recompute_granularity, "full");
  parse_options(flags({{"SP", "1"}, {"TP", "2"}}), o);
  EXPECT_TRUE(o.sequence_parallel);
  EXPECT_EQ(o.tensor_model_parallel_size, 2);
}

TEST(EnvOverrides, BadValuesNameTheVariable) {
  try {
    env_overrides({{"GRAD_ACC_STEPS", "x"}, {"MICRO_BATCH", "2"}});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("GRAD_ACC_STEPS=x"), std::string::npos) << e.what();
  }
  EXPECT_THROW(env_overrides({{"DTYPE", "int8"}}), UsageError);
  EXPECT_THROW(env_overrides({{"GRAD_ACC_STEPS", "4"}}), UsageError);  // needs MICRO_BATCH
}

}  // namespace
}  // namespace omni
