// GELU in both of Megatron's forms (GeluForm), for kernels and the emulated GEMM
// epilogue, with the formulas of backend/cpu/activation.cpp:
//  - tanh (--openai-gelu, cuBLASLt's epilogue): 0.5 x (1 + tanh(u)) written as x sigmoid(2u)
//    with u = sqrt(2/pi) (x + 0.044715 x^3), one exp, finite (x / inf = 0) for large |x|;
//  - erf (Megatron's default): x Phi(x) with Phi(x) = 0.5 erfc(-x / sqrt 2), accurate for
//    negative x where 1 + erf(x / sqrt 2) cancels.
#pragma once

#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN

namespace gelu_constants {
constexpr float kTwoSqrt2OverPi = 1.5957691216057308f, kCubic = 0.044715f;
constexpr float kSqrtHalf = 0.7071067811865476f, kInvSqrt2Pi = 0.3989422804014327f;
}  // namespace gelu_constants

OMNI_HD float gelu_tanh(float x) {
  using namespace gelu_constants;
  return x / (1.0f + expf(-kTwoSqrt2OverPi * (x + kCubic * x * x * x)));
}

// d/dx [x sig(2u)] = sig + x sig (1 - sig) 2u'.
OMNI_HD float gelu_tanh_derivative(float x) {
  using namespace gelu_constants;
  const float sig = 1.0f / (1.0f + expf(-kTwoSqrt2OverPi * (x + kCubic * x * x * x)));
  const float du2 = kTwoSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return sig + x * sig * (1.0f - sig) * du2;
}

OMNI_HD float gelu_erf(float x) {
  return x * 0.5f * erfcf(-x * gelu_constants::kSqrtHalf);
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density.
OMNI_HD float gelu_erf_derivative(float x) {
  using namespace gelu_constants;
  return 0.5f * erfcf(-x * kSqrtHalf) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
}

OMNI_GPU_NAMESPACE_END
