// adam8bit's step on the GPU (optim/zoo_adam8bit.cpp says what it computes and cites
// bitsandbytes): the per-element arithmetic of backend/zoo_adam8bit_math.h, in two passes over
// the rank's elements so that no fp32 copy of the moments is kept. Pass 0 dequantises each
// element's moments, updates them and raises its block's new absolute maximum (an integer
// atomic max on the float's bits: the maxima are non-negative, so their bits order as they
// do); pass 1 recomputes the same moments (the same operations on the same inputs), steps the
// weight and quantises the moments against the new maxima. Between them the caller reduces
// the maxima over the ranks that hold other parts of a block.
#include <cstring>

#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/vectorized.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

OMNI_DEVICE int float_bits(float x) {
#if defined(OMNITRON_GPU_EMULATE)
  int i;
  std::memcpy(&i, &x, sizeof i);
  return i;
#else
  return __float_as_int(x);
#endif
}

// The run holding launch element e: the last whose first is <= e.
OMNI_DEVICE const adam8bit::Run& run_of(const adam8bit::Step& s, int64_t e) {
  int64_t lo = 0, hi = s.run_count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (s.runs[mid].first <= e)
      lo = mid;
    else
      hi = mid - 1;
  }
  return s.runs[lo];
}

__global__ void adam8bit_kernel(adam8bit::Step s) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < size_t(s.n); i += stride) {
    const int64_t e = int64_t(i);
    const adam8bit::Run& r = run_of(s, e);
    adam8bit::step_element(s, s.w, s.g, r, e - r.first, [&](int64_t b, float am, float av) {
      atomicMax(reinterpret_cast<int*>(s.max1 + b), float_bits(am));
      atomicMax(reinterpret_cast<int*>(s.max2 + b), float_bits(av));
    });
  }
}

}  // namespace

void adam8bit_update(const adam8bit::Step& step, Stream stream) {
  if (step.n == 0) return;
  launch(adam8bit_kernel, grid_for(size_t(step.n)), kThreads, 0, static_cast<gpuStream_t>(stream),
         step);
}

OMNI_GPU_NAMESPACE_END
