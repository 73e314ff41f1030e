#include <algorithm>
#include <cstring>

#include "backend/cpu/reduce.h"
#include "backend/ops.h"

namespace omni::ops {

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int N, int seq,
                       int C, const int32_t* positions, int vocab_start, int vocab_end) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* o = out + static_cast<size_t>(n) * C;
    const int t = tokens[n];
    if (t >= vocab_start && t < vocab_end)
      std::memcpy(o, wte + static_cast<size_t>(t - vocab_start) * C, C * sizeof(T));
    else
      std::fill(o, o + C, T(0));
  }
  if (wpe) position_embedding_add(out, wpe, N, seq, C, positions);
}

template <typename T>
void position_embedding_add(T* out, const T* wpe, int N, int seq, int C, const int32_t* positions) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* o = out + static_cast<size_t>(n) * C;
    const T* p = wpe + static_cast<size_t>(positions ? positions[n] : n % seq) * C;
    for (int c = 0; c < C; ++c) o[c] += p[c];
  }
}

// Scatter-add by token id. Threads own disjoint column ranges and walk all rows in order,
// so there are no races and the sum order never changes.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const int32_t* tokens, const T* dout, int N, int seq,
                        int C, const int32_t* positions, int vocab_start, int vocab_end) {
  constexpr int kCols = 64;
  const int nchunks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < nchunks; ++chunk) {
    int c0 = chunk * kCols, c1 = std::min(C, c0 + kCols);
    for (int n = 0; n < N; ++n) {
      const T* g = dout + static_cast<size_t>(n) * C;
      const int t = tokens[n];
      if (dwte && t >= vocab_start && t < vocab_end) {
        T* e = dwte + static_cast<size_t>(t - vocab_start) * C;
        for (int c = c0; c < c1; ++c) e[c] += g[c];
      }
      if (dwpe) {
        T* p = dwpe + static_cast<size_t>(positions ? positions[n] : n % seq) * C;
        for (int c = c0; c < c1; ++c) p[c] += g[c];
      }
    }
  }
}

#define INSTANTIATE(T)                                                                       \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int,       \
                                     const int32_t*, int, int);                                \
  template void embedding_backward<T>(T*, T*, const int32_t*, const T*, int, int, int,          \
                                      const int32_t*, int, int);                                \
  template void position_embedding_add<T>(T*, const T*, int, int, int, const int32_t*);
OMNI_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace omni::ops
