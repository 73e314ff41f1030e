// LayerNorm and RMSNorm on the GPU against the CPU ops (backend/cpu/norm.cpp) on the same
// T-rounded inputs.
//
// Tolerances. Float: the kernels differ from the CPU only in summation order (a tree over
// threads against sequential SIMD sums) and, on a device built with --use_fast_math, in rsqrt
// and division by a few ulp; over rows of a few thousand elements that is a few 1e-7 relative,
// so 1e-5 relative (default_rtol<float>) with an absolute term of 1e-5 times the output's
// magnitude for outputs that cancel to near zero. bf16/f16: the same float arithmetic, then
// the output is rounded once to T (default_rtol<T>). The parameter gradients dw and db are
// float sums over rows: the CPU adds the rows' products in double, the GPU in float in its
// own order, so their difference grows like a random walk over the rows: 1e-6 sqrt(N) times
// the largest product (~16 sqrt(N) float ulps), whatever T is.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/ops.h"
#include "base/error.h"
#include "gpu/gpu_test.h"

namespace omni::gpu_test {
namespace {

template <typename T>
class GpuNorm : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuNorm, StorageTypes);

struct Shape {
  int N, C;
};
// One row at a typical hidden size; C under the warp size and odd; C not a multiple of the
// 16-byte pack (per-element path, two elements per thread); C = 1024; C = 3000 (packed, a
// block of several warps); C = 3001 (per-element, eight elements per thread); C = 32768, the
// longest packed row (64 elements a thread).
constexpr Shape kShapes[] = {{1, 768},  {5, 77},   {7, 1001},
                             {4, 1024}, {3, 3000}, {2, 3001}, {1, 32768}};
// The backward also with enough rows for several blocks of partial dw/db sums.
constexpr Shape kBackwardShapes[] = {{1, 768},  {5, 77},   {7, 1001}, {4, 1024},
                                     {3, 3000}, {2, 3001}, {37, 256}};
constexpr float kEps = 1e-5f;
constexpr double kFloatRtol = 1e-5;

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::abs(x)));
  return m;
}

// Inputs of one test, rounded to T; x has an offset so the mean matters.
template <typename T>
struct NormInputs {
  std::vector<float> x, w, b, dout, dx0, dw0, db0;
  NormInputs(int N, int C, uint32_t seed)
      : x(rounded<T>(random_vector(size_t(N) * C, seed, -1.0f, 2.0f))),
        w(rounded<T>(random_vector(C, seed + 1, 0.5f, 1.5f))),
        b(rounded<T>(random_vector(C, seed + 2))),
        dout(rounded<T>(random_vector(size_t(N) * C, seed + 3))),
        dx0(rounded<T>(random_vector(size_t(N) * C, seed + 4))),
        dw0(random_vector(C, seed + 5)),
        db0(random_vector(C, seed + 6)) {}
};

// Tolerance of a float sum over N rows of products at most `largest` (see the top).
double row_sum_atol(int N, double largest) {
  return 1e-6 * std::sqrt(double(N)) * largest;
}

// max |g| * max |xhat| over the rows: the largest term of dw.
double largest_dw_term(const std::vector<float>& dout, const std::vector<float>& x,
                       const std::vector<float>& mean, const std::vector<float>& rstd, int N,
                       int C) {
  double worst = 0;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      const size_t i = size_t(n) * C + c;
      worst = std::max(worst, std::abs(double(dout[i]) * (x[i] - mean[n]) * rstd[n]));
    }
  return worst;
}

TYPED_TEST(GpuNorm, LayerNormForwardMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (const auto [N, C] : kShapes) {
    SCOPED_TRACE("N = " + std::to_string(N) + ", C = " + std::to_string(C));
    const NormInputs<T> in(N, C, 10);
    std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
    ops::layernorm_forward(out.data(), mean.data(), rstd.data(), in.x.data(), in.w.data(),
                           in.b.data(), N, C, double(kEps));
    Device<T> x(in.x), w(in.w), b(in.b), got(out.size());
    Device<float> got_mean(N), got_rstd(N);
    gpu::layernorm_forward(got.get(), got_mean.get(), got_rstd.get(), x.get(), w.get(), b.get(), N,
                           C, kEps);
    EXPECT_TRUE(close(got.host(), out, default_rtol<T>(), kFloatRtol * max_abs(out)));
    EXPECT_TRUE(close(got_mean.host(), mean, kFloatRtol, kFloatRtol * max_abs(in.x)));
    EXPECT_TRUE(close(got_rstd.host(), rstd, kFloatRtol, 0.0));
  }
}

