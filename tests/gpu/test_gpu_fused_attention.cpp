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
#include <chrono>
#include <cmath>
#include <cstdio>

#include "backend/attention_backend.h"
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

// max |got - want| over the tensor's peak |want|: the figure the tolerances bound.
double scaled_error(const std::vector<float>& got, const std::vector<float>& want) {
  double peak = 1e-2, worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    peak = std::max(peak, double(std::abs(want[i])));
    worst = std::max(worst, double(std::abs(got[i] - want[i])));
  }
  return worst / peak;
}

template <typename T>
void expect_fused_matches_cpu_and_flash(const ops::AttentionDims& d, uint32_t seed) {
  const Case c{d, {}, {}, seed};
  const Inputs<T> in(c);
  const Result want = cpu_attention<T>(c, in);
  const Result fused = gpu_attention<T>(c, in, GpuAttention::Fused);
  const Result flash = gpu_attention<T>(c, in, GpuAttention::Flash);
  const double tol = attention_tol<T>();
  for (const auto& [name, r] : {std::pair{"fused", &fused}, {"flash", &flash}})
    std::printf(
        "%s %s b%d s%d h%d g%d hd%d, error / peak against the CPU: out %.2e dq %.2e "
        "dk %.2e dv %.2e (tolerance %.0e)\n",
        name, std::is_same_v<T, bf16> ? "bf16" : "f16", d.batch, d.seq, d.heads, d.groups,
        d.head_dim, scaled_error(r->out, want.out), scaled_error(r->dq, want.dq),
        scaled_error(r->dk, want.dk), scaled_error(r->dv, want.dv), tol);
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
  EXPECT_FALSE(gpu::fused_attention_supported<bf16>({1, 64, 2, 1, 36}, &why));
  EXPECT_NE(why.find("head_dim 36"), std::string::npos) << why;
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

// --attention-backend auto on this GPU: cuDNN where it takes the shape, and the start-up line
// names its version.
TEST(GpuFusedAttentionSupport, AutoTakesCudnnOnThisGpuWhenItTakesTheShape) {
  OMNI_REQUIRE_FUSED(bf16, (ops::AttentionDims{2, 128, 8, 2, 64}));
  std::string reason;
  const AttentionBackend b =
      choose_attention_backend("auto", true, {2, 128, 8, 2, 64}, DType::BF16, &reason);
  EXPECT_EQ(b, AttentionBackend::Fused) << reason;
  const std::string line = describe_attention_backend(b, reason);
  std::printf("%s\n", line.c_str());
  EXPECT_NE(line.find("cuDNN 9."), std::string::npos) << line;
}

// Forward + backward times of both kernels at a training shape (run with
// --gtest_also_run_disabled_tests; prints, never fails on time).
TEST(GpuFusedAttentionSupport, DISABLED_Timing) {
  const ops::AttentionDims d{4, 2048, 16, 4, 128};
  OMNI_REQUIRE_FUSED(bf16, d);
  const size_t nq = size_t(d.batch) * d.seq * d.heads * d.head_dim;
  const size_t nk = size_t(d.batch) * d.seq * d.groups * d.head_dim;
  Device<bf16> q(random_vector(nq, 1)), k(random_vector(nk, 2)), v(random_vector(nk, 3));
  Device<bf16> dout(random_vector(nq, 4)), out(nq), dq(nq), dk(nk), dv(nk);
  gpu::DeviceArray<float> lse(size_t(d.batch) * d.heads * d.seq);
  for (const auto which : {GpuAttention::Flash, GpuAttention::Fused}) {
    auto step = [&] {
      if (which == GpuAttention::Flash) {
        gpu::flash_attention_forward(out.get(), lse.data(), q.get(), k.get(), v.get(), d);
        gpu::flash_attention_backward(dq.get(), dk.get(), dv.get(), dout.get(), out.get(),
                                      lse.data(), q.get(), k.get(), v.get(), d);
      } else {
        gpu::fused_attention_forward(out.get(), lse.data(), q.get(), k.get(), v.get(), d);
        gpu::fused_attention_backward(dq.get(), dk.get(), dv.get(), dout.get(), out.get(),
                                      lse.data(), q.get(), k.get(), v.get(), d);
      }
    };
    step();
    gpu::synchronize();
    const int reps = 10;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) step();
    gpu::synchronize();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
        reps;
    // Causal: half of 4 * b * h * s^2 * hd multiply-adds forward, 2.5x that backward.
    const double flops = 3.5 * 2.0 * d.batch * d.heads * double(d.seq) * d.seq * d.head_dim;
    std::printf("%s bf16 b%d s%d h%d g%d hd%d: forward+backward %.3f ms, %.1f TFLOP/s\n",
                which == GpuAttention::Flash ? "flash" : "fused", d.batch, d.seq, d.heads, d.groups,
                d.head_dim, ms, flops / ms / 1e9);
  }
}

}  // namespace
}  // namespace omni::gpu_test
