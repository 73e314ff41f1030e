// Flash attention backward (gpu_ops.h), FlashAttention-2 (Dao 2023): probabilities are
// recomputed from the saved lse, P = exp(scale q.k - lse), and with D_i = dO_i . O_i
// (= sum_j P_ij dP_ij) the score gradient is dS = P (dP - D), dP = dO V^T. Three passes keep it
// deterministic without float atomics:
//   1. D per row;
//   2. per key tile: dV = sum P^T dO and dK = scale sum dS^T Q over the query tiles (and the
//      query heads sharing the key head) that see it, in a fixed order;
//   3. per query tile: dQ = scale sum dS K over its key tiles (P and dS computed again: the
//      price of no atomics is one more Q K^T and dO V^T).
#include "backend/gpu/attention_common.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

using namespace attention;

// D[b, h, i] = dO_i . O_i, one warp per (row, head); grid-stride, since the host does not know
// the device's warp size (HIP compiles the host side with 32).
template <typename T>
__global__ void row_dot_kernel(float* D, const T* dout, const T* out, ops::AttentionDims d) {
  const int warps = blockDim.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const size_t rows = static_cast<size_t>(d.batch) * d.seq * d.heads;
  const int hd = d.head_dim;
  for (size_t pair = size_t{blockIdx.x} * warps + threadIdx.x / kWarpSize; pair < rows;
       pair += size_t{gridDim.x} * warps) {  // pair = n * heads + h
    const T* o = out + pair * hd;
    const T* go = dout + pair * hd;
    float s = 0.0f;
    for (int c = lane; c < hd; c += kWarpSize) s += to_float(o[c]) * to_float(go[c]);
    s = warp_sum(s);
    if (lane == 0) {
      const size_t n = pair / d.heads, h = pair % d.heads, b = n / d.seq, i = n % d.seq;
      D[(b * d.heads + h) * d.seq + i] = s;
    }
  }
}

// ---- Scalar path ----------------------------------------------------------------------------
// Loads rows [row0, row0 + R) of a [seq, ld_global] matrix slice into a float tile [R][ld].
template <typename T, int R, int kThreads>
OMNI_DEVICE void load_tile(float* dst, const T* src, int row0, int seq, int ld_global, int hd,
                           int ld) {
  for (int e = threadIdx.x; e < R * hd; e += kThreads) {
    const int row = e / hd, c = e % hd, j = row0 + row;
    dst[row * ld + c] = j < seq ? to_float(src[static_cast<size_t>(j) * ld_global + c]) : 0.0f;
  }
}

