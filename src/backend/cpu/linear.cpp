#include <cblas.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/gemm.h"
#include "backend/cpu/reduce.h"
#include "backend/ops.h"

namespace omni::ops {

template <>
void gemm<float>(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  if (cpu_bf16_gemms_on()) {
    gemm_bf16(cpu_bf16_gemm_kernel(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  gemm_fp32(cpu_fp32_gemm_kernel(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void gemm<double>(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda,
                  const double* B, int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <typename T>
void linear_forward(T* y, const T* x, const T* w, const T* bias, int M, int K, int N) {
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; ++m) std::memcpy(y + static_cast<size_t>(m) * N, bias, N * sizeof(T));
  }
  gemm<T>(false, true, M, N, K, T(1), x, K, w, K, bias ? T(1) : T(0), y, N);
}

template <typename T>
void add_bias(T* y, const T* bias, int M, int N) {
#pragma omp parallel for schedule(static)
  for (int m = 0; m < M; ++m) {
    T* row = y + static_cast<size_t>(m) * N;
    for (int n = 0; n < N; ++n) row[n] += bias[n];
  }
}

template <typename T>
void linear_backward(T* dx, T* dw, T* dbias, const T* dy, const T* x, const T* w, int M, int K,
                     int N, bool accumulate_dx) {
  CpuBf16Reuse reuse;  // --bf16: dy rounded once for both GEMMs
  if (dx) gemm<T>(false, false, M, K, N, T(1), dy, N, w, K, accumulate_dx ? T(1) : T(0), dx, K);
  gemm<T>(true, false, N, K, M, T(1), dy, N, x, K, T(1), dw, K);
  if (dbias) {
    cpu::blocked_row_reduce(dbias, M, N, [&](int r0, int r1, double* acc) {
      for (int r = r0; r < r1; ++r) {
        const T* row = dy + static_cast<size_t>(r) * N;
        for (int c = 0; c < N; ++c) acc[c] += row[c];
      }
    });
  }
}

template <typename T>
void add(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void scale(T* x, double s, size_t n) {
  const T factor = T(s);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] *= factor;
}

// Fixed blocks, each summed in kLanes interleaved double accumulators (element i into lane
// i mod kLanes, the lanes added in order at the block's end): the order depends on n alone,
// never on the thread count, and the lanes are independent sums the compiler vectorises
// (one accumulator is a chain of dependent adds, 4 cycles an element).
template <typename T>
double sum_squares(const T* x, size_t n) {
  constexpr size_t kBlock = 1 << 16, kLanes = 16;
  const size_t nblocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(nblocks);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
    double lanes[kLanes] = {};
    size_t i = i0;
    for (; i + kLanes <= i1; i += kLanes)
#pragma omp simd
      for (size_t l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(x[i + l]) * x[i + l];
    double s = 0;
    for (double lane : lanes) s += lane;
    for (; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[b] = s;
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

template <typename T>
double count_zeros(const T* x, size_t n) {
  int64_t zeros = 0;
#pragma omp parallel for simd reduction(+ : zeros) schedule(static)
  for (size_t i = 0; i < n; ++i) zeros += x[i] == T(0);
  return double(zeros);
}

#define INSTANTIATE(T)                                                                             \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int, int, int);                \
  template void linear_backward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int, bool); \
  template void add<T>(T*, const T*, const T*, size_t);                                            \
  template void add_bias<T>(T*, const T*, int, int);                                               \
  template void scale<T>(T*, double, size_t);                                                      \
  template double sum_squares<T>(const T*, size_t);                                                \
  template double count_zeros<T>(const T*, size_t);
OMNI_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace omni::ops
