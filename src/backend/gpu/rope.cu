// Attention's helpers around the fused QKV projection: the split of Megatron's per-group
// interleaved QKV rows into q, k, v (and its inverse, the backward), and rotary position
// embedding (ops.h for the definitions; the CPU ops in backend/cpu/attention.cpp are the
// reference). All are memory-bound copies or element-wise rotations: one thread per 16-byte
// chunk when the head size and the pointers allow, per element otherwise.
#include <string>
#include <type_traits>

#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/vectorized.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kThreads = 256;

// One thread per chunk of V elements of the fused row (V divides head_dim, so a chunk never
// crosses a head). The fused row is [q_0 .. q_{hpg-1}, k, v] per group. Split copies fused ->
// parts, merge parts -> fused; the pointers written are the non-const ones.
template <typename T, int V, bool kMerge>
__global__ void qkv_permute_kernel(std::conditional_t<kMerge, T*, const T*> qkv,
                                   std::conditional_t<kMerge, const T*, T*> q,
                                   std::conditional_t<kMerge, const T*, T*> k,
                                   std::conditional_t<kMerge, const T*, T*> v, size_t total_chunks,
                                   int heads, int groups, int head_dim) {
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= total_chunks) return;
  const int hpg = heads / groups, group_w = (hpg + 2) * head_dim;
  const int row_chunks = groups * group_w / V;
  const size_t n = i / row_chunks;
  const int e = static_cast<int>(i % row_chunks) * V;  // element within the fused row
  const int g = e / group_w, r = e % group_w;
  auto part = q;
  if (r < hpg * head_dim) {
    part = q + (n * heads + g * hpg) * head_dim + r;
  } else if (r < (hpg + 1) * head_dim) {
    part = k + (n * groups + g) * head_dim + (r - hpg * head_dim);
  } else {
    part = v + (n * groups + g) * head_dim + (r - (hpg + 1) * head_dim);
  }
  const auto fused = qkv + n * (groups * group_w) + e;
  if constexpr (kMerge) {
    copy_elems<V>(fused, part);
  } else {
    copy_elems<V>(part, fused);
  }
}

// In place on x [N, nheads, head_dim]: x1 = x[i], x2 = x[i + half] rotate by angle sign *
// theta(pos, i), i < half = rotary_dim / 2 (non-interleaved halves, as Megatron and Hugging Face
// Llama); channels from rotary_dim on pass through (--rotary-percent). One thread per chunk of V
// pairs.
template <typename T, int V>
__global__ void rope_kernel(T* x, const float* cos, const float* sin, size_t total_chunks, int seq,
                            int nheads, int head_dim, int rotary_dim, const int32_t* positions,
                            float sign) {
  const size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= total_chunks) return;
  const int half = rotary_dim / 2, half_chunks = half / V;
  const size_t head = i / half_chunks;  // n * nheads + h
  const int c = static_cast<int>(i % half_chunks) * V;
  const size_t n = head / nheads;
  const size_t pos = positions ? static_cast<size_t>(positions[n]) : n % seq;
  float x1[V], x2[V], cs[V], sn[V];
  T* r = x + head * head_dim + c;
  load_floats(x1, r);
  load_floats(x2, r + half);
  load_floats(cs, cos + pos * half + c);
  load_floats(sn, sin + pos * half + c);
  OMNI_UNROLL
  for (int e = 0; e < V; ++e) {
    const float s = sign * sn[e];
    const float y1 = x1[e] * cs[e] - x2[e] * s;
    x2[e] = x2[e] * cs[e] + x1[e] * s;
    x1[e] = y1;
  }
  store_floats(r, x1);
  store_floats(r + half, x2);
}

