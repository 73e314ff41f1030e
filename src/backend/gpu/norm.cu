// LayerNorm and RMSNorm, forward and backward (ops.h for the definitions; the CPU ops in
// backend/cpu/norm.cpp are the reference).
//
// A row is handled by one block of B threads (B a multiple of the warp size; a single warp
// for small rows, so the reductions are shuffles only). Thread t owns the row's 16-byte chunks
// t, t + B, ..., at most K of them, and keeps them in registers: the forward reads x once and
// makes its two passes (mean, then the centred variance, as the CPU op) over registers.
//
// Backward, per row: dx += rstd (g w - mean(g w) - xhat mean(g w xhat)) (RMSNorm drops the
// mean(g w) term), xhat = (x - mean) rstd from the saved statistics. The parameter gradients
// dw = sum_rows g xhat and db = sum_rows g are summed without atomics: a block walks a fixed
// set of rows (blockIdx.x, + gridDim.x, ...), each thread accumulating its own columns in
// registers, writes its partial sums to scratch, and a second kernel adds the blocks' partials
// in block order. The grid size depends only on N and C, so the bits are the same on every
// run and on every device.
#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/vectorized.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

// At most 512 threads a row (launch bounds that leave 128 registers a thread for the chunks
// kept in registers), then more chunks per thread, up to 64 elements a thread (rows of up to
// 32768 elements when packed, 16384 per element): more would only spill, and each doubling
// doubles the unrolled code every compiler (nvcc, hipcc, the emulator's) has to build.
constexpr int kMaxThreads = 512;
template <int V>
constexpr int kMaxChunksPerThread = std::min(32, 64 / V);
// Backward: a block sums at least this many rows before writing C partials, so the partials
// cost at most ~1/8 of the pass's traffic; and about this many threads in flight fill an H100
// (132 SMs x 2048).
constexpr int kMinRowsPerBlock = 8;
constexpr int kTargetThreads = 1 << 18;
constexpr int kFinalizeThreads = 256;

// Sum over the block's threads, returned to all; one warp needs no shared memory or barrier.
OMNI_DEVICE float row_sum(float v, float* red) {
  return blockDim.x == kWarpSize ? warp_sum(v) : block_sum(v, red);
}

// Two sums at once (the backward's), with one pair of barriers; red holds 2 * kWarpSize floats.
OMNI_DEVICE void row_sum2(float& a, float& b, float* red) {
  a = warp_sum(a);
  b = warp_sum(b);
  if (blockDim.x == kWarpSize) return;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  if (lane == 0) red[warp] = a, red[kWarpSize + warp] = b;
  __syncthreads();
  a = warp_sum(lane < warps ? red[lane] : 0.0f);
  b = warp_sum(lane < warps ? red[kWarpSize + lane] : 0.0f);
  __syncthreads();
}

// One row per block. V elements per chunk (V divides C), K chunks per thread at most.
template <typename T, int V, int K, bool kLayerNorm>
__global__ void __launch_bounds__(kMaxThreads)
    norm_forward_kernel(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int C,
                        float inv_c, float eps) {
  __shared__ float red[kWarpSize];
  const int chunks = C / V;
  const size_t row = blockIdx.x;
  const T* xr = x + row * C;
  float xs[K][V];
  float s = 0.0f;  // LayerNorm: sum x; RMSNorm: sum x^2
  OMNI_UNROLL
  for (int k = 0; k < K; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < chunks) {
      load_floats(xs[k], xr + j * V);
    } else {
      OMNI_UNROLL
      for (int v = 0; v < V; ++v) xs[k][v] = 0.0f;
    }
    OMNI_UNROLL
    for (int v = 0; v < V; ++v) s += kLayerNorm ? xs[k][v] : xs[k][v] * xs[k][v];
  }
  float m = 0.0f;
  if constexpr (kLayerNorm) {
    // Centred second pass over the registers: no cancellation of E[x^2] - E[x]^2.
    m = row_sum(s, red) * inv_c;
    s = 0.0f;
    OMNI_UNROLL
    for (int k = 0; k < K; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j >= chunks) continue;
      OMNI_UNROLL
      for (int v = 0; v < V; ++v) s += (xs[k][v] - m) * (xs[k][v] - m);
    }
  }
  const float rs = rsqrtf(row_sum(s, red) * inv_c + eps);
  OMNI_UNROLL
  for (int k = 0; k < K; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j >= chunks) continue;
    float wv[V], y[V];
    load_floats(wv, w + j * V);
    OMNI_UNROLL
    for (int v = 0; v < V; ++v) y[v] = (xs[k][v] - m) * rs * wv[v];
    if (kLayerNorm && b) {
      float bv[V];
      load_floats(bv, b + j * V);
      OMNI_UNROLL
      for (int v = 0; v < V; ++v) y[v] += bv[v];
    }
    store_floats(out + row * C + j * V, y);
  }
  if (threadIdx.x == 0) {
    if constexpr (kLayerNorm) mean[row] = m;
    rstd[row] = rs;
  }
}

