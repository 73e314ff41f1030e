// Word and position embeddings (ops.h for their definitions): the lookup, the position add,
// and the backward's scatter-add by token, which is deterministic without float atomics.
//
// Backward: dwte[t] += sum of the gradient rows whose token is t. Atomics would add the rows
// in whatever order the hardware schedules them, so instead
//   1. the rows are sorted by key (token - vocab_start; tokens outside the slice get a key past
//      every valid one) with a stable LSD radix sort on the device, 8 bits a pass, one pass
//      per byte of the key range: equal tokens end up adjacent, in row order;
//   2. the sorted rows are cut into pieces of kRunRows consecutive positions; one thread per
//      (piece, column pack) sums each run of equal keys in its piece in order. A run that is a
//      whole segment (every row of its token) is added to dwte at once; a segment crossing
//      pieces leaves one partial per piece (a tail, then heads), and a last pass adds those
//      partials in piece order. Work per thread is bounded by kRunRows even for a token that
//      fills the batch, and the order of every sum depends only on the tokens.
// dwpe without a positions array needs no sort: the rows of position p are p, p + seq, ...
#include <cstdint>

#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/vectorized.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

OMNI_DEVICE int imin(int a, int b) {
  return a < b ? a : b;
}

template <int V, typename T>
OMNI_DEVICE void accumulate(float (&acc)[V], const T* p, size_t pack_index) {
  const Pack<T, V> x = load_pack<V>(p, pack_index);
  for (int k = 0; k < V; ++k) acc[k] += to_float(x.v[k]);
}

// Float rows of dwte/dwpe and of the partials: p is 16-byte aligned when V % 4 == 0.
template <int V>
OMNI_DEVICE void add_floats(float* p, const float (&acc)[V]) {
  if constexpr (V % 4 == 0) {
    for (int k = 0; k < V; k += 4) {
      Pack<float, 4> x = load_pack<4>(p + k, 0);
      for (int j = 0; j < 4; ++j) x.v[j] += acc[k + j];
      store_pack<4>(p + k, 0, x);
    }
  } else {
    for (int k = 0; k < V; ++k) p[k] += acc[k];
  }
}
template <int V>
OMNI_DEVICE void add_from(float (&acc)[V], const float* p) {
  if constexpr (V % 4 == 0) {
    for (int k = 0; k < V; k += 4) {
      const Pack<float, 4> x = load_pack<4>(p + k, 0);
      for (int j = 0; j < 4; ++j) acc[k + j] += x.v[j];
    }
  } else {
    for (int k = 0; k < V; ++k) acc[k] += p[k];
  }
}
template <int V>
OMNI_DEVICE void store_floats(float* p, const float (&acc)[V]) {
  if constexpr (V % 4 == 0) {
    for (int k = 0; k < V; k += 4)
      store_pack<4>(p + k, 0, Pack<float, 4>{{acc[k], acc[k + 1], acc[k + 2], acc[k + 3]}});
  } else {
    for (int k = 0; k < V; ++k) p[k] = acc[k];
  }
}

// ---- Forward ----------------------------------------------------------------------------------

// out[n] = wte[tokens[n] - vocab_start] (zeros outside the slice) + wpe[position(n)] (if wpe).
template <int V, typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                         int N, int seq, int C, const int32_t* positions,
                                         int vocab_start, int vocab_end) {
  const int cols = C / V;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    for (int n = blockIdx.y; n < N; n += gridDim.y) {
      float acc[V] = {};
      const int t = tokens[n];
      if (t >= vocab_start && t < vocab_end)
        accumulate(acc, wte, static_cast<size_t>(t - vocab_start) * cols + c);
      if (wpe)
        accumulate(acc, wpe, static_cast<size_t>(positions ? positions[n] : n % seq) * cols + c);
      Pack<T, V> o;
      for (int k = 0; k < V; ++k) o.v[k] = from_float<T>(acc[k]);
      store_pack<V>(out, static_cast<size_t>(n) * cols + c, o);
    }
  }
}

template <int V, typename T>
__global__ void position_add_kernel(T* out, const T* wpe, int N, int seq, int C,
                                    const int32_t* positions) {
  const int cols = C / V;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    for (int n = blockIdx.y; n < N; n += gridDim.y) {
      const size_t p = static_cast<size_t>(n) * cols + c;
      float acc[V];
      const Pack<T, V> o = load_pack<V>(out, p);
      for (int k = 0; k < V; ++k) acc[k] = to_float(o.v[k]);
      accumulate(acc, wpe, static_cast<size_t>(positions ? positions[n] : n % seq) * cols + c);
      Pack<T, V> r;
      for (int k = 0; k < V; ++k) r.v[k] = from_float<T>(acc[k]);
      store_pack<V>(out, p, r);
    }
  }
}