// dK, dV of one key tile of one (batch, key head): thread (key c, sub) owns dims sub + 4e.
template <typename T, int MaxHD>
__global__ void __launch_bounds__(ScalarTile<MaxHD>::kThreads)
    dkdv_scalar_kernel(T* dk, T* dv, const T* dout, const float* lse, const float* D, const T* q,
                       const T* k, const T* v, ops::AttentionDims d) {
  using Tile = ScalarTile<MaxHD>;
  constexpr int R = Tile::kRows, kSub = Tile::kSub, kThreads = Tile::kThreads;
  const int hd = d.head_dim, ld = hd + 1;
  const int b = blockIdx.z, g = blockIdx.y, k0 = blockIdx.x * R;
  const int hpg = (d.heads / d.groups), ldq = d.heads * hd, ldk = d.groups * hd;
  const int tid = threadIdx.x, c = tid / kSub, sub = tid % kSub;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd)), qscale = scale * kLog2e;

  OMNI_DYNAMIC_SHARED(smem);
  float* Ks = reinterpret_cast<float*>(smem);  // [R][ld]
  float* Vs = Ks + R * ld;
  float* Qs = Vs + R * ld;
  float* dOs = Qs + R * ld;
  float* Ps = dOs + R * ld;         // [key][query], R x (R + 1)
  float* dSs = Ps + R * (R + 1);    // [key][query]
  float* lse2 = dSs + R * (R + 1);  // [R], log2 units
  float* Ds = lse2 + R;
  int* first = reinterpret_cast<int*>(Ds + R);
  int* last = first + R;

  const size_t kvoff = static_cast<size_t>(b) * d.seq * ldk + g * hd;
  load_tile<T, R, kThreads>(Ks, k + kvoff, k0, d.seq, ldk, hd, ld);
  load_tile<T, R, kThreads>(Vs, v + kvoff, k0, d.seq, ldk, hd, ld);
  const int j = k0 + c, k_hi = imin(k0 + R, d.seq) - 1;
  float dK[Tile::kDims], dV[Tile::kDims];
  OMNI_UNROLL
  for (int e = 0; e < Tile::kDims; ++e) dK[e] = dV[e] = 0.0f;
  // Causal rows before the tile's first key cannot see it (without q_index, row i's last key
  // is i).
  const int qstart = d.q_index ? 0 : k0 / R * R;
  for (int h = g * hpg; h < (g + 1) * hpg; ++h) {
    const size_t qoff = static_cast<size_t>(b) * d.seq * ldq + h * hd;
    const size_t roff = (static_cast<size_t>(b) * d.heads + h) * d.seq;
    for (int q0 = qstart; q0 < d.seq; q0 += R) {
      __syncthreads();  // the previous tiles are no longer read
      if (tid < R) {
        const KeyRange kr = key_range(d, b, q0 + tid);
        first[tid] = kr.first, last[tid] = kr.last;
        lse2[tid] = q0 + tid < d.seq ? lse[roff + q0 + tid] * kLog2e : 0.0f;
        Ds[tid] = q0 + tid < d.seq ? D[roff + q0 + tid] : 0.0f;
      }
      __syncthreads();
      bool seen = false;  // does any row of the query tile see a key of ours?
      for (int i = 0; i < R; ++i) seen |= first[i] <= k_hi && last[i] >= k0 && first[i] <= last[i];
      if (!seen) continue;  // uniform over the block
      load_tile<T, R, kThreads>(Qs, q + qoff, q0, d.seq, ldq, hd, ld);
      load_tile<T, R, kThreads>(dOs, dout + qoff, q0, d.seq, ldq, hd, ld);
      __syncthreads();
      OMNI_UNROLL
      for (int ii = 0; ii < Tile::kCols; ++ii) {
        const int i = sub + kSub * ii;
        float p = 0.0f, ds = 0.0f;
        if (j >= first[i] && j <= last[i]) {
          float s = 0.0f, dp = 0.0f;
          for (int x = 0; x < hd; ++x) {
            s += Qs[i * ld + x] * Ks[c * ld + x];
            dp += dOs[i * ld + x] * Vs[c * ld + x];
          }
          p = exp2f(s * qscale - lse2[i]);
          ds = p * (dp - Ds[i]);
        }
        Ps[c * (R + 1) + i] = p;
        dSs[c * (R + 1) + i] = ds;
      }
      __syncthreads();  // a key's row of P and dS comes from its four threads
      OMNI_UNROLL
      for (int e = 0; e < Tile::kDims; ++e) {
        const int x = sub + kSub * e;
        if (x >= hd) continue;
        float a = dV[e], bk = dK[e];
        for (int i = 0; i < R; ++i) {
          a += Ps[c * (R + 1) + i] * dOs[i * ld + x];
          bk += dSs[c * (R + 1) + i] * Qs[i * ld + x];
        }
        dV[e] = a, dK[e] = bk;
      }
    }
  }
  if (j >= d.seq) return;
  T* dkr = dk + kvoff + static_cast<size_t>(j) * ldk;
  T* dvr = dv + kvoff + static_cast<size_t>(j) * ldk;
  OMNI_UNROLL
  for (int e = 0; e < Tile::kDims; ++e) {
    const int x = sub + kSub * e;
    if (x >= hd) continue;
    dkr[x] = from_float<T>(dK[e] * scale);
    dvr[x] = from_float<T>(dV[e]);
  }
}