TYPED_TEST(GpuNorm, LayerNormWithoutBiasAndOnUnalignedRows) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  // Pointers one element past a 16-byte boundary take the per-element path even though
  // C = 1024 is a multiple of the pack.
  const int N = 3, C = 1024;
  const NormInputs<T> in(N, C, 20);
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
  ops::layernorm_forward(out.data(), mean.data(), rstd.data(), in.x.data(), in.w.data(),
                         static_cast<const float*>(nullptr), N, C, double(kEps));
  std::vector<float> x1(in.x), w1(in.w);
  x1.insert(x1.begin(), 0.0f), w1.insert(w1.begin(), 0.0f);
  Device<T> x(x1), w(w1), got(out.size() + 1);
  Device<float> got_mean(N), got_rstd(N);
  gpu::layernorm_forward(got.get() + 1, got_mean.get(), got_rstd.get(), x.get() + 1, w.get() + 1,
                         static_cast<const T*>(nullptr), N, C, kEps);
  std::vector<float> got_out = got.host();
  got_out.erase(got_out.begin());
  EXPECT_TRUE(close(got_out, out, default_rtol<T>(), kFloatRtol * max_abs(out)));
  EXPECT_TRUE(close(got_mean.host(), mean, kFloatRtol, kFloatRtol * max_abs(in.x)));
  EXPECT_TRUE(close(got_rstd.host(), rstd, kFloatRtol, 0.0));
}

TYPED_TEST(GpuNorm, LayerNormBackwardAccumulatesLikeCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (const auto [N, C] : kBackwardShapes) {
    SCOPED_TRACE("N = " + std::to_string(N) + ", C = " + std::to_string(C));
    const NormInputs<T> in(N, C, 30);
    std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
    ops::layernorm_forward(out.data(), mean.data(), rstd.data(), in.x.data(), in.w.data(),
                           in.b.data(), N, C, double(kEps));
    std::vector<float> dx(in.dx0), dw(in.dw0), db(in.db0);
    ops::layernorm_backward(dx.data(), dw.data(), db.data(), in.dout.data(), in.x.data(),
                            in.w.data(), mean.data(), rstd.data(), N, C);
    Device<T> got_dx(in.dx0), dout(in.dout), x(in.x), w(in.w);
    Device<float> got_dw(in.dw0), got_db(in.db0), dmean(mean), drstd(rstd);
    gpu::layernorm_backward(got_dx.get(), got_dw.get(), got_db.get(), dout.get(), x.get(), w.get(),
                            dmean.get(), drstd.get(), N, C);
    EXPECT_TRUE(close(got_dx.host(), dx, default_rtol<T>(), kFloatRtol * max_abs(dx)));
    const double term = largest_dw_term(in.dout, in.x, mean, rstd, N, C);
    EXPECT_TRUE(close(got_dw.host(), dw, kFloatRtol, row_sum_atol(N, term)));
    EXPECT_TRUE(close(got_db.host(), db, kFloatRtol, row_sum_atol(N, max_abs(in.dout))));
  }
}

TYPED_TEST(GpuNorm, LayerNormBackwardWithoutBiasGradient) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const int N = 9, C = 200;
  const NormInputs<T> in(N, C, 40);
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
  ops::layernorm_forward(out.data(), mean.data(), rstd.data(), in.x.data(), in.w.data(),
                         in.b.data(), N, C, double(kEps));
  std::vector<float> dx(in.dx0), dw(in.dw0);
  ops::layernorm_backward(dx.data(), dw.data(), static_cast<float*>(nullptr), in.dout.data(),
                          in.x.data(), in.w.data(), mean.data(), rstd.data(), N, C);
  Device<T> got_dx(in.dx0), dout(in.dout), x(in.x), w(in.w);
  Device<float> got_dw(in.dw0), dmean(mean), drstd(rstd);
  gpu::layernorm_backward(got_dx.get(), got_dw.get(), static_cast<float*>(nullptr), dout.get(),
                          x.get(), w.get(), dmean.get(), drstd.get(), N, C);
  EXPECT_TRUE(close(got_dx.host(), dx, default_rtol<T>(), kFloatRtol * max_abs(dx)));
  const double term = largest_dw_term(in.dout, in.x, mean, rstd, N, C);
  EXPECT_TRUE(close(got_dw.host(), dw, kFloatRtol, row_sum_atol(N, term)));
}

