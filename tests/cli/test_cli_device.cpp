// --device on the omnitron binary, and what `omnitron info` reports. GPUs are hidden with
// CUDA_VISIBLE_DEVICES=-1 (HIP_VISIBLE_DEVICES=-1), so the tests read the same on a machine
// that has one.
#include <gtest/gtest.h>

#include <string>

#include "cli/process.h"

namespace {

const std::string kTiny =
    "train --mock-data --vocab-size 50 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
    "--seq-length 8 --micro-batch-size 2 --train-iters 2 --eval-iters 0 --no-progress ";
const std::string kNoGpu = "CUDA_VISIBLE_DEVICES=-1 HIP_VISIBLE_DEVICES=-1";

void expect_one_line_error(const ProcessResult& r, const std::string& must_mention) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(must_mention), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << r.output;
}

TEST(CliDevice, CudaWithoutAVisibleGpuSaysWhatToCheck) {
  const ProcessResult r = run_omnitron_env(kNoGpu, kTiny + "--device cuda");
#if defined(OMNITRON_CUDA)
  expect_one_line_error(r, "--device cuda: no CUDA GPU is visible");
  EXPECT_NE(r.output.find("nvidia-smi"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CUDA_VISIBLE_DEVICES (now '-1')"), std::string::npos) << r.output;
#else
  expect_one_line_error(r, "--device cuda: this omnitron was built without CUDA");
#endif
}

TEST(CliDevice, HipInABuildWithoutItSaysHowToRebuild) {
#if defined(OMNITRON_HIP)
  GTEST_SKIP() << "this build has HIP";
#else
  expect_one_line_error(run_omnitron_env(kNoGpu, kTiny + "--device hip"),
                        "this omnitron was built without HIP");
#endif
}

TEST(CliDevice, AutoTrainsOnTheCpuWhenNoGpuIsVisible) {
  const ProcessResult r = run_omnitron_env(kNoGpu, kTiny + "--device auto");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("device: cpu"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("not built yet"), std::string::npos) << r.output;
}

TEST(CliDevice, GenerateRefusesAGpuItCannotUse) {
  const ProcessResult r = run_omnitron_env(kNoGpu, "generate --load /nonexistent --device cuda");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--device cuda"), std::string::npos) << r.output;
}

TEST(CliInfo, ReportsBackendDevicesCollectivesAndWhatAutoPicks) {
  const ProcessResult r = run_omnitron_env(kNoGpu, "info");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"cpu:", "blas:", "sgemm peak:", "bf16 GEMM:", "gpu backend:",
                           "collectives:", "device auto:  cpu"})
    EXPECT_NE(r.output.find(line), std::string::npos) << line << " in:\n" << r.output;
#if defined(OMNITRON_CUDA)
  EXPECT_NE(r.output.find("gpu devices:  none visible"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CUDA_VISIBLE_DEVICES='-1'"), std::string::npos) << r.output;
#endif
#if defined(OMNITRON_MPI)
  EXPECT_NE(r.output.find("MPI: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("MPI: none"), std::string::npos) << r.output;
#endif
#if defined(OMNITRON_NCCL)
  EXPECT_NE(r.output.find("NCCL 2."), std::string::npos) << r.output;
#endif
}

}  // namespace
