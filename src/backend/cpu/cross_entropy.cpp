// The output layer fused with softmax cross-entropy. Rows are processed in chunks whose
// logits fit a bounded buffer, so the full [tokens, vocab] logits never exist; the
// chunk's logits are turned into their gradient in place.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/gemm.h"
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
  const int N = a.rows, C = a.hidden, V = a.vocab, v0 = a.vocab_start;
  const int chunk = static_cast<int>(std::clamp<size_t>(kChunkElements / std::max(V, 1), 1, N));
  // Kept between calls: a fresh buffer of this size would be page-faulted in every step.
  // (thread_local: the OpenMP workers below must use the caller's buffer through `z0`.)
  static thread_local std::vector<T> buffer;
  buffer.resize(static_cast<size_t>(chunk) * V);
  T* const z0 = buffer.data();
  std::vector<double> row_loss(N);
  // Per row of a chunk: the logits' maximum, then (sum of exponentials, target logit); the
  // ranks of a vocabulary-parallel group combine each before it is used.
  std::vector<double> row_max(chunk), row_sums(2 * size_t(chunk));
  auto live = [&](int n) { return !mask || mask[n] != 0.0f; };
  for (int r0 = 0; r0 < N; r0 += chunk) {
    const int rows = std::min(chunk, N - r0);
    const T* hb = h + static_cast<size_t>(r0) * C;
    // Under the CPU's --bf16 the weight, the chunk's hidden rows and (once written) its logits'
    // gradient are rounded to bf16 once for the chunk's GEMMs: none changes once it is read.
    CpuBf16Reuse reuse;
    if (V > 0) gemm<T>(false, true, rows, V, C, T(1), hb, C, w, C, T(0), z0, V);
    // Three passes over each row: its maximum, its exponentials and their sum, its loss and
    // gradient. A vocabulary-parallel group combines the maxima and the sums across its
    // ranks between them; otherwise each row takes all three at once, while it is in the
    // core's cache (a row of 50k logits is 200 KB; the chunk's are hundreds of MB).
    auto find_max = [&](int i) {
      const T* z = z0 + static_cast<size_t>(i) * V;
      T mx = std::numeric_limits<T>::lowest();
      for (int j = 0; j < V; ++j) mx = std::max(mx, z[j]);
      row_max[i] = static_cast<double>(mx);
    };
    auto exponentiate = [&](int i) {
      const int n = r0 + i;
      T* z = z0 + static_cast<size_t>(i) * V;
      if (!live(n)) return;
      const int t = targets[n] - v0;
      const T mx = static_cast<T>(row_max[i]);
      row_sums[2 * i + 1] = t >= 0 && t < V ? static_cast<double>(z[t]) : 0.0;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) {
        z[j] = std::exp(z[j] - mx);
        sum += z[j];
      }
      row_sums[2 * i] = static_cast<double>(sum);
    };
    auto loss_and_gradient = [&](int i) {
      const int n = r0 + i;
      T* z = z0 + static_cast<size_t>(i) * V;
      if (!live(n)) {
        row_loss[n] = 0.0;
        if (losses) losses[n] = T(0);
        std::fill(z, z + V, T(0));
        return;
      }
      const double sum = row_sums[2 * i], zt = row_sums[2 * i + 1];
      const double lt = std::log(sum) + row_max[i] - zt;  // logsumexp(z) - z_t
      const float m = mask ? mask[n] : 1.0f;
      row_loss[n] = m * lt;
      if (losses) losses[n] = T(lt);
      if (dh) {
        const T g = T(a.grad_scale * m), inv = T(1) / static_cast<T>(sum);
#pragma omp simd
        for (int j = 0; j < V; ++j) z[j] = z[j] * inv * g;
        const int t = targets[n] - v0;
        if (t >= 0 && t < V) z[t] -= g;
      }
    };
    if (a.reduce) {
#pragma omp parallel for schedule(static)
      for (int i = 0; i < rows; ++i) find_max(i);
      a.reduce(row_max.data(), rows, true);
#pragma omp parallel for schedule(static)
      for (int i = 0; i < rows; ++i) exponentiate(i);
      a.reduce(row_sums.data(), 2 * rows, false);
#pragma omp parallel for schedule(static)
      for (int i = 0; i < rows; ++i) loss_and_gradient(i);
    } else {
#pragma omp parallel for schedule(static)
      for (int i = 0; i < rows; ++i) {
        find_max(i);
        exponentiate(i);
        loss_and_gradient(i);
      }
    }
    if (dh) {
      T* dhb = dh + static_cast<size_t>(r0) * C;
      if (V > 0) {
        gemm<T>(false, false, rows, C, V, T(1), z0, V, w, C, T(0), dhb, C);
        gemm<T>(true, false, V, C, rows, T(1), z0, V, hb, C, T(1), dw, C);
      } else {
        std::fill(dhb, dhb + static_cast<size_t>(rows) * C, T(0));
      }
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
