// Multi-latent attention through the binary: the tiny DeepSeek of the zoo (MLA, a dense layer,
// then fine-grained experts with a shared one) trains; bad input is one line naming the flags.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cli/process.h"

namespace omni {
namespace {

const std::string kTiny =
    "train --model tiny_deepseek --mock-data --vocab-size 64 --seq-length 16 "
    "--micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --log-interval 1 --eval-iters 0 "
    "--max-new-tokens 0 --no-progress ";

TEST(CliMla, TinyDeepSeekTrains) {
  const ProcessResult r = run_omnitron(kTiny + "--train-iters 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" iteration        3/"), std::string::npos) << r.output;
}

TEST(CliMla, BadInputIsOneLineNamingTheFlags) {
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--position-embedding-type learned_absolute",
            "--multi-latent-attention needs --position-embedding-type rope (its decoupled rope "
            "key; got learned_absolute)"},
           {"--kv-lora-rank 0", "--multi-latent-attention needs a positive --kv-lora-rank (got 0)"},
           {"--rope-type ntk", "--rope-type: 'ntk' is not one of rope, yarn"},
       }) {
    const ProcessResult r = run_omnitron(kTiny + "--print-config " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

}  // namespace
}  // namespace omni
