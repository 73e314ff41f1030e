// Small ops of the model's seam (backend/gpu_backend.h) that no other kernel file holds:
// ops::attention_merge, attention over two blocks of keys merged from each block's output and
// log-sum-exp (ring attention), one thread per (sequence, head, row); and scale.
#include <cmath>

#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void attention_merge_kernel(T* out, float* lse, const T* block_out,
                                       const float* block_lse, int batch, int seq, int heads,
                                       int head_dim) {
  const size_t row = size_t{blockIdx.x} * blockDim.x + threadIdx.x;  // (b * heads + h) * seq + i
  if (row >= static_cast<size_t>(batch) * heads * seq) return;
  const float lb = block_lse[row], lm = lse[row];
  if (lb == -INFINITY) return;
  const int i = static_cast<int>(row % seq), h = static_cast<int>(row / seq % heads);
  const int b = static_cast<int>(row / (static_cast<size_t>(seq) * heads));
  const float m = fmaxf(lb, lm), total = m + logf(expf(lm - m) + expf(lb - m));
  const float keep = expf(lm - total), add = expf(lb - total);
  const size_t at =
      (static_cast<size_t>(b) * seq + i) * heads * head_dim + static_cast<size_t>(h) * head_dim;
  for (int c = 0; c < head_dim; ++c)
    out[at + c] = from_float<T>(to_float(out[at + c]) * keep + to_float(block_out[at + c]) * add);
  lse[row] = total;
}

template <typename T>
__global__ void scale_kernel(T* x, float s, size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = from_float<T>(to_float(x[i]) * s);
}

}  // namespace

template <typename T>
void scale(T* x, float s, size_t n, Stream stream) {
  const unsigned blocks = ceil_div(n, kThreads) < 4096u ? ceil_div(n, kThreads) : 4096u;
  launch(scale_kernel<T>, blocks, kThreads, 0, static_cast<gpuStream_t>(stream), x, s, n);
}

template <typename T>
void attention_merge(T* out, float* lse, const T* block_out, const float* block_lse,
                     const ops::AttentionDims& d, Stream stream) {
  const size_t rows = static_cast<size_t>(d.batch) * d.heads * d.seq;
  launch(attention_merge_kernel<T>, ceil_div(rows, kThreads), kThreads, 0,
         static_cast<gpuStream_t>(stream), out, lse, block_out, block_lse, d.batch, d.seq, d.heads,
         d.v_dim());
}

#define OMNI_INSTANTIATE(T)                                                                       \
  template void attention_merge<T>(T*, float*, const T*, const float*, const ops::AttentionDims&, \
                                   Stream);                                                       \
  template void scale<T>(T*, float, size_t, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
