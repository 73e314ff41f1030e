// Element-wise ops: conversions, sums, GELU and SwiGLU (ops.h for their definitions).
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kThreads = 256;

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, size_t n) {
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = from_float<D>(to_float(src[i]));
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, size_t n) {
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

}  // namespace

template <typename T>
void convert_from_float(T* dst, const float* src, size_t n, Stream stream) {
  launch(convert_kernel<T, float>, ceil_div(n, kThreads), kThreads, 0,
         static_cast<gpuStream_t>(stream), dst, src, n);
}

template <typename T>
void convert_to_float(float* dst, const T* src, size_t n, Stream stream) {
  launch(convert_kernel<float, T>, ceil_div(n, kThreads), kThreads, 0,
         static_cast<gpuStream_t>(stream), dst, src, n);
}

template <typename T>
void add(T* out, const T* a, const T* b, size_t n, Stream stream) {
  launch(add_kernel<T>, ceil_div(n, kThreads), kThreads, 0, static_cast<gpuStream_t>(stream),
         out, a, b, n);
}

#define OMNI_INSTANTIATE(T)                                                      \
  template void convert_from_float<T>(T*, const float*, size_t, Stream);         \
  template void convert_to_float<T>(float*, const T*, size_t, Stream);           \
  template void add<T>(T*, const T*, const T*, size_t, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
