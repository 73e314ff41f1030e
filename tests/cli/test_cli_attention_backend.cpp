// --attention-backend on the omnitron binary: a value Megatron does not have is one line naming
// the flag; Megatron's values are accepted on the CPU, which has one attention.
#include <gtest/gtest.h>

#include <string>

#include "cli/process.h"

namespace {

const std::string kTiny =
    "train --mock-data --vocab-size 50 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
    "--seq-length 8 --micro-batch-size 2 --train-iters 1 --eval-iters 0 --no-progress "
    "--device cpu ";

TEST(CliAttentionBackend, AnUnknownValueIsOneLineNamingTheFlagAndTheValues) {
  const ProcessResult r = run_omnitron(kTiny + "--attention-backend sdpa");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--attention-backend: 'sdpa' is not one of auto, flash, fused"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << r.output;
}

TEST(CliAttentionBackend, MegatronsGpuValuesStillTrainOnTheCpu) {
  for (const char* v : {"fused", "flash", "unfused"}) {
    const ProcessResult r = run_omnitron(kTiny + "--attention-backend " + v);
    EXPECT_EQ(r.exit_code, 0) << v << "\n" << r.output;
  }
}

}  // namespace
