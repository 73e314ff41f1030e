// Vectorised global-memory access for kernels: V consecutive elements of T moved as 16-byte
// packs (one 128-bit load or store each) and converted to or from float registers. The
// caller checks alignment on the host (aligned16) and picks V = kPackElems<T> or 1.
#pragma once

#include <cstdint>

#include "backend/gpu/gpu_runtime.h"

// Full unrolling of loops over a thread's registers (arrays indexed by the loop counter stay
// in registers only when every index is a constant).
#if defined(OMNITRON_GPU_EMULATE)
#define OMNI_UNROLL
#else
#define OMNI_UNROLL _Pragma("unroll")
#endif

OMNI_GPU_NAMESPACE_BEGIN

// Elements of T in one 16-byte pack: 4 floats, 8 bf16 or f16.
template <typename T>
constexpr int kPackElems = static_cast<int>(16 / sizeof(T));

template <typename T>
struct alignas(16) Pack16 {
  T v[kPackElems<T>];
};

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// dst[0..V) = float(p[0..V)); p is 16-byte aligned unless V == 1.
template <int V, typename T>
OMNI_DEVICE void load_floats(float (&dst)[V], const T* p) {
  constexpr int P = kPackElems<T>;
  static_assert(V == 1 || V % P == 0, "a vector access is whole 16-byte packs");
  if constexpr (V == 1) {
    dst[0] = to_float(p[0]);
  } else {
    OMNI_UNROLL
    for (int i = 0; i < V / P; ++i) {
      const Pack16<T> pk = reinterpret_cast<const Pack16<T>*>(p)[i];
      OMNI_UNROLL
      for (int e = 0; e < P; ++e) dst[i * P + e] = to_float(pk.v[e]);
    }
  }
}

// p[0..V) = T(src[0..V)), rounded to nearest even.
template <int V, typename T>
OMNI_DEVICE void store_floats(T* p, const float (&src)[V]) {
  constexpr int P = kPackElems<T>;
  static_assert(V == 1 || V % P == 0, "a vector access is whole 16-byte packs");
  if constexpr (V == 1) {
    p[0] = from_float<T>(src[0]);
  } else {
    OMNI_UNROLL
    for (int i = 0; i < V / P; ++i) {
      Pack16<T> pk;
      OMNI_UNROLL
      for (int e = 0; e < P; ++e) pk.v[e] = from_float<T>(src[i * P + e]);
      reinterpret_cast<Pack16<T>*>(p)[i] = pk;
    }
  }
}

// dst[0..V) = src[0..V), bits unchanged (no round trip through float).
template <int V, typename T>
OMNI_DEVICE void copy_elems(T* dst, const T* src) {
  constexpr int P = kPackElems<T>;
  static_assert(V == 1 || V % P == 0, "a vector access is whole 16-byte packs");
  if constexpr (V == 1) {
    dst[0] = src[0];
  } else {
    OMNI_UNROLL
    for (int i = 0; i < V / P; ++i)
      reinterpret_cast<Pack16<T>*>(dst)[i] = reinterpret_cast<const Pack16<T>*>(src)[i];
  }
}

OMNI_GPU_NAMESPACE_END
