// adam8bit's per-element arithmetic (optim/zoo_adam8bit.cpp cites bitsandbytes and says what each
// step does), written once for the CPU (optim/zoo_adam8bit.cpp) and the GPU
// (backend/gpu/zoo_adam8bit.cu), so both round the same float operations in the same order.
// Plain C++17 without the standard library's maths: nvcc and hipcc compile it for the device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define OMNI_ADAM8BIT_HD __host__ __device__
#else
#include <cmath>
#define OMNI_ADAM8BIT_HD
#endif

namespace omni::adam8bit {

// One step's constants, each as float as bitsandbytes rounds it (Adam8bitUpdate fills them).
struct Constants {
  float b1 = 0, b2 = 0, eps = 0, lr = 0, wd = 0, correction2 = 0, step_size = 0;
};

OMNI_ADAM8BIT_HD inline float square_root(float x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

// Adam's recurrences for one element's moments; false (and both zeroed) where the gradient is
// not finite, which skips the element.
OMNI_ADAM8BIT_HD inline bool update_moments(const Constants& c, float grad, float& m, float& v) {
  if (!(grad - grad == 0.0f)) {  // inf or NaN
    m = v = 0.0f;
    return false;
  }
  m = m * c.b1 + (1.0f - c.b1) * grad;
  v = v * c.b2 + (1.0f - c.b2) * (grad * grad);
  return true;
}

// The weight after the step from the updated moments: w + step_size * m / (sqrt(v) + eps *
// sqrt(1 - b2^t)), then decayed by 1 - lr wd.
OMNI_ADAM8BIT_HD inline float apply(const Constants& c, float m, float v, float w) {
  float x = w + c.step_size * (m / (square_root(v) + c.eps * c.correction2));
  if (c.wd > 0.0f) x = x * (1.0f - c.lr * c.wd);
  return x;
}

// The nearest of the 256 sorted codes to x (the lower one on a tie), as std::lower_bound
// finds the first code not below x.
OMNI_ADAM8BIT_HD inline uint8_t nearest_code(const float* code, float x) {
  int lo = 0, count = 256;
  while (count > 0) {
    const int half = count / 2;
    if (code[lo + half] < x) {
      lo += half + 1;
      count -= half + 1;
    } else {
      count = half;
    }
  }
  if (lo == 0) return 0;
  if (lo == 256) return 255;
  return uint8_t(x - code[lo - 1] <= code[lo] - x ? lo - 1 : lo);
}

OMNI_ADAM8BIT_HD inline bool negative(float x) {  // the sign bit (-0 included)
  return x < 0.0f || (x == 0.0f && 1.0f / x < 0.0f);
}

// The signed code of x / absmax; a code whose sign differs from x's moves one code toward
// x's side (bitsandbytes keeps the first moment's sign).
OMNI_ADAM8BIT_HD inline uint8_t quantize_signed(const float* code1, float x, float absmax) {
  if (absmax == 0.0f) return nearest_code(code1, 0.0f);
  uint8_t q = nearest_code(code1, x / absmax);
  if (negative(code1[q]) != negative(x)) q = uint8_t(x > 0.0f ? q + 1 : q - 1);
  return q;
}

OMNI_ADAM8BIT_HD inline uint8_t quantize_unsigned(const float* code2, float x, float absmax) {
  return nearest_code(code2, absmax > 0.0f ? x / absmax : 0.0f);
}

// One step on the GPU (backend/gpu/zoo_adam8bit.cu) over a rank's elements, given as runs:
// contiguous elements of one tensor, contiguous in the flat buffer and in the states.
struct Run {
  int64_t first = 0;        // the run's first element among the launch's
  int64_t w = 0;            // into the flat parameter and gradient buffers
  int64_t state = 0;        // into q1/q2 (quantised) or s1/s2 (fp32 moments)
  int64_t global = 0;       // the whole tensor's element (row-major) of the run's first
  int64_t block_start = 0;  // into the block maxima: the tensor's block 0
  int64_t count = 0;
  int32_t quantized = 0, decay = 0;
};
struct Step {
  Constants with_decay, without_decay;
  int64_t block = 256;
  const Run* runs = nullptr;  // device memory, sorted by first
  int64_t run_count = 0, n = 0;
  float* w = nullptr;
  const float* g = nullptr;
  uint8_t *q1 = nullptr, *q2 = nullptr;                // code indices of the quantised elements
  float *s1 = nullptr, *s2 = nullptr;                  // fp32 moments of the others
  const float *absmax1 = nullptr, *absmax2 = nullptr;  // the blocks' maxima before the step
  float *max1 = nullptr, *max2 = nullptr;              // after it: pass 0 raises them (zeros first)
  const float *code1 = nullptr, *code2 = nullptr;      // the 256 codes each, device memory
  // 0: the new moments' block maxima only; 1: moments recomputed, weights stepped, moments
  // quantised against max1/max2 (the fp32 elements step here).
  int pass = 0;
};

// Element k of run r in pass s.pass (Step says what each does), for the CPU's loop and the
// GPU's kernel alike; w and g are the flat buffers (T: float, or double on the CPU).
// raise(b, |m|, |v|) raises block b's new maxima in pass 0.
template <typename T, typename Raise>
OMNI_ADAM8BIT_HD inline void step_element(const Step& s, T* w, const T* g, const Run& r, int64_t k,
                                          Raise&& raise) {
  const Constants& c = r.decay ? s.with_decay : s.without_decay;
  const int64_t wi = r.w + k, at = r.state + k;
  if (!r.quantized) {
    if (s.pass == 0) return;
    float m = s.s1[at], v = s.s2[at];
    if (update_moments(c, float(g[wi]), m, v)) w[wi] = T(apply(c, m, v, float(w[wi])));
    s.s1[at] = m, s.s2[at] = v;
    return;
  }
  const int64_t b = r.block_start + (r.global + k) / s.block;
  float m = s.code1[s.q1[at]] * s.absmax1[b];
  float v = s.code2[s.q2[at]] * s.absmax2[b];
  const bool finite = update_moments(c, float(g[wi]), m, v);
  if (s.pass == 0) {
    raise(b, m < 0.0f ? -m : m, v < 0.0f ? -v : v);
    return;
  }
  if (finite) w[wi] = T(apply(c, m, v, float(w[wi])));
  s.q1[at] = quantize_signed(s.code1, m, s.max1[b]);
  s.q2[at] = quantize_unsigned(s.code2, v, s.max2[b]);
}

}  // namespace omni::adam8bit
