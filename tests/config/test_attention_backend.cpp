// --attention-backend (Megatron's flag): the values the option takes, and which attention a run
// gets for each value on described platforms (backend/attention_backend.h), so a CUDA build
// with cuDNN, one without, a HIP build and the CPU are all checked on any machine.
#include <gtest/gtest.h>

#include <string>

#include "backend/attention_backend.h"
#include "config/config_test_helpers.h"
#include "config/options.h"

namespace omni {
namespace {

Options parsed(const std::vector<std::string>& args) {
  Options o;
  parse_options(args, o);
  return o;
}

AttentionSupport cpu() {
  return AttentionSupport{};
}
AttentionSupport cuda_with_cudnn(std::string refusal = "") {
  return AttentionSupport{true, false, true, std::move(refusal)};
}
AttentionSupport cuda_without_cudnn() {
  return AttentionSupport{true, false, false, "this build has no cuDNN"};
}
AttentionSupport hip() {
  return AttentionSupport{true, true, false, "this build has no cuDNN"};
}

AttentionBackend choose(const std::string& flag, const AttentionSupport& s,
                        std::string* reason = nullptr) {
  return choose_attention_backend(flag, s, reason);
}

TEST(AttentionBackendOption, DefaultsToAutoAsMegatron) {
  EXPECT_EQ(parsed({}).attention_backend, "auto");
}

TEST(AttentionBackendOption, TakesMegatronsValues) {
  for (const char* v : {"auto", "flash", "fused", "unfused", "local"})
    EXPECT_EQ(parsed({"--attention-backend", v}).attention_backend, v);
}

TEST(AttentionBackendOption, RefusesAnotherValueNamingTheFlagAndTheValues) {
  const std::string e = usage_error([] { parsed({"--attention-backend", "sdpa"}); });
  EXPECT_NE(e.find("--attention-backend"), std::string::npos) << e;
  EXPECT_NE(e.find("'sdpa'"), std::string::npos) << e;
  EXPECT_NE(e.find("auto, flash, fused, unfused"), std::string::npos) << e;
}

TEST(AttentionBackendChoice, AutoTakesCudnnWhenTheBuildHasItAndTheShapeIsTaken) {
  std::string reason;
  EXPECT_EQ(choose("auto", cuda_with_cudnn(), &reason), AttentionBackend::Fused);
  EXPECT_NE(reason.find("cuDNN"), std::string::npos) << reason;
}

TEST(AttentionBackendChoice, AutoFallsBackToFlashSayingWhyCudnnWasNotUsed) {
  std::string reason;
  EXPECT_EQ(choose("auto", cuda_with_cudnn("head_dim 40 is not a multiple of 8"), &reason),
            AttentionBackend::Flash);
  EXPECT_NE(reason.find("head_dim 40"), std::string::npos) << reason;
  EXPECT_EQ(choose("auto", cuda_without_cudnn(), &reason), AttentionBackend::Flash);
  EXPECT_NE(reason.find("no cuDNN"), std::string::npos) << reason;
  EXPECT_EQ(choose("auto", hip(), &reason), AttentionBackend::Flash);
}

TEST(AttentionBackendChoice, FlashIsOurKernelOnEveryGpu) {
  EXPECT_EQ(choose("flash", cuda_with_cudnn()), AttentionBackend::Flash);
  EXPECT_EQ(choose("flash", cuda_without_cudnn()), AttentionBackend::Flash);
  EXPECT_EQ(choose("flash", hip()), AttentionBackend::Flash);
}

TEST(AttentionBackendChoice, FusedOnAmdIsRefusedInOneLine) {
  const std::string e = usage_error([] { choose("fused", hip()); });
  EXPECT_NE(e.find("--attention-backend fused"), std::string::npos) << e;
  EXPECT_NE(e.find("HIP"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(AttentionBackendChoice, FusedWithoutCudnnOrForARefusedShapeSaysWhy) {
  EXPECT_NE(usage_error([] { choose("fused", cuda_without_cudnn()); }).find("no cuDNN"),
            std::string::npos);
  const std::string e =
      usage_error([] { choose("fused", cuda_with_cudnn("packed documents (...)")); });
  EXPECT_NE(e.find("packed documents"), std::string::npos) << e;
  EXPECT_EQ(choose("fused", cuda_with_cudnn()), AttentionBackend::Fused);
}

TEST(AttentionBackendChoice, UnfusedOnAGpuIsRefusedSinceTheGpuHasNoSuchKernel) {
  const std::string e = usage_error([] { choose("unfused", cuda_with_cudnn()); });
  EXPECT_NE(e.find("--device cpu"), std::string::npos) << e;
  EXPECT_FALSE(usage_error([] { choose("local", hip()); }).empty());
}

TEST(AttentionBackendChoice, TheCpuRunsItsOneAttentionForEveryValueAndSaysSo) {
  for (const char* v : {"auto", "flash", "fused", "unfused", "local"}) {
    std::string reason;
    EXPECT_EQ(choose(v, cpu(), &reason), AttentionBackend::Unfused) << v;
    EXPECT_NE(reason.find(std::string("--attention-backend ") + v), std::string::npos) << reason;
  }
}

TEST(AttentionBackendChoice, AnUnknownValueIsRefusedByTheChoiceToo) {
  EXPECT_NE(usage_error([] { choose("sdpa", cpu()); }).find("'sdpa'"), std::string::npos);
}

TEST(AttentionBackendChoice, ThisBuildOnTheCpuIsTheCpusAttention) {
  const ops::AttentionDims d{2, 64, 4, 2, 64};
  std::string reason;
  EXPECT_EQ(choose_attention_backend("auto", false, d, DType::BF16, &reason),
            AttentionBackend::Unfused);
  EXPECT_EQ(describe_attention_backend(AttentionBackend::Unfused, reason),
            "attention: unfused -- --attention-backend auto: the CPU's softmax attention");
}

TEST(AttentionBackendChoice, TheStartUpLineNamesTheBackendAndWhy) {
  const std::string line = describe_attention_backend(AttentionBackend::Flash, "because");
  EXPECT_EQ(line, "attention: flash -- because");
}

}  // namespace
}  // namespace omni
