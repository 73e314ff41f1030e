// The CPU's GEMM kernels: fp32 (oneDNN's and OpenBLAS's sgemm) against a float64 product, and
// --bf16's against a float64 product of the bf16-rounded operands; every transpose, alpha and
// beta, odd sizes and padded leading dimensions; inside an OpenMP parallel region; and the
// scopes that switch gemm<float> to bf16.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/ops.h"
#include "base/dtype.h"

namespace omni::ops {
namespace {

struct Case {
  bool ta, tb;
  int M, N, K;
  float alpha, beta;
};

float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

using GemmFn = std::function<void(bool, bool, int, int, int, float, const float*, int,
                                   const float*, int, float, float*, int)>;

// Runs one case with `run` on matrices whose rows are padded by 3 elements; returns the largest
// error relative to sum |alpha a b| + |beta c| per element, against a float64 product of the
// operands (rounded to bf16 first when `rounded`).
double worst_error(const Case& c, const GemmFn& run, bool rounded, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int ar = c.ta ? c.K : c.M, ac = c.ta ? c.M : c.K;
  const int br = c.tb ? c.N : c.K, bc = c.tb ? c.K : c.N;
  const int lda = ac + 3, ldb = bc + 3, ldc = c.N + 3;
  std::vector<float> A(size_t(ar) * lda), B(size_t(br) * ldb), C(size_t(c.M) * ldc);
  for (float& v : A) v = normal(rng);
  for (float& v : B) v = normal(rng);
  for (float& v : C) v = normal(rng);
  const std::vector<float> C0 = C;
  run(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
  auto value = [&](float x) { return double(rounded ? round_bf16(x) : x); };
  auto a = [&](int m, int k) {
    return value(c.ta ? A[size_t(k) * lda + m] : A[size_t(m) * lda + k]);
  };
  auto b = [&](int k, int n) {
    return value(c.tb ? B[size_t(n) * ldb + k] : B[size_t(k) * ldb + n]);
  };
  double worst = 0;
  for (int m = 0; m < c.M; ++m)
    for (int n = 0; n < c.N + 3; ++n) {
      const size_t i = size_t(m) * ldc + n;
      if (n >= c.N) {  // the padding is never written
        if (C[i] != C0[i]) return INFINITY;
        continue;
      }
      double ref = 0, scale = 0;
      for (int k = 0; k < c.K; ++k) {
        ref += a(m, k) * b(k, n);
        scale += std::abs(a(m, k) * b(k, n));
      }
      ref = c.alpha * ref + c.beta * double(C0[i]);
      scale = std::abs(c.alpha) * scale + std::abs(c.beta * double(C0[i])) + 1e-30;
      worst = std::max(worst, std::abs(double(C[i]) - ref) / scale);
    }
  return worst;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      out.push_back({ta, tb, 37, 29, 53, 1.f, 0.f});
      out.push_back({ta, tb, 64, 48, 131, 0.75f, 1.f});
      out.push_back({ta, tb, 5, 70, 9, -1.5f, 1.f});
    }
  return out;
}

// fp32 accumulation over K <= 131 terms of exact products: a few units of 2^-24 of the sum
// of magnitudes. Without the rounding of A and B (an fp32 product) the error relative to
// the rounded reference is ~2^-9, far above the bound.
constexpr double kTolerance = 1e-6;

GemmFn bf16_kernel(Bf16GemmKernel kernel) {
  return [kernel](bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc) {
    gemm_bf16(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  };
}
GemmFn fp32_kernel(Fp32GemmKernel kernel) {
  return [kernel](bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc) {
    gemm_fp32(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  };
}
const GemmFn gemm_float = gemm<float>;

// Every case of cases() through each of `kernels` (made into a GemmFn by `make`) against the
// float64 reference; then no kernel has met an error from oneDNN (`describe`: the kernel's
// description, which names such an error).
template <typename Kernel>
void expect_every_case(std::initializer_list<Kernel> kernels, GemmFn (*make)(Kernel),
                       bool rounded, std::string (*describe)()) {
  uint32_t seed = 1;
  for (Kernel kernel : kernels)
    for (const Case& c : cases())
      EXPECT_LT(worst_error(c, make(kernel), rounded, seed++), kTolerance)
          << "kernel " << int(kernel) << " ta " << c.ta << " tb " << c.tb << " M " << c.M << " N "
          << c.N << " K " << c.K << " alpha " << c.alpha << " beta " << c.beta;
  EXPECT_EQ(describe().find("returned an error"), std::string::npos) << describe();
}

// fp32 products round too (2^-24 each), so the bound is the same order; a bf16 rounding of
// either operand (2^-9) is far above it.
TEST(GemmFp32, BothKernelsMatchFloat64) {
  expect_every_case({Fp32GemmKernel::OneDnn, Fp32GemmKernel::OpenBlas}, fp32_kernel, false,
                    describe_cpu_fp32_gemm);
  EXPECT_LT(worst_error(cases()[1], gemm_float, false, 99), kTolerance);
  if (describe_cpu_fp32_gemm().find("built without oneDNN") == std::string::npos) {
    EXPECT_EQ(cpu_fp32_gemm_kernel(), Fp32GemmKernel::OneDnn) << describe_cpu_fp32_gemm();
  }
}

TEST(GemmBf16, BothKernelsMatchFloat64OnRoundedOperands) {
  expect_every_case({Bf16GemmKernel::OneDnn, Bf16GemmKernel::RoundedSgemm}, bf16_kernel, true,
                    describe_cpu_bf16_gemm);
}

TEST(GemmBf16, OneThreadPerGemmInsideAParallelRegion) {
  // One GEMM per thread, as the experts run (ops::moe_for_each_expert): each thread's own
  // scratch, and oneDNN kept to the calling thread (bf16's and fp32's).
  const int threads = std::max(2, omp_get_max_threads());
  std::vector<double> errors(threads, INFINITY), fp32_errors(threads, INFINITY);
  std::vector<int> before(threads), after(threads);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const Case c{t % 2 == 1, t % 2 == 0, 33 + t, 41, 67, 1.f, 1.f};
    before[t] = omp_get_max_threads();
    errors[t] = worst_error(c, bf16_kernel(cpu_bf16_gemm_kernel()), true, 100 + t);
    fp32_errors[t] = worst_error(c, fp32_kernel(cpu_fp32_gemm_kernel()), false, 200 + t);
    after[t] = omp_get_max_threads();  // oneDNN's team size of one undone
  }
  for (int t = 0; t < threads; ++t) {
    EXPECT_LT(errors[t], kTolerance) << "thread " << t;
    EXPECT_LT(fp32_errors[t], kTolerance) << "thread " << t;
    EXPECT_EQ(after[t], before[t]) << "thread " << t;
  }
}

TEST(GemmBf16, ScopesSwitchGemmFloat) {
  const Case c{false, true, 21, 17, 45, 1.f, 0.f};
  ASSERT_FALSE(cpu_bf16_gemms_on());
  // fp32 gemm measured against the rounded reference: the rounding's error, ~2^-9.
  EXPECT_GT(worst_error(c, gemm_float, true, 7), 1e-4);
  {
    CpuBf16Gemms on;
    EXPECT_TRUE(cpu_bf16_gemms_on());
    EXPECT_LT(worst_error(c, gemm_float, true, 7), kTolerance);
    {
      CpuFp32Gemms fp32;  // this thread only
      EXPECT_FALSE(cpu_bf16_gemms_on());
      EXPECT_GT(worst_error(c, gemm_float, true, 7), 1e-4);
    }
    bool worker_on = false;
#pragma omp parallel num_threads(2)
    if (omp_get_thread_num() == 1) worker_on = cpu_bf16_gemms_on();  // the model's workers
    EXPECT_TRUE(worker_on || omp_get_max_threads() < 2);
    CpuBf16Gemms off(false);
    EXPECT_TRUE(cpu_bf16_gemms_on());
  }
  EXPECT_FALSE(cpu_bf16_gemms_on());
}

// Under a CpuBf16Reuse scope a matrix's bf16 copy is made once and reused in another role
// (here A as the first GEMM's left operand and, transposed, the second's right one); closing
// the scope forgets the copies.
TEST(GemmBf16, ReuseScopeKeepsCopiesWhileOpenOnly) {
  const int M = 19, K = 33, N = 7;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> A(size_t(M) * K), B(size_t(K) * N), D(size_t(M) * N);
  for (float& v : A) v = normal(rng);
  for (float& v : B) v = normal(rng);
  for (float& v : D) v = normal(rng);
  const Bf16GemmKernel k = Bf16GemmKernel::OneDnn;
  // C1 = A B [M, N]; C2 = D^T A [N, K] (A as the right operand, not transposed: the same
  // matrix, address and leading dimension).
  auto products = [&] {
    std::vector<float> C1(size_t(M) * N), C2(size_t(N) * K);
    gemm_bf16(k, false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, C1.data(), N);
    gemm_bf16(k, true, false, N, K, M, 1.f, D.data(), N, A.data(), K, 0.f, C2.data(), K);
    C1.insert(C1.end(), C2.begin(), C2.end());
    return C1;
  };
  const std::vector<float> alone = products();
  {
    CpuBf16Reuse reuse;
    EXPECT_EQ(products(), alone);
  }
  for (float& v : A) v *= 2;  // powers of two round alike: the products double exactly
  std::vector<float> doubled = alone;
  for (float& v : doubled) v *= 2;
  {
    CpuBf16Reuse reuse;  // a fresh scope sees the new values
    EXPECT_EQ(products(), doubled);
    if (cpu_bf16_gemm_kernel() != Bf16GemmKernel::OneDnn)
      GTEST_SKIP() << "copies are kept on oneDNN's path only: " << describe_cpu_bf16_gemm();
    for (float& v : A) v *= 2;  // against the scope's promise: its copy of A is still used
    EXPECT_EQ(products(), doubled);
  }
}

}  // namespace
}  // namespace omni::ops