// Rows blockIdx.x, + gridDim.x, ...: dx += per row; this block's dw (and db) partial sums go
// to partial[blockIdx.x * width + c] (db at + C).
template <typename T, int V, int K, bool kLayerNorm>
__global__ void __launch_bounds__(kMaxThreads)
    norm_backward_kernel(T* dx, float* partial, const T* dout, const T* x, const T* w,
                         const float* mean, const float* rstd, int N, int C, int width, float inv_c,
                         bool with_db) {
  __shared__ float red[2 * kWarpSize];
  const int chunks = C / V;
  float dw_acc[K][V] = {}, db_acc[K][V] = {};
  float gw[K][V] = {}, xhat[K][V] = {};  // this row's g w and xhat, kept for the dx pass
  for (int n = blockIdx.x; n < N; n += gridDim.x) {
    const size_t off = static_cast<size_t>(n) * C;
    const float m = kLayerNorm ? mean[n] : 0.0f, rs = rstd[n];
    float sum_gw = 0.0f, sum_gwx = 0.0f;
    OMNI_UNROLL
    for (int k = 0; k < K; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j >= chunks) continue;
      float g[V], xv[V], wv[V];
      load_floats(g, dout + off + j * V);
      load_floats(xv, x + off + j * V);
      load_floats(wv, w + j * V);
      OMNI_UNROLL
      for (int v = 0; v < V; ++v) {
        xhat[k][v] = (xv[v] - m) * rs;
        gw[k][v] = g[v] * wv[v];
        sum_gw += gw[k][v];
        sum_gwx += gw[k][v] * xhat[k][v];
        dw_acc[k][v] += g[v] * xhat[k][v];
        if constexpr (kLayerNorm) db_acc[k][v] += g[v];
      }
    }
    row_sum2(sum_gw, sum_gwx, red);
    const float mean_gw = kLayerNorm ? sum_gw * inv_c : 0.0f, mean_gwx = sum_gwx * inv_c;
    OMNI_UNROLL
    for (int k = 0; k < K; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j >= chunks) continue;
      float d[V];
      load_floats(d, dx + off + j * V);
      OMNI_UNROLL
      for (int v = 0; v < V; ++v) d[v] += rs * (gw[k][v] - mean_gw - xhat[k][v] * mean_gwx);
      store_floats(dx + off + j * V, d);
    }
  }
  float* p = partial + static_cast<size_t>(blockIdx.x) * width;
  OMNI_UNROLL
  for (int k = 0; k < K; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j >= chunks) continue;
    store_floats(p + j * V, dw_acc[k]);
    if (kLayerNorm && with_db) store_floats(p + C + j * V, db_acc[k]);
  }
}

// dw[c] += sum_p partial[p][c] (columns c >= C go to db[c - C]), p in a fixed order: each
// block takes kWarpSize columns (coalesced rows of partials), its warps sum interleaved
// subsets of the partials, and warp 0 adds the warps' sums in warp order.
__global__ void __launch_bounds__(kFinalizeThreads)
    add_partials_kernel(float* dw, float* db, const float* partial, int blocks, int C, int width) {
  __shared__ float sums[kFinalizeThreads];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int c = blockIdx.x * kWarpSize + lane;
  float s = 0.0f;
  if (c < width)
    for (int p = warp; p < blocks; p += warps) s += partial[static_cast<size_t>(p) * width + c];
  sums[threadIdx.x] = s;
  __syncthreads();
  if (warp != 0 || c >= width) return;
  for (int i = 1; i < warps; ++i) s += sums[i * kWarpSize + lane];
  if (c < C) {
    dw[c] += s;
  } else {
    db[c - C] += s;
  }
}

// How a row is spread over a block: V elements per chunk, at most K chunks per thread.
struct RowPlan {
  bool packed;  // V = kPackWidth<T> (else 1)
  int chunks_per_thread;
  int threads;
};

