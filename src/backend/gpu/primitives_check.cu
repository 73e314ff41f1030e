// See primitives_check.h.
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/primitives_check.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

__global__ void block_reduce_kernel(float* out, const float* x, int n) {
  __shared__ float scratch[kWarpSize];
  const float* row = x + size_t{blockIdx.x} * n;
  float s = 0.0f, m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += row[i], m = fmaxf(m, row[i]);
  s = block_sum(s, scratch);
  m = block_max(m, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = s, out[gridDim.x + blockIdx.x] = m;
}

// One warp loads the fragments exactly as the layout in gpu_runtime.h says and multiplies.
template <typename T>
__global__ void mma_kernel(float* c, const T* a, const T* b) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  if constexpr (kHasMma16816) {
    uint32_t fa[4], fb[2];
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
      fa[r] = pack2(a[row * 16 + col], a[row * 16 + col + 1]);
    }
    for (int r = 0; r < 2; ++r) {
      const int k = 2 * t + 8 * r;
      fb[r] = pack2(b[k * 8 + g], b[(k + 1) * 8 + g]);
    }
    float fc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_16x8x16<T>(fc, fa, fb);
    for (int i = 0; i < 4; ++i) c[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = fc[i];
  }
}

}  // namespace

void block_reduce_check(float* out, const float* x, int blocks, int n, int threads) {
  threads = (threads + kWarpSize - 1) / kWarpSize * kWarpSize;  // whole warps (64 on CDNA)
  launch(block_reduce_kernel, blocks, threads, 0, nullptr, out, x, n);
  synchronize();
}

template <typename T>
bool mma_16x8x16_check(float* c, const T* a, const T* b) {
  if (!kHasMma16816) return false;
  launch(mma_kernel<T>, 1, 32, 0, nullptr, c, a, b);
  synchronize();
  return true;
}
template bool mma_16x8x16_check<bf16>(float*, const bf16*, const bf16*);
template bool mma_16x8x16_check<f16>(float*, const f16*, const f16*);

OMNI_GPU_NAMESPACE_END