TYPED_TEST(GpuNorm, RmsNormForwardMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (const auto [N, C] : kShapes) {
    SCOPED_TRACE("N = " + std::to_string(N) + ", C = " + std::to_string(C));
    const NormInputs<T> in(N, C, 50);
    std::vector<float> out(size_t(N) * C), rstd(N);
    ops::rmsnorm_forward(out.data(), rstd.data(), in.x.data(), in.w.data(), N, C, double(kEps));
    Device<T> x(in.x), w(in.w), got(out.size());
    Device<float> got_rstd(N);
    gpu::rmsnorm_forward(got.get(), got_rstd.get(), x.get(), w.get(), N, C, kEps);
    EXPECT_TRUE(close(got.host(), out, default_rtol<T>(), kFloatRtol * max_abs(out)));
    EXPECT_TRUE(close(got_rstd.host(), rstd, kFloatRtol, 0.0));
  }
}

TYPED_TEST(GpuNorm, RmsNormBackwardAccumulatesLikeCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (const auto [N, C] : kBackwardShapes) {
    SCOPED_TRACE("N = " + std::to_string(N) + ", C = " + std::to_string(C));
    const NormInputs<T> in(N, C, 60);
    std::vector<float> out(size_t(N) * C), rstd(N);
    ops::rmsnorm_forward(out.data(), rstd.data(), in.x.data(), in.w.data(), N, C, double(kEps));
    std::vector<float> dx(in.dx0), dw(in.dw0);
    ops::rmsnorm_backward(dx.data(), dw.data(), in.dout.data(), in.x.data(), in.w.data(),
                          rstd.data(), N, C);
    Device<T> got_dx(in.dx0), dout(in.dout), x(in.x), w(in.w);
    Device<float> got_dw(in.dw0), drstd(rstd);
    gpu::rmsnorm_backward(got_dx.get(), got_dw.get(), dout.get(), x.get(), w.get(), drstd.get(), N,
                          C);
    EXPECT_TRUE(close(got_dx.host(), dx, default_rtol<T>(), kFloatRtol * max_abs(dx)));
    const std::vector<float> zero_mean(N, 0.0f);
    const double term = largest_dw_term(in.dout, in.x, zero_mean, rstd, N, C);
    EXPECT_TRUE(close(got_dw.host(), dw, kFloatRtol, row_sum_atol(N, term)));
  }
}

// Index of the first element whose bits differ, or -1.
long first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return long(i);
  return a.size() == b.size() ? -1 : long(std::min(a.size(), b.size()));
}

TYPED_TEST(GpuNorm, BackwardIsBitwiseDeterministic) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  // Eleven blocks of partial dw/db sums, rows per block not all equal.
  const int N = 83, C = 1000;
  const NormInputs<T> in(N, C, 70);
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
  ops::layernorm_forward(out.data(), mean.data(), rstd.data(), in.x.data(), in.w.data(),
                         in.b.data(), N, C, double(kEps));
  Device<T> dout(in.dout), x(in.x), w(in.w);
  Device<float> dmean(mean), drstd(rstd);
  // dx (both backwards accumulate into it), dw and db of LayerNorm, dw of RMSNorm.
  auto run = [&] {
    Device<T> dx(in.dx0);
    Device<float> dw(in.dw0), db(in.db0), dw_rms(in.dw0);
    gpu::layernorm_backward(dx.get(), dw.get(), db.get(), dout.get(), x.get(), w.get(), dmean.get(),
                            drstd.get(), N, C);
    gpu::rmsnorm_backward(dx.get(), dw_rms.get(), dout.get(), x.get(), w.get(), drstd.get(), N, C);
    std::vector<float> all = dx.host();
    for (const auto* part : {&dw, &db, &dw_rms}) {
      const std::vector<float> h = part->host();
      all.insert(all.end(), h.begin(), h.end());
    }
    return all;
  };
  const std::vector<float> first = run(), second = run();
  EXPECT_EQ(first_bit_difference(first, second), -1)
      << "elements: dx [0, " << N * C << "), then dw, db, RMSNorm's dw, " << C << " each";
}

TYPED_TEST(GpuNorm, RowsLongerThanTheKernelTakesAreOneLineErrors) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const int C = 32768 + 16;  // packed for every type
  Device<T> x(std::vector<float>(C, 1.0f)), w(std::vector<float>(C, 1.0f)), out(C);
  Device<float> rstd(1);
  try {
    gpu::rmsnorm_forward(out.get(), rstd.get(), x.get(), w.get(), 1, C, kEps);
    ADD_FAILURE() << "no error";
  } catch (const omni::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rows of C = 32784 elements are too long for the GPU "
                                         "kernel (at most 32768)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace omni::gpu_test