// ---- Backward: sort rows by key ---------------------------------------------------------------

constexpr int kRadixBits = 8;
constexpr int kDigits = 1 << kRadixBits;
static_assert(kThreads == kDigits, "one thread per digit in the histogram");
constexpr int kScanThreads = 1024;

// keys[n] = ids[n] - lo for ids in [lo, hi), else hi - lo (sorts after every valid key).
__global__ void make_keys_kernel(uint32_t* keys, int32_t* rows, const int32_t* ids, int N, int lo,
                                 int hi) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    const int id = ids[n];
    keys[n] = static_cast<uint32_t>(id >= lo && id < hi ? id - lo : hi - lo);
    rows[n] = n;
  }
}

// hist[digit * tiles + tile] = how many keys of the tile (kThreads consecutive keys, one block)
// have this digit. Integer atomics: the count does not depend on their order.
__global__ void radix_histogram_kernel(int* hist, const uint32_t* keys, int N, int shift,
                                       int tiles) {
  __shared__ int count[kDigits];
  count[threadIdx.x] = 0;
  __syncthreads();
  const int n = blockIdx.x * kThreads + threadIdx.x;
  if (n < N) atomicAdd(&count[(keys[n] >> shift) & (kDigits - 1)], 1);
  __syncthreads();
  hist[threadIdx.x * tiles + blockIdx.x] = count[threadIdx.x];
}

// In-place exclusive prefix sum of data[0..count) by one block: each thread sums a contiguous
// chunk, a Hillis-Steele scan over the chunk sums, then each thread writes its chunk's prefixes.
__global__ void exclusive_scan_kernel(int* data, int count) {
  __shared__ int sums[kScanThreads];
  const int t = threadIdx.x;
  const int per = (count + kScanThreads - 1) / kScanThreads;
  const int begin = imin(count, t * per), end = imin(count, begin + per);
  int own = 0;
  for (int i = begin; i < end; ++i) own += data[i];
  sums[t] = own;
  __syncthreads();
  for (int offset = 1; offset < kScanThreads; offset *= 2) {
    const int add = t >= offset ? sums[t - offset] : 0;
    __syncthreads();
    sums[t] += add;
    __syncthreads();
  }
  int run = sums[t] - own;
  for (int i = begin; i < end; ++i) {
    const int v = data[i];
    data[i] = run;
    run += v;
  }
}

// Stable scatter of one tile: an element goes to its digit's offset for this tile plus the
// number of equal digits before it in the tile.
__global__ void radix_scatter_kernel(uint32_t* keys_out, int32_t* rows_out, const uint32_t* keys,
                                     const int32_t* rows, const int* offsets, int N, int shift,
                                     int tiles) {
  __shared__ int digits[kThreads];
  const int t = threadIdx.x;
  const int n = blockIdx.x * kThreads + t;
  const uint32_t key = n < N ? keys[n] : 0u;
  const int digit = n < N ? static_cast<int>((key >> shift) & (kDigits - 1)) : -1;
  digits[t] = digit;
  __syncthreads();
  if (n >= N) return;
  int rank = 0;
  for (int j = 0; j < t; ++j) rank += digits[j] == digit;
  const int dst = offsets[digit * tiles + blockIdx.x] + rank;
  keys_out[dst] = key;
  rows_out[dst] = rows[n];
}

// ---- Backward: sum runs of equal keys ----------------------------------------------------------

constexpr int kRunRows = 32;

// One thread per (piece of kRunRows sorted positions, column pack); see the file comment.
template <int V, typename T>
__global__ void segment_runs_kernel(float* dst, float* head_partial, float* tail_partial,
                                    const uint32_t* keys, const int32_t* rows, const T* dout, int N,
                                    int C, uint32_t invalid_key, int pieces) {
  const int cols = C / V;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    for (int b = blockIdx.y; b < pieces; b += gridDim.y) {
      const int i0 = b * kRunRows, i1 = imin(N, i0 + kRunRows);
      float acc[V] = {};
      int run_start = i0;
      for (int i = i0; i < i1; ++i) {
        const uint32_t key = keys[i];
        if (key >= invalid_key) break;  // tokens outside the slice, all sorted last
        accumulate(acc, dout, static_cast<size_t>(rows[i]) * cols + c);
        const bool run_ends = i + 1 == i1 || keys[i + 1] != key;
        if (!run_ends) continue;
        const bool segment_starts = run_start == 0 || keys[run_start - 1] != key;
        const bool segment_ends = i + 1 == N || keys[i + 1] != key;
        const size_t col = static_cast<size_t>(c) * V;
        if (segment_starts && segment_ends)
          add_floats(dst + static_cast<size_t>(key) * C + col, acc);
        else if (!segment_starts)
          store_floats(head_partial + static_cast<size_t>(b) * C + col, acc);
        else
          store_floats(tail_partial + static_cast<size_t>(b) * C + col, acc);
        for (int k = 0; k < V; ++k) acc[k] = 0.0f;
        run_start = i + 1;
      }
    }
  }
}

