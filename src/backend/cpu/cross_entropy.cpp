// The output layer fused with softmax cross-entropy. Rows are processed in chunks whose
// logits fit a bounded buffer, so the full [tokens, vocab] logits never exist; the
// chunk's logits are turned into their gradient in place.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/reduce.h"
#include "backend/ops.h"
#include "base/error.h"

namespace omni::ops {

namespace {
constexpr size_t kChunkElements = size_t(1) << 26;  // 256 MiB of float logits at most
}

template <typename T>
double classifier_cross_entropy(T* losses, T* dh, T* dw, const T* h, const T* w,
                                const int32_t* targets, const float* mask,
                                const ClassifierLossArgs& a) {
  const int N = a.rows, C = a.hidden, V = a.vocab;
  const int chunk = static_cast<int>(std::clamp<size_t>(kChunkElements / V, 1, N));
  // Kept between calls: a fresh buffer of this size would be page-faulted in every step.
  // (thread_local: the OpenMP workers below must use the caller's buffer through `z0`.)
  static thread_local std::vector<T> buffer;
  buffer.resize(static_cast<size_t>(chunk) * V);
  T* const z0 = buffer.data();
  std::vector<double> row_loss(N);
  for (int r0 = 0; r0 < N; r0 += chunk) {
    const int rows = std::min(chunk, N - r0);
    const T* hb = h + static_cast<size_t>(r0) * C;
    gemm<T>(false, true, rows, V, C, T(1), hb, C, w, C, T(0), z0, V);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; ++i) {
      const int n = r0 + i;
      const float m = mask ? mask[n] : 1.0f;
      T* z = z0 + static_cast<size_t>(i) * V;
      if (m == 0.0f) {
        row_loss[n] = 0.0;
        if (losses) losses[n] = T(0);
        std::fill(z, z + V, T(0));
        continue;
      }
      const int t = targets[n];
      const T zt = z[t];
      T mx = z[0];
      for (int j = 1; j < V; ++j) mx = std::max(mx, z[j]);
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) {
        z[j] = std::exp(z[j] - mx);
        sum += z[j];
      }
      const double lt = std::log(static_cast<double>(sum)) + mx - zt;  // logsumexp(z) - z_t
      row_loss[n] = m * lt;
      if (losses) losses[n] = T(lt);
      if (dh) {
        const T g = T(a.grad_scale * m), inv = T(1) / sum;
#pragma omp simd
        for (int j = 0; j < V; ++j) z[j] = z[j] * inv * g;
        z[t] -= g;
      }
    }
    if (dh) {
      gemm<T>(false, false, rows, C, V, T(1), z0, V, w, C, T(0), dh + static_cast<size_t>(r0) * C,
              C);
      gemm<T>(true, false, V, C, rows, T(1), z0, V, hb, C, T(1), dw, C);
    }
  }
  double total = 0;
  for (double l : row_loss) total += l;
  return total;
}

#define INSTANTIATE(T)                                                                        \
  template double classifier_cross_entropy<T>(T*, T*, T*, const T*, const T*, const int32_t*, \
                                              const float*, const ClassifierLossArgs&);
OMNI_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace omni::ops
