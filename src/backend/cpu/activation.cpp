#include <cmath>

#include "backend/cpu/reduce.h"
#include "backend/ops.h"

namespace omni {
const char* to_string(GeluForm form) {
  return form == GeluForm::Erf ? "erf" : "tanh";
}
}  // namespace omni

namespace omni::ops {

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
constexpr double kSqrtHalf = 0.7071067811865476;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1 / sqrt(2 pi), the normal density at 0

// Tanh form: 0.5 (1 + tanh(u)) = sigmoid(2u), the same function through one exp, which
// vectorises (libmvec) where tanh does not, and without tanh's cancellation near 0.
template <typename T>
void gelu_tanh_forward(T* out, const T* x, size_t n) {
  const T s2 = T(2 * kSqrt2OverPi), a = T(kGeluCubic);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    T v = x[i];
    out[i] = v / (T(1) + std::exp(-s2 * (v + a * v * v * v)));
  }
}

// d/dx [x sigmoid(2u)] = sig + x sig (1 - sig) 2u'.
template <typename T>
void gelu_tanh_backward(T* dx, const T* dout, const T* x, size_t n) {
  const T s2 = T(2 * kSqrt2OverPi), a = T(kGeluCubic);
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    T v = x[i];
    T sig = T(1) / (T(1) + std::exp(-s2 * (v + a * v * v * v)));
    T du2 = s2 * (T(1) + T(3) * a * v * v);
    dx[i] = dout[i] * (sig + v * sig * (T(1) - sig) * du2);
  }
}

// Erf form: Phi(x) = 0.5 (1 + erf(x / sqrt 2)) written as 0.5 erfc(-x / sqrt 2), which keeps
// its relative accuracy for negative x where 1 + erf(...) cancels.
template <typename T>
void gelu_erf_forward(T* out, const T* x, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * T(0.5) * std::erfc(-x[i] * T(kSqrtHalf));
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density.
template <typename T>
void gelu_erf_backward(T* dx, const T* dout, const T* x, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    T v = x[i];
    T cdf = T(0.5) * std::erfc(-v * T(kSqrtHalf));
    T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * v * v);
    dx[i] = dout[i] * (cdf + v * pdf);
  }
}
}  // namespace

template <typename T>
void gelu_forward(T* out, const T* x, size_t n, GeluForm form) {
  if (form == GeluForm::Erf)
    gelu_erf_forward(out, x, n);
  else
    gelu_tanh_forward(out, x, n);
}

template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, size_t n, GeluForm form) {
  if (form == GeluForm::Erf)
    gelu_erf_backward(dx, dout, x, n);
  else
    gelu_tanh_backward(dx, dout, x, n);
}

template <typename T>
void swiglu_forward(T* out, const T* x, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* gate = x + static_cast<size_t>(n) * 2 * F;
    const T* up = gate + F;
    T* o = out + static_cast<size_t>(n) * F;
#pragma omp simd
    for (int f = 0; f < F; ++f) o[f] = gate[f] / (T(1) + std::exp(-gate[f])) * up[f];
  }
}

template <typename T>
void swiglu_backward(T* dx, const T* dout, const T* x, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* gate = x + static_cast<size_t>(n) * 2 * F;
    const T* up = gate + F;
    const T* g = dout + static_cast<size_t>(n) * F;
    T* dgate = dx + static_cast<size_t>(n) * 2 * F;
    T* dup = dgate + F;
#pragma omp simd
    for (int f = 0; f < F; ++f) {
      T sig = T(1) / (T(1) + std::exp(-gate[f]));
      T silu = gate[f] * sig;
      dgate[f] = g[f] * up[f] * sig * (T(1) + gate[f] * (T(1) - sig));
      dup[f] = g[f] * silu;
    }
  }
}

#define INSTANTIATE(T)                                                      \
  template void gelu_forward<T>(T*, const T*, size_t, GeluForm);            \
  template void gelu_backward<T>(T*, const T*, const T*, size_t, GeluForm); \
  template void swiglu_forward<T>(T*, const T*, int, int);                  \
  template void swiglu_backward<T>(T*, const T*, const T*, int, int);
OMNI_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace omni::ops