// For each segment that starts in piece b and continues past it: its tail partial, then the
// head partials of the following pieces in order, added to dst.
template <int V>
__global__ void segment_finish_kernel(float* dst, const float* head_partial,
                                      const float* tail_partial, const uint32_t* keys, int N, int C,
                                      uint32_t invalid_key, int pieces) {
  const int cols = C / V;
  auto crosses_end = [&](int piece, uint32_t key) {
    const int last = imin(N, (piece + 1) * kRunRows) - 1;
    return last + 1 < N && keys[last] == key && keys[last + 1] == key;
  };
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    for (int b = blockIdx.y; b < pieces; b += gridDim.y) {
      const uint32_t key = keys[imin(N, (b + 1) * kRunRows) - 1];
      if (key >= invalid_key || !crosses_end(b, key)) continue;
      if (b > 0 && keys[b * kRunRows - 1] == key) continue;  // started in an earlier piece
      const size_t col = static_cast<size_t>(c) * V;
      float acc[V];
      for (int k = 0; k < V; ++k) acc[k] = 0.0f;
      add_from(acc, tail_partial + static_cast<size_t>(b) * C + col);
      int next = b + 1;
      do {
        add_from(acc, head_partial + static_cast<size_t>(next) * C + col);
      } while (crosses_end(next++, key));
      add_floats(dst + static_cast<size_t>(key) * C + col, acc);
    }
  }
}

// dwpe[p] += rows p, p + seq, p + 2 seq, ... in order (no positions array).
template <int V, typename T>
__global__ void position_grad_kernel(float* dwpe, const T* dout, int N, int seq, int C) {
  const int cols = C / V;
  const int used = imin(seq, N);
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    for (int p = blockIdx.y; p < used; p += gridDim.y) {
      float acc[V] = {};
      for (int n = p; n < N; n += seq) accumulate(acc, dout, static_cast<size_t>(n) * cols + c);
      add_floats(dwpe + static_cast<size_t>(p) * C + static_cast<size_t>(c) * V, acc);
    }
  }
}

// dst[id - lo] += dout[n] for every row n with ids[n] in [lo, hi), deterministically.
template <int V, typename T>
void grouped_row_sum(float* dst, const int32_t* ids, int lo, int hi, const T* dout, int N, int C,
                     gpuStream_t s) {
  const int tiles = static_cast<int>(ceil_div(N, kThreads));
  const int pieces = static_cast<int>(ceil_div(N, kRunRows));
  const uint32_t invalid_key = static_cast<uint32_t>(hi - lo);
  int key_bits = 0;  // enough bits for every key, the invalid one included
  while (key_bits < 32 && (invalid_key >> key_bits) != 0) ++key_bits;
  const int passes = (key_bits + kRadixBits - 1) / kRadixBits;

  // Scratch: two key and row buffers (the sort ping-pongs), the digit histogram, and a head
  // and a tail partial row per piece.
  size_t bytes = 0;
  auto carve = [&](size_t n) {
    const size_t at = bytes;
    bytes += (n + 255) / 256 * 256;
    return at;
  };
  const size_t keys_at[2] = {carve(N * sizeof(uint32_t)), carve(N * sizeof(uint32_t))};
  const size_t rows_at[2] = {carve(N * sizeof(int32_t)), carve(N * sizeof(int32_t))};
  const size_t hist_at = carve(static_cast<size_t>(kDigits) * tiles * sizeof(int));
  const size_t head_at = carve(static_cast<size_t>(pieces) * C * sizeof(float));
  const size_t tail_at = carve(static_cast<size_t>(pieces) * C * sizeof(float));
  auto* base = static_cast<unsigned char*>(scratch(bytes));
  uint32_t* keys[2] = {reinterpret_cast<uint32_t*>(base + keys_at[0]),
                       reinterpret_cast<uint32_t*>(base + keys_at[1])};
  int32_t* rows[2] = {reinterpret_cast<int32_t*>(base + rows_at[0]),
                      reinterpret_cast<int32_t*>(base + rows_at[1])};
  auto* hist = reinterpret_cast<int*>(base + hist_at);
  auto* head = reinterpret_cast<float*>(base + head_at);
  auto* tail = reinterpret_cast<float*>(base + tail_at);

  launch(make_keys_kernel, grid_for(N), kThreads, 0, s, keys[0], rows[0], ids, N, lo, hi);
  int cur = 0;
  for (int pass = 0; pass < passes; ++pass, cur ^= 1) {
    const int shift = pass * kRadixBits;
    launch(radix_histogram_kernel, tiles, kThreads, 0, s, hist, keys[cur], N, shift, tiles);
    launch(exclusive_scan_kernel, 1, kScanThreads, 0, s, hist, kDigits * tiles);
    launch(radix_scatter_kernel, tiles, kThreads, 0, s, keys[cur ^ 1], rows[cur ^ 1], keys[cur],
           rows[cur], hist, N, shift, tiles);
  }

  const RowsShape g = rows_shape(pieces, C / V);
  launch(segment_runs_kernel<V, T>, g.grid, g.block, 0, s, dst, head, tail, keys[cur], rows[cur],
         dout, N, C, invalid_key, pieces);
  launch(segment_finish_kernel<V>, g.grid, g.block, 0, s, dst, head, tail, keys[cur], N, C,
         invalid_key, pieces);
}

