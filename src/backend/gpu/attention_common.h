// Shared by attention_forward.cu and attention_backward.cu (flash attention, gpu_ops.h): the
// visible key range of a query row, shape checks, the scalar tile geometry and the tile
// loaders and fragment helpers of the tensor-core path.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>

#include "backend/dropout_mask.h"
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace attention {

// log2(e): scores are pre-multiplied by scale * log2(e) so the softmax uses exp2 (one
// instruction on the GPU) instead of exp; lse is converted back to natural log at the end.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

OMNI_HD int imin(int a, int b) {
  return a < b ? a : b;
}
OMNI_HD int imax(int a, int b) {
  return a > b ? a : b;
}

// Keys row i of sequence b may see: [first, last], empty when last < first. Rows past the
// sequence (tile padding) see nothing.
struct KeyRange {
  int first, last;
};
OMNI_DEVICE KeyRange key_range(const ops::AttentionDims& d, int b, int i) {
  if (i >= d.seq) return {d.seq, -1};
  const size_t n = static_cast<size_t>(b) * d.seq + i;
  int first = d.key_start ? d.key_start[n] : 0;
  int last = d.q_index ? d.q_index[n] : i;
  first = first < 0 ? 0 : first;
  last = last >= d.seq ? d.seq - 1 : last;
  return {first, last};
}

// Attention dropout's factor for probability (sequence b, local head h, query row i, key j):
// `scale` (1/(1-p)) where the mask keeps it, else 0; the CPU's mask (backend/dropout_mask.h),
// drawn again in the backward.
OMNI_DEVICE float dropout_factor(const ops::AttentionDims& d, int b, int h, int i, int j,
                                 float scale) {
  const uint64_t e = dropout::attention_element(d.dropout, d.seq, h, i, j);
  return dropout::keep(d.dropout, d.dropout.first_sample + b, e) ? scale : 0.0f;
}

// Grids are (heads, batch, query tiles): blocks start in that order, so the first row of a
// block's tile counts down from the last tile: causal rows late in the sequence see the most
// keys, and the longest blocks of every head start first, the short ones filling the tail.
OMNI_DEVICE int last_tile_first(int rows) {
  return static_cast<int>(gridDim.z - 1 - blockIdx.z) * rows;
}

inline void check_dims(const ops::AttentionDims& d, const char* op) {
  if (d.batch < 0 || d.seq < 0 || d.heads <= 0 || d.groups <= 0 || d.heads % d.groups != 0 ||
      d.head_dim <= 0 || d.head_dim > 256)
    throw std::invalid_argument(
        std::string("[") + op + "] unsupported shape: batch " + std::to_string(d.batch) + ", seq " +
        std::to_string(d.seq) + ", heads " + std::to_string(d.heads) + ", groups " +
        std::to_string(d.groups) + ", head_dim " + std::to_string(d.head_dim) +
        " (heads a multiple of groups, head_dim 1..256)");
}

// The scalar (FMA) kernels: float tiles in shared memory, four threads per tile row, each
// owning every fourth column; rows of 32 (16 for head_dim above 128, so the tiles fit the
// 64 KB of AMD's LDS). MaxHD bounds head_dim so per-thread accumulators live in registers.
template <int MaxHD>
struct ScalarTile {
  static constexpr int kRows = MaxHD <= 128 ? 32 : 16;  // query rows and keys per tile
  static constexpr int kSub = 4;                        // threads per tile row
  static constexpr int kThreads = kRows * kSub;
  static constexpr int kCols = kRows / kSub;  // score columns per thread
  static constexpr int kDims = MaxHD / kSub;  // head dims per thread
};

// Dispatch on the head-dim bound of the scalar kernels.
template <typename F>
void with_max_head_dim(int hd, F&& f) {
  if (hd <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (hd <= 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    f(std::integral_constant<int, 256>{});
  }
}

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    OMNI_GPU_CHECK(
        gpuFuncSetAttribute(kernel, gpuFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// ---- Tensor-core path helpers -----------------------------------------------------------------
// Bit moves between memories: plain typed accesses on the GPU (one ld/st of 32 or 128 bits),
// memcpy in the emulator (no aliasing questions for the host compiler).
struct alignas(16) Vec16 {
  uint32_t w[4];
};
OMNI_DEVICE uint32_t load32(const void* p) {
#if defined(OMNITRON_GPU_EMULATE)
  uint32_t x;
  memcpy(&x, p, 4);
  return x;
#else
  return *static_cast<const uint32_t*>(p);
#endif
}
OMNI_DEVICE void store32(void* p, uint32_t x) {
#if defined(OMNITRON_GPU_EMULATE)
  memcpy(p, &x, 4);
#else
  *static_cast<uint32_t*>(p) = x;
#endif
}
OMNI_DEVICE Vec16 load128(const void* p) {
#if defined(OMNITRON_GPU_EMULATE)
  Vec16 x;
  memcpy(&x, p, 16);
  return x;
#else
  const uint4 u = *static_cast<const uint4*>(p);
  return Vec16{{u.x, u.y, u.z, u.w}};
#endif
}
OMNI_DEVICE void store128(void* p, const Vec16& x) {
#if defined(OMNITRON_GPU_EMULATE)
  memcpy(p, &x, 16);
#else
  *static_cast<uint4*>(p) = make_uint4(x.w[0], x.w[1], x.w[2], x.w[3]);
#endif
}
// Two floats as a fragment pair of T (the first in the low half).
template <typename T>
OMNI_DEVICE uint32_t pack_floats(float lo, float hi) {
  return pack2<T>(from_float<T>(lo), from_float<T>(hi));
}
template <typename T>
OMNI_DEVICE float low_half(uint32_t x) {
  return to_float(T{static_cast<uint16_t>(x & 0xffffu)});
}
template <typename T>
OMNI_DEVICE float high_half(uint32_t x) {
  return to_float(T{static_cast<uint16_t>(x >> 16)});
}

// The tensor-core kernels: 64 query rows (or keys) per block, 16 per warp, tiles of 64 in the
// other direction, head_dim 64 or 128; shared rows padded by 8 elements (16 bytes), so the 8
// rows a fragment load touches start 4 banks apart and the 32 lanes hit 32 banks.
constexpr int kMmaRows = 64, kMmaWarps = 4, kMmaPad = 8;

// Copies rows [row0, row0 + 64) x [0, HD) of a row-major matrix (row stride ld_global elements)
// into shared [64][HD + pad] in 16-byte pieces; rows past `rows` are zero.
template <typename T, int HD>
OMNI_DEVICE void load_rows(T* dst, const T* src, int row0, int rows, size_t ld_global) {
  constexpr int kChunks = HD / 8, kLd = HD + kMmaPad;
  for (int u = threadIdx.x; u < kMmaRows * kChunks; u += kMmaWarps * kWarpSize) {
    const int r = u / kChunks, c = u % kChunks * 8, j = row0 + r;
    const Vec16 x = j < rows ? load128(src + static_cast<size_t>(j) * ld_global + c) : Vec16{};
    store128(dst + r * kLd + c, x);
  }
}
// The same rows stored transposed, dst [HD][64 + pad]: dst[c][r] = src[row0 + r][c]. Each
// thread reads two rows' 16-byte pieces and writes 8 column pairs, adjacent lanes writing
// adjacent words.
template <typename T, int HD>
OMNI_DEVICE void load_rows_transposed(T* dst, const T* src, int row0, int rows, size_t ld_global) {
  constexpr int kChunks = HD / 8, kPairs = kMmaRows / 2, kLd = kMmaRows + kMmaPad;
  for (int u = threadIdx.x; u < kPairs * kChunks; u += kMmaWarps * kWarpSize) {
    const int p = u % kPairs, c = u / kPairs * 8, j = row0 + 2 * p;
    const Vec16 a = j < rows ? load128(src + static_cast<size_t>(j) * ld_global + c) : Vec16{};
    const Vec16 b =
        j + 1 < rows ? load128(src + static_cast<size_t>(j + 1) * ld_global + c) : Vec16{};
    for (int x = 0; x < 8; ++x) {
      const uint32_t lo = (a.w[x / 2] >> (16 * (x % 2))) & 0xffffu;
      const uint32_t hi = (b.w[x / 2] >> (16 * (x % 2))) & 0xffffu;
      store32(dst + (c + x) * kLd + 2 * p, lo | (hi << 16));
    }
  }
}

// The mma path needs 16-byte aligned rows for its 128-bit loads.
inline bool aligned16(const void* p, size_t row_elems, size_t elem_bytes) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && row_elems * elem_bytes % 16 == 0;
}

}  // namespace attention
OMNI_GPU_NAMESPACE_END
