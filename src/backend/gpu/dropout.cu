// ops::dropout on the device: hidden dropout in place, the masks of backend/dropout_mask.h
// (the CPU's, bit for bit). One thread per four consecutive columns of a row, which with a
// width divisible by four is one Philox block.
#include "backend/dropout_mask.h"
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void dropout_kernel(T* x, int rows, int width, int seq, ops::DropoutKey k, float scale) {
  const int quads = (width + 3) / 4;
  const size_t t = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= static_cast<size_t>(rows) * quads) return;
  const int r = static_cast<int>(t / quads), c0 = static_cast<int>(t % quads) * 4;
  const int64_t n = k.first_row + r;
  const int64_t sample = k.first_sample + n / seq;
  const int64_t pos = dropout::sequence_position(static_cast<int>(n % seq), seq, k.cp, k.cp_rank);
  T* row = x + static_cast<size_t>(r) * width;
  dropout::Block blk{};
  uint64_t loaded = ~uint64_t{0};
  for (int c = c0; c < c0 + 4 && c < width; ++c) {
    const uint64_t e = static_cast<uint64_t>(pos) * static_cast<uint64_t>(width) + c;
    if ((e >> 2) != loaded) loaded = e >> 2, blk = dropout::block(k, sample, loaded);
    row[c] =
        blk.w[e & 3] >= k.threshold ? from_float<T>(to_float(row[c]) * scale) : from_float<T>(0.0f);
  }
}

}  // namespace

template <typename T>
void dropout(T* x, int rows, int width, int seq, const ops::DropoutKey& k, Stream stream) {
  if (!k.active() || rows == 0) return;
  const size_t threads = static_cast<size_t>(rows) * ((width + 3) / 4);
  launch(dropout_kernel<T>, ceil_div(threads, kThreads), kThreads, 0,
         static_cast<gpuStream_t>(stream), x, rows, width, seq, k, static_cast<float>(k.scale()));
}

#define OMNI_INSTANTIATE(T) \
  template void dropout<T>(T*, int, int, int, const ops::DropoutKey&, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