template <int V, typename T>
void embedding_backward_packed(float* dwte, float* dwpe, const int32_t* tokens, const T* dout,
                               int N, int seq, int C, const int32_t* positions, int vocab_start,
                               int vocab_end, gpuStream_t s) {
  if (dwte) grouped_row_sum<V>(dwte, tokens, vocab_start, vocab_end, dout, N, C, s);
  if (!dwpe) return;
  if (positions) {
    grouped_row_sum<V>(dwpe, positions, 0, seq, dout, N, C, s);
  } else {
    const RowsShape g = rows_shape(seq < N ? seq : N, C / V);
    launch(position_grad_kernel<V, T>, g.grid, g.block, 0, s, dwpe, dout, N, seq, C);
  }
}

}  // namespace

// Packs of V elements when V divides C and the base pointers are aligned (then every row is);
// single elements otherwise.
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int N, int seq,
                       int C, const int32_t* positions, int vocab_start, int vocab_end,
                       Stream stream) {
  constexpr int V = kPackWidth<T>;
  const auto s = static_cast<gpuStream_t>(stream);
  if (C % V == 0 && aligned_to(sizeof(T) * V, out, wte, wpe)) {
    const RowsShape g = rows_shape(N, C / V);
    launch(embedding_forward_kernel<V, T>, g.grid, g.block, 0, s, out, tokens, wte, wpe, N, seq, C,
           positions, vocab_start, vocab_end);
  } else {
    const RowsShape g = rows_shape(N, C);
    launch(embedding_forward_kernel<1, T>, g.grid, g.block, 0, s, out, tokens, wte, wpe, N, seq, C,
           positions, vocab_start, vocab_end);
  }
}

template <typename T>
void position_embedding_add(T* out, const T* wpe, int N, int seq, int C, const int32_t* positions,
                            Stream stream) {
  constexpr int V = kPackWidth<T>;
  const auto s = static_cast<gpuStream_t>(stream);
  if (C % V == 0 && aligned_to(sizeof(T) * V, out, wpe)) {
    const RowsShape g = rows_shape(N, C / V);
    launch(position_add_kernel<V, T>, g.grid, g.block, 0, s, out, wpe, N, seq, C, positions);
  } else {
    const RowsShape g = rows_shape(N, C);
    launch(position_add_kernel<1, T>, g.grid, g.block, 0, s, out, wpe, N, seq, C, positions);
  }
}

template <typename T>
void embedding_backward(float* dwte, float* dwpe, const int32_t* tokens, const T* dout, int N,
                        int seq, int C, const int32_t* positions, int vocab_start, int vocab_end,
                        Stream stream) {
  if (N <= 0 || C <= 0) return;
  constexpr int V = kPackWidth<T>;
  const auto s = static_cast<gpuStream_t>(stream);
  if (C % V == 0 && aligned_to(sizeof(T) * V, dout) && aligned_to(16, dwte, dwpe))
    embedding_backward_packed<V>(dwte, dwpe, tokens, dout, N, seq, C, positions, vocab_start,
                                 vocab_end, s);
  else
    embedding_backward_packed<1>(dwte, dwpe, tokens, dout, N, seq, C, positions, vocab_start,
                                 vocab_end, s);
}

#define OMNI_INSTANTIATE(T)                                                                    \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int,    \
                                     const int32_t*, int, int, Stream);                        \
  template void embedding_backward<T>(float*, float*, const int32_t*, const T*, int, int, int, \
                                      const int32_t*, int, int, Stream);                       \
  template void position_embedding_add<T>(T*, const T*, int, int, int, const int32_t*, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
