// cuDNN's fused attention (--attention-backend fused, backend/gpu/cudnn_attention.*) against
// the CPU's attention (the unfused reference) and our flash kernel, forward and backward, on
// the same T-rounded inputs: causal, multi-head, grouped-query and multi-query heads, sequences
// that are not a multiple of cuDNN's tiles. Skips, saying why, where cuDNN cannot run (no GPU,
// a build without cuDNN: the emulator, HIP); the tests of what it refuses run everywhere.
//
// Tolerances, stated before measuring: out, dq, dk, dv as flash attention's against the CPU
// (attention_tol: bf16 1e-2, f16 4e-3 of each tensor's peak; cuDNN rounds P and dS to T before
// its matmuls as flash does); lse 1e-3 (float on both sides, cuDNN's own exp and log); fused
// against flash within the sum of both tolerances.
#include "gpu/attention_reference.h"

namespace omni::gpu_test {
namespace {

#define OMNI_REQUIRE_FUSED(T, dims)                                              \
  do {                                                                           \
    OMNI_REQUIRE_GPU();                                                          \
    std::string why_;                                                            \
    if (!gpu::fused_attention_supported<T>(dims, &why_))                         \
      GTEST_SKIP() << "cuDNN's fused attention cannot run this shape: " << why_; \
  } while (0)

template <typename T>
void expect_fused_matches_cpu_and_flash(const ops::AttentionDims& d, uint32_t seed) {
  const Case c{d, {}, {}, seed};
  const Inputs<T> in(c);
  const Result want = cpu_attention<T>(c, in);
  const Result fused = gpu_attention<T>(c, in, GpuAttention::Fused);
  const Result flash = gpu_attention<T>(c, in, GpuAttention::Flash);
  const double tol = attention_tol<T>();
  EXPECT_TRUE(close_scaled(fused.out, want.out, tol)) << "out";
  EXPECT_TRUE(close(fused.lse, want.lse, 1e-3, 1e-3)) << "lse";
  EXPECT_TRUE(close_scaled(fused.dq, want.dq, tol)) << "dq";
  EXPECT_TRUE(close_scaled(fused.dk, want.dk, tol)) << "dk";
  EXPECT_TRUE(close_scaled(fused.dv, want.dv, tol)) << "dv";
  EXPECT_TRUE(close_scaled(fused.out, flash.out, 2 * tol)) << "out against flash";
  EXPECT_TRUE(close_scaled(fused.dq, flash.dq, 2 * tol)) << "dq against flash";
  EXPECT_TRUE(close_scaled(fused.dk, flash.dk, 2 * tol)) << "dk against flash";
  EXPECT_TRUE(close_scaled(fused.dv, flash.dv, 2 * tol)) << "dv against flash";
}

template <typename T>
class GpuFusedAttention : public ::testing::Test {};
using HalfTypes = ::testing::Types<bf16, f16>;
TYPED_TEST_SUITE(GpuFusedAttention, HalfTypes);

// 8 query heads on 2 key/value heads, two samples.
TYPED_TEST(GpuFusedAttention, CausalGroupedQuery) {
  const ops::AttentionDims d{2, 128, 8, 2, 64};
  OMNI_REQUIRE_FUSED(TypeParam, d);
  expect_fused_matches_cpu_and_flash<TypeParam>(d, 101);
}

// One key/value head, head_dim 128, a sequence that is not a multiple of 64 or 128.
TYPED_TEST(GpuFusedAttention, CausalMultiQueryHeadDim128) {
  const ops::AttentionDims d{1, 200, 4, 1, 128};
  OMNI_REQUIRE_FUSED(TypeParam, d);
  expect_fused_matches_cpu_and_flash<TypeParam>(d, 111);
}

// Plain multi-head attention, a short odd sequence.
TYPED_TEST(GpuFusedAttention, CausalMultiHeadShortSequence) {
  const ops::AttentionDims d{2, 70, 4, 4, 64};
  OMNI_REQUIRE_FUSED(TypeParam, d);
  expect_fused_matches_cpu_and_flash<TypeParam>(d, 121);
}

// What cuDNN's attention does not take is refused with the reason, in every build: float
// storage, head dimensions off its grid, and per-row key ranges (packed documents).
TEST(GpuFusedAttentionSupport, RefusesWhatItCannotTakeSayingWhy) {
  std::string why;
  const ops::AttentionDims ok{1, 64, 2, 1, 64};
  EXPECT_FALSE(gpu::fused_attention_supported<float>(ok, &why));
  EXPECT_FALSE(why.empty());
  if (!gpu::has_cudnn()) {
    EXPECT_NE(why.find("no cuDNN"), std::string::npos) << why;
    return;
  }
  if (gpu::device_count() == 0) return;  // the reason is "no CUDA device is visible"
  EXPECT_NE(why.find("bf16 and f16"), std::string::npos) << why;
  EXPECT_FALSE(gpu::fused_attention_supported<bf16>({1, 64, 2, 1, 40}, &why));
  EXPECT_NE(why.find("head_dim 40"), std::string::npos) << why;
  const std::vector<int32_t> starts(64, 0);
  const auto device_starts = to_device(starts);
  ops::AttentionDims packed = ok;
  packed.key_start = device_starts.data();
  EXPECT_FALSE(gpu::fused_attention_supported<bf16>(packed, &why));
  EXPECT_NE(why.find("packed documents"), std::string::npos) << why;
}

// Calling it anyway throws naming the op, instead of computing something else.
TEST(GpuFusedAttentionSupport, CallingItWhereItCannotRunThrowsNamingTheOp) {
  const ops::AttentionDims d{1, 8, 1, 1, 8};
  if (gpu::has_cudnn()) OMNI_REQUIRE_GPU();
  Device<float> x(size_t(8 * 8));
  gpu::DeviceArray<float> lse(8);
  try {
    gpu::fused_attention_forward(x.get(), lse.data(), x.get(), x.get(), x.get(), d);
    FAIL() << "float storage ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("[fused_attention]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace omni::gpu_test