// dQ of one query tile of one (batch, head): thread (row r, sub) owns dims sub + 4e.
template <typename T, int MaxHD>
__global__ void __launch_bounds__(ScalarTile<MaxHD>::kThreads)
    dq_scalar_kernel(T* dq, const T* dout, const float* lse, const float* D, const T* q, const T* k,
                     const T* v, ops::AttentionDims d) {
  using Tile = ScalarTile<MaxHD>;
  constexpr int R = Tile::kRows, kSub = Tile::kSub, kThreads = Tile::kThreads;
  const int hd = d.head_dim, ld = hd + 1;
  const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * R;
  const int g = h / (d.heads / d.groups), ldq = d.heads * hd, ldk = d.groups * hd;
  const int tid = threadIdx.x, r = tid / kSub, sub = tid % kSub;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd)), qscale = scale * kLog2e;

  OMNI_DYNAMIC_SHARED(smem);
  float* Qs = reinterpret_cast<float*>(smem);  // [R][ld]
  float* dOs = Qs + R * ld;
  float* Ks = dOs + R * ld;
  float* Vs = Ks + R * ld;
  float* dSs = Vs + R * ld;  // [query][key], R x (R + 1)
  int* first = reinterpret_cast<int*>(dSs + R * (R + 1));
  int* last = first + R;

  const size_t qoff = static_cast<size_t>(b) * d.seq * ldq + h * hd;
  const size_t kvoff = static_cast<size_t>(b) * d.seq * ldk + g * hd;
  const size_t roff = (static_cast<size_t>(b) * d.heads + h) * d.seq;
  load_tile<T, R, kThreads>(Qs, q + qoff, q0, d.seq, ldq, hd, ld);
  load_tile<T, R, kThreads>(dOs, dout + qoff, q0, d.seq, ldq, hd, ld);
  if (tid < R) {
    const KeyRange kr = key_range(d, b, q0 + tid);
    first[tid] = kr.first, last[tid] = kr.last;
  }
  __syncthreads();
  int kmin = d.seq, kmax = -1;
  for (int row = 0; row < R; ++row)
    if (first[row] <= last[row]) kmin = imin(kmin, first[row]), kmax = imax(kmax, last[row]);
  const int i = q0 + r, my_first = first[r], my_last = last[r];
  const float my_lse2 = i < d.seq ? lse[roff + i] * kLog2e : 0.0f;
  const float my_D = i < d.seq ? D[roff + i] : 0.0f;

  float dQ[Tile::kDims];
  OMNI_UNROLL
  for (int e = 0; e < Tile::kDims; ++e) dQ[e] = 0.0f;
  for (int k0 = kmin / R * R; k0 <= kmax; k0 += R) {
    __syncthreads();
    load_tile<T, R, kThreads>(Ks, k + kvoff, k0, d.seq, ldk, hd, ld);
    load_tile<T, R, kThreads>(Vs, v + kvoff, k0, d.seq, ldk, hd, ld);
    __syncthreads();
    OMNI_UNROLL
    for (int jj = 0; jj < Tile::kCols; ++jj) {
      const int c = sub + kSub * jj, j = k0 + c;
      float ds = 0.0f;
      if (j >= my_first && j <= my_last) {
        float s = 0.0f, dp = 0.0f;
        for (int x = 0; x < hd; ++x) {
          s += Qs[r * ld + x] * Ks[c * ld + x];
          dp += dOs[r * ld + x] * Vs[c * ld + x];
        }
        ds = exp2f(s * qscale - my_lse2) * (dp - my_D);
      }
      dSs[r * (R + 1) + c] = ds;
    }
    __syncthreads();
    OMNI_UNROLL
    for (int e = 0; e < Tile::kDims; ++e) {
      const int x = sub + kSub * e;
      if (x >= hd) continue;
      float a = dQ[e];
      for (int c = 0; c < R; ++c) a += dSs[r * (R + 1) + c] * Ks[c * ld + x];
      dQ[e] = a;
    }
  }
  if (i >= d.seq) return;
  T* dqr = dq + qoff + static_cast<size_t>(i) * ldq;
  OMNI_UNROLL
  for (int e = 0; e < Tile::kDims; ++e) {
    const int x = sub + kSub * e;
    if (x >= hd) continue;
    dqr[x] = from_float<T>(dQ[e] * scale);
  }
}

template <typename T>
void backward_scalar(T* dq, T* dk, T* dv, const T* dout, const float* lse, const float* D,
                     const T* q, const T* k, const T* v, const ops::AttentionDims& d,
                     gpuStream_t stream) {
  with_max_head_dim(d.head_dim, [&](auto max_hd) {
    constexpr int MaxHD = decltype(max_hd)::value;
    using Tile = ScalarTile<MaxHD>;
    constexpr int R = Tile::kRows;
    const int ld = d.head_dim + 1;
    const size_t tiles = ceil_div(d.seq, R);
    const size_t kv_bytes =
        sizeof(float) * (4 * R * ld + 2 * R * (R + 1) + 2 * R) + sizeof(int) * 2 * R;
    auto dkdv = dkdv_scalar_kernel<T, MaxHD>;
    allow_shared(dkdv, kv_bytes);
    launch(dkdv, dim3(tiles, d.groups, d.batch), Tile::kThreads, kv_bytes, stream, dk, dv, dout,
           lse, D, q, k, v, d);
    const size_t q_bytes = sizeof(float) * (4 * R * ld + R * (R + 1)) + sizeof(int) * 2 * R;
    auto dqk = dq_scalar_kernel<T, MaxHD>;
    allow_shared(dqk, q_bytes);
    launch(dqk, dim3(tiles, d.heads, d.batch), Tile::kThreads, q_bytes, stream, dq, dout, lse, D, q,
           k, v, d);
  });
}

}  // namespace

template <typename T>
void flash_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                              const T* q, const T* k, const T* v, const ops::AttentionDims& d,
                              Stream stream) {
  check_dims(d, "flash_attention_backward");
  const auto s = static_cast<gpuStream_t>(stream);
  const size_t rows = static_cast<size_t>(d.batch) * d.seq * d.heads;
  if (rows == 0) return;
  auto* D = static_cast<float*>(scratch(rows * sizeof(float)));
  constexpr int kThreads = 256, kRowsPerBlock = 8;  // 32-lane warps; 64-lane ones loop twice
  launch(row_dot_kernel<T>, ceil_div(rows, kRowsPerBlock), kThreads, 0, s, D, dout, out, d);
  backward_scalar(dq, dk, dv, dout, lse, D, q, k, v, d, s);
}

#define OMNI_INSTANTIATE(T)                                                               \
  template void flash_attention_backward<T>(T*, T*, T*, const T*, const T*, const float*, \
                                            const T*, const T*, const T*,                 \
                                            const ops::AttentionDims&, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
