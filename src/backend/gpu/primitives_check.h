// Kernels that exercise the portability header's building blocks on their own (block
// reductions, warp shuffles, the tensor-core fragment layout), so a first run on a new GPU or
// toolchain tells which primitive is wrong before any op built on them is blamed.
#pragma once

#include "backend/gpu/gpu_types.h"

OMNI_GPU_NAMESPACE_BEGIN

// out[b] = sum of x[b*n .. b*n+n) and out[blocks + b] = their maximum, one block of `threads`
// threads per row (block_sum / block_max).
void block_reduce_check(float* out, const float* x, int blocks, int n, int threads);
// c[16x8] = a[16x16] b[16x8] (row-major, device memory) by one warp through mma_16x8x16<T>.
// Returns false (and does nothing) where the build has no such instruction.
template <typename T>
bool mma_16x8x16_check(float* c, const T* a, const T* b);

OMNI_GPU_NAMESPACE_END
