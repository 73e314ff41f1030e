// GELU, tanh form, for kernels and the emulated GEMM epilogue: ops::gelu_forward's formula,
// 0.5 x (1 + tanh(u)) written as x sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3), which
// needs one exp and stays finite (x / inf = 0) for large |x|.
#pragma once

#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN

OMNI_HD float gelu_tanh(float x) {
  constexpr float kTwoSqrt2OverPi = 1.5957691216057308f, kCubic = 0.044715f;
  return x / (1.0f + expf(-kTwoSqrt2OverPi * (x + kCubic * x * x * x)));
}

OMNI_GPU_NAMESPACE_END
