#include <cmath>

#include "backend/cpu/reduce.h"
#include "backend/ops.h"

namespace omni::ops {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int N, int C,
                       double eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* xr = x + static_cast<size_t>(n) * C;
    T* o = out + static_cast<size_t>(n) * C;
    // Two passes (mean, then centred variance) avoid the cancellation of E[x^2] - E[x]^2.
    T m = 0;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; ++c) m += xr[c];
    m /= C;
    T v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    T rs = T(1) / std::sqrt(v / C + T(eps));
    for (int c = 0; c < C; ++c) o[c] = (xr[c] - m) * rs * w[c] + (b ? b[c] : T(0));
    mean[n] = m;
    rstd[n] = rs;
  }
}

template <typename T>
void layernorm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                        const T* rstd, int N, int C) {
  const int width = db ? 2 * C : C;
  std::vector<T> dparams(width, T(0));
  cpu::blocked_row_reduce(dparams.data(), N, width, [&](int r0, int r1, double* acc) {
    for (int n = r0; n < r1; ++n) {
      const T* g = dout + static_cast<size_t>(n) * C;
      const T* xr = x + static_cast<size_t>(n) * C;
      T* d = dx + static_cast<size_t>(n) * C;
      const T m = mean[n], rs = rstd[n];
      T sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (int c = 0; c < C; ++c) {
        T gw = g[c] * w[c];
        sum_g += gw;
        sum_gx += gw * (xr[c] - m) * rs;
      }
      sum_g /= C;
      sum_gx /= C;
      for (int c = 0; c < C; ++c) {
        T xhat = (xr[c] - m) * rs;
        d[c] += rs * (g[c] * w[c] - sum_g - xhat * sum_gx);
        acc[c] += g[c] * xhat;
        if (db) acc[C + c] += g[c];
      }
    }
  });
  for (int c = 0; c < C; ++c) dw[c] += dparams[c];
  if (db)
    for (int c = 0; c < C; ++c) db[c] += dparams[C + c];
}

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, int N, int C, double eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* xr = x + static_cast<size_t>(n) * C;
    T* o = out + static_cast<size_t>(n) * C;
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; ++c) ss += xr[c] * xr[c];
    T rs = T(1) / std::sqrt(ss / C + T(eps));
    for (int c = 0; c < C; ++c) o[c] = xr[c] * rs * w[c];
    rstd[n] = rs;
  }
}

template <typename T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd, int N,
                      int C) {
  cpu::blocked_row_reduce(dw, N, C, [&](int r0, int r1, double* acc) {
    for (int n = r0; n < r1; ++n) {
      const T* g = dout + static_cast<size_t>(n) * C;
      const T* xr = x + static_cast<size_t>(n) * C;
      T* d = dx + static_cast<size_t>(n) * C;
      const T rs = rstd[n];
      T sum_gx = 0;
#pragma omp simd reduction(+ : sum_gx)
      for (int c = 0; c < C; ++c) sum_gx += g[c] * w[c] * xr[c] * rs;
      sum_gx /= C;
      for (int c = 0; c < C; ++c) {
        T xhat = xr[c] * rs;
        d[c] += rs * (g[c] * w[c] - xhat * sum_gx);
        acc[c] += g[c] * xhat;
      }
    }
  });
}

#define INSTANTIATE(T)                                                                            \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, double); \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,         \
                                      const T*, int, int);                                        \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int, int, double);                 \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);
OMNI_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace omni::ops
