// Vectorised access and launch shapes shared by the memory-bound kernels (element-wise,
// embeddings, optimizer): 16-byte packs of T where the pointers' alignment and the sizes
// allow, grid-stride loops over a capped grid. Included only by backend/gpu/*.cu.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN

// V consecutive elements moved as one load or store (16 bytes for V = 16 / sizeof(T): one
// LDG.128 on NVIDIA, global_load_dwordx4 on CDNA).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T>
constexpr int kPackWidth = static_cast<int>(16 / sizeof(T));

template <int V, typename T>
OMNI_DEVICE Pack<std::remove_const_t<T>, V> load_pack(T* p, size_t pack_index) {
  return reinterpret_cast<const Pack<std::remove_const_t<T>, V>*>(p)[pack_index];
}
template <int V, typename T>
OMNI_DEVICE void store_pack(T* p, size_t pack_index, const Pack<T, V>& x) {
  reinterpret_cast<Pack<T, V>*>(p)[pack_index] = x;
}

// dst[0..V) = float(p[0..V)); p is 16-byte aligned unless V == 1.
template <int V, typename T>
OMNI_DEVICE void load_floats(float (&dst)[V], const T* p) {
  constexpr int P = kPackWidth<T>;
  static_assert(V == 1 || V % P == 0, "a vector access is whole 16-byte packs");
  if constexpr (V == 1) {
    dst[0] = to_float(p[0]);
  } else {
    OMNI_UNROLL
    for (int i = 0; i < V / P; ++i) {
      const Pack<T, P> pk = reinterpret_cast<const Pack<T, P>*>(p)[i];
      OMNI_UNROLL
      for (int e = 0; e < P; ++e) dst[i * P + e] = to_float(pk.v[e]);
    }
  }
}

// p[0..V) = T(src[0..V)), rounded to nearest even.
template <int V, typename T>
OMNI_DEVICE void store_floats(T* p, const float (&src)[V]) {
  constexpr int P = kPackWidth<T>;
  static_assert(V == 1 || V % P == 0, "a vector access is whole 16-byte packs");
  if constexpr (V == 1) {
    p[0] = from_float<T>(src[0]);
  } else {
    OMNI_UNROLL
    for (int i = 0; i < V / P; ++i) {
      Pack<T, P> pk;
      OMNI_UNROLL
      for (int e = 0; e < P; ++e) pk.v[e] = from_float<T>(src[i * P + e]);
      reinterpret_cast<Pack<T, P>*>(p)[i] = pk;
    }
  }
}

// dst[0..V) = src[0..V), bits unchanged (no round trip through float).
template <int V, typename T>
OMNI_DEVICE void copy_elems(T* dst, const T* src) {
  constexpr int P = kPackWidth<T>;
  static_assert(V == 1 || V % P == 0, "a vector access is whole 16-byte packs");
  if constexpr (V == 1) {
    dst[0] = src[0];
  } else {
    OMNI_UNROLL
    for (int i = 0; i < V / P; ++i)
      reinterpret_cast<Pack<T, P>*>(dst)[i] = reinterpret_cast<const Pack<T, P>*>(src)[i];
  }
}

// True when every pointer may be read as packs of `bytes` (null pointers pass: unused inputs).
template <typename... P>
inline bool aligned_to(size_t bytes, const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % bytes == 0) && ...);
}

constexpr unsigned kThreads = 256;
// Grids stay at most this many blocks and loop (grid-stride) over the rest: enough to fill an
// H100 (132 SMs) or MI300X (304 CUs) several times over. The emulator gets a handful, so the
// tests go through the grid-stride loops at small sizes.
#if defined(OMNITRON_GPU_EMULATE)
constexpr unsigned kMaxBlocks = 3;
#else
constexpr unsigned kMaxBlocks = 4096;
#endif

// A one-dimensional grid for `items` work items of one thread each.
inline unsigned grid_for(size_t items) {
  return std::min<size_t>(ceil_div(items, kThreads), kMaxBlocks);
}

// Row kernels: x over `cols` column packs (thread per pack), y over rows (grid-stride).
// Narrow rows get narrower blocks instead of idle threads.
struct RowsShape {
  dim3 grid, block;
};
inline RowsShape rows_shape(int rows, int cols) {
  if (rows <= 0 || cols <= 0) return {dim3(0), dim3(1)};
  const unsigned threads =
      std::min<unsigned>(kThreads, (static_cast<unsigned>(cols) + 63) / 64 * 64);
  const unsigned gx = std::min(ceil_div(static_cast<size_t>(cols), threads), kMaxBlocks);
  const unsigned gy =
      std::min<unsigned>({static_cast<unsigned>(rows), std::max(1u, kMaxBlocks / gx), 65535u});
  return {dim3(gx, gy), dim3(threads)};
}

OMNI_GPU_NAMESPACE_END