template <bool kMerge, typename Fused, typename Part>
void qkv_permute(Fused* qkv, Part* q, Part* k, Part* v, const ops::AttentionDims& d,
                 Stream stream) {
  using T = std::remove_const_t<Fused>;
  const size_t N = static_cast<size_t>(d.batch) * d.seq;
  if (N == 0 || d.heads <= 0 || d.groups <= 0 || d.head_dim <= 0) return;
  if (d.heads % d.groups != 0)
    throw UsageError("[qkv_split/merge] heads = " + std::to_string(d.heads) +
                     " is not a multiple of groups = " + std::to_string(d.groups));
  constexpr int P = kPackWidth<T>;
  const bool packed = d.head_dim % P == 0 && aligned_to(16, qkv, q, k, v);
  const size_t elems = N * d.qkv_width();
  const auto s = static_cast<gpuStream_t>(stream);
  if (packed) {
    launch(qkv_permute_kernel<T, P, kMerge>, ceil_div(elems / P, kThreads), kThreads, 0, s, qkv, q,
           k, v, elems / P, d.heads, d.groups, d.head_dim);
  } else {
    launch(qkv_permute_kernel<T, 1, kMerge>, ceil_div(elems, kThreads), kThreads, 0, s, qkv, q, k,
           v, elems, d.heads, d.groups, d.head_dim);
  }
}

template <typename T>
void rope(T* x, const float* cos, const float* sin, int N, int seq, int nheads, int head_dim,
          int rotary_dim, const int32_t* positions, float sign, Stream stream) {
  if (rotary_dim == 0) rotary_dim = head_dim;
  if (rotary_dim % 2 != 0 || rotary_dim > head_dim)
    throw UsageError("[rope] rotary dimension " + std::to_string(rotary_dim) +
                     " must be even and at most the head dimension " + std::to_string(head_dim));
  const int half = rotary_dim / 2;
  if (N <= 0 || nheads <= 0 || half <= 0) return;
  constexpr int P = kPackWidth<T>;
  // Chunks of P pairs: half and head_dim multiples of P keep both halves of every head, and the
  // float tables' rows (half floats, P * 4 bytes a chunk), on 16-byte boundaries.
  const bool packed = half % P == 0 && head_dim % P == 0 && aligned_to(16, x, cos, sin);
  const size_t pairs = static_cast<size_t>(N) * nheads * half;
  const auto s = static_cast<gpuStream_t>(stream);
  if (packed) {
    launch(rope_kernel<T, P>, ceil_div(pairs / P, kThreads), kThreads, 0, s, x, cos, sin, pairs / P,
           seq, nheads, head_dim, rotary_dim, positions, sign);
  } else {
    launch(rope_kernel<T, 1>, ceil_div(pairs, kThreads), kThreads, 0, s, x, cos, sin, pairs, seq,
           nheads, head_dim, rotary_dim, positions, sign);
  }
}

}  // namespace

template <typename T>
void qkv_split(T* q, T* k, T* v, const T* qkv, const ops::AttentionDims& d, Stream stream) {
  qkv_permute<false>(qkv, q, k, v, d, stream);
}

template <typename T>
void qkv_merge(T* qkv, const T* q, const T* k, const T* v, const ops::AttentionDims& d,
               Stream stream) {
  qkv_permute<true>(qkv, q, k, v, d, stream);
}

template <typename T>
void rope_forward(T* x, const float* cos, const float* sin, int N, int seq, int nheads,
                  int head_dim, const int32_t* positions, int rotary_dim, Stream stream) {
  rope(x, cos, sin, N, seq, nheads, head_dim, rotary_dim, positions, 1.0f, stream);
}

// The Jacobian of a rotation is the rotation, so its transpose rotates by the negative angle.
template <typename T>
void rope_backward(T* dx, const float* cos, const float* sin, int N, int seq, int nheads,
                   int head_dim, const int32_t* positions, int rotary_dim, Stream stream) {
  rope(dx, cos, sin, N, seq, nheads, head_dim, rotary_dim, positions, -1.0f, stream);
}

#define OMNI_INSTANTIATE(T)                                                                        \
  template void qkv_split<T>(T*, T*, T*, const T*, const ops::AttentionDims&, Stream);             \
  template void qkv_merge<T>(T*, const T*, const T*, const T*, const ops::AttentionDims&, Stream); \
  template void rope_forward<T>(T*, const float*, const float*, int, int, int, int,                \
                                const int32_t*, int, Stream);                                      \
  template void rope_backward<T>(T*, const float*, const float*, int, int, int, int,               \
                                 const int32_t*, int, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