template <typename T>
RowPlan plan_row(const char* op, int C, bool aligned) {
  RowPlan plan{aligned && C % kPackWidth<T> == 0, 1, 0};
  const int chunks = plan.packed ? C / kPackWidth<T> : C;
  const int max_chunks =
      plan.packed ? kMaxChunksPerThread<kPackWidth<T>> : kMaxChunksPerThread<1>;
  while (plan.chunks_per_thread < max_chunks &&
         ceil_div(chunks, plan.chunks_per_thread) > kMaxThreads)
    plan.chunks_per_thread *= 2;
  plan.threads =
      static_cast<int>(ceil_div(ceil_div(chunks, plan.chunks_per_thread), kWarpSize)) * kWarpSize;
  if (plan.threads > kMaxThreads)
    throw UsageError(std::string("[") + op + "] rows of C = " + std::to_string(C) +
                     " elements are too long for the GPU kernel (at most " +
                     std::to_string(kMaxThreads * max_chunks * (plan.packed ? kPackWidth<T> : 1)) +
                     (plan.packed ? "" : " when a pointer or C is not 16-byte aligned") + ")");
  return plan;
}

// Calls f(integral_constant V, integral_constant K) for K = k, a power of two up to V's most.
template <int V, int K = 1, typename F>
void with_chunks(int k, F&& f) {
  if constexpr (K < kMaxChunksPerThread<V>) {
    if (k > K) return with_chunks<V, 2 * K>(k, f);
  }
  f(std::integral_constant<int, V>{}, std::integral_constant<int, K>{});
}

// Calls f(integral_constant V, integral_constant K) for the plan's template arguments.
template <typename T, typename F>
void with_plan(const RowPlan& plan, F&& f) {
  if (plan.packed) {
    with_chunks<kPackWidth<T>>(plan.chunks_per_thread, f);
  } else {
    with_chunks<1>(plan.chunks_per_thread, f);
  }
}

template <bool kLayerNorm, typename T>
void norm_forward(const char* op, T* out, float* mean, float* rstd, const T* x, const T* w,
                  const T* b, int N, int C, float eps, Stream stream) {
  if (N <= 0 || C <= 0) return;
  const bool aligned = aligned_to(16, out, x, w, b);
  const RowPlan plan = plan_row<T>(op, C, aligned);
  with_plan<T>(plan, [&](auto vec, auto k) {
    launch(norm_forward_kernel<T, decltype(vec)::value, decltype(k)::value, kLayerNorm>,
           static_cast<unsigned>(N), plan.threads, 0, static_cast<gpuStream_t>(stream), out, mean,
           rstd, x, w, b, C, 1.0f / static_cast<float>(C), eps);
  });
}

template <bool kLayerNorm, typename T>
void norm_backward(const char* op, T* dx, float* dw, float* db, const T* dout, const T* x,
                   const T* w, const float* mean, const float* rstd, int N, int C, Stream stream) {
  if (N <= 0 || C <= 0) return;
  const bool aligned = aligned_to(16, dx, dout, x, w);
  const RowPlan plan = plan_row<T>(op, C, aligned);
  const int blocks = static_cast<int>(
      std::min<size_t>(ceil_div(N, kMinRowsPerBlock), std::max(1, kTargetThreads / plan.threads)));
  const int width = db ? 2 * C : C;
  auto* partial = static_cast<float*>(scratch(sizeof(float) * blocks * width));
  const auto s = static_cast<gpuStream_t>(stream);
  with_plan<T>(plan, [&](auto vec, auto k) {
    launch(norm_backward_kernel<T, decltype(vec)::value, decltype(k)::value, kLayerNorm>, blocks,
           plan.threads, 0, s, dx, partial, dout, x, w, mean, rstd, N, C, width,
           1.0f / static_cast<float>(C), db != nullptr);
  });
  launch(add_partials_kernel, ceil_div(width, kWarpSize), kFinalizeThreads, 0, s, dw, db, partial,
         blocks, C, width);
}

}  // namespace

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int N,
                       int C, float eps, Stream stream) {
  norm_forward<true>("layernorm_forward", out, mean, rstd, x, w, b, N, C, eps, stream);
}

template <typename T>
void layernorm_backward(T* dx, float* dw, float* db, const T* dout, const T* x, const T* w,
                        const float* mean, const float* rstd, int N, int C, Stream stream) {
  norm_backward<true>("layernorm_backward", dx, dw, db, dout, x, w, mean, rstd, N, C, stream);
}

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int N, int C, float eps,
                     Stream stream) {
  norm_forward<false>("rmsnorm_forward", out, nullptr, rstd, x, w, static_cast<const T*>(nullptr),
                      N, C, eps, stream);
}

template <typename T>
void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w, const float* rstd,
                      int N, int C, Stream stream) {
  norm_backward<false>("rmsnorm_backward", dx, dw, nullptr, dout, x, w, nullptr, rstd, N, C,
                       stream);
}

#define OMNI_INSTANTIATE(T)                                                                      \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int, int, \
                                     float, Stream);                                             \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const T*,          \
                                      const float*, const float*, int, int, Stream);             \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int, int, float, Stream);     \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*, int, \
                                    int, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
