// Flash attention backward (gpu_ops.h), FlashAttention-2 (Dao 2023): probabilities are
// recomputed from the saved lse, P = exp(scale q.k - lse), and with D_i = dO_i . O_i
// (= sum_j P_ij dP_ij) the score gradient is dS = P (dP - D), dP = dO V^T; with attention
// dropout's factors Z (the mask drawn again from its key), dS = P (Z dP - D) and dV takes P Z,
// D still being dO . O. Three passes keep it
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
  const int b = blockIdx.y, g = blockIdx.x, k0 = blockIdx.z * R;
  const int hpg = (d.heads / d.groups), ldq = d.heads * hd, ldk = d.groups * hd;
  const int tid = threadIdx.x, c = tid / kSub, sub = tid % kSub;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd)), qscale = scale * kLog2e;
  const bool drop = d.dropout.active();
  const float drop_scale = static_cast<float>(d.dropout.scale());

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
          // Dropout (factor z): dS = P (z dP - D), and dV takes P z.
          const float z = drop ? dropout_factor(d, b, h, q0 + i, j, drop_scale) : 1.0f;
          ds = p * (z * dp - Ds[i]);
          p *= z;
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
  const int b = blockIdx.y, h = blockIdx.x, q0 = last_tile_first(R);
  const int g = h / (d.heads / d.groups), ldq = d.heads * hd, ldk = d.groups * hd;
  const int tid = threadIdx.x, r = tid / kSub, sub = tid % kSub;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd)), qscale = scale * kLog2e;
  const bool drop = d.dropout.active();
  const float drop_scale = static_cast<float>(d.dropout.scale());

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
        const float z = drop ? dropout_factor(d, b, h, i, j, drop_scale) : 1.0f;
        ds = exp2f(s * qscale - my_lse2) * (z * dp - my_D);
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

// ---- Tensor-core path: bf16/f16, head_dim 64 and 128 ------------------------------------------
// Fragment bookkeeping as in the forward (attention_forward.cu): an accumulator tile of
// 16 x 64 (rows g, g+8; columns 8nb + 2t, +1) becomes, packed to T, the A operand of the next
// matmul over those 64 columns; B operands whose pairs run along the row index of a matrix
// come from a transposed copy in shared memory.

// acc[nb] (16 x 64) += A (16 x HD, from the rows `a_rows`, `a_rows + 8` of a shared [.][kLd]
// tile) times B^T where B is a shared [64][kLd] tile of rows: S = Q K^T, dP = dO V^T, and their
// transposes.
template <typename T, int HD>
OMNI_DEVICE void mma_rows_by_rows(float (&acc)[8][4], const uint32_t (&a)[HD / 16][4], const T* B) {
  constexpr int kLd = HD + kMmaPad;
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  OMNI_UNROLL
  for (int nb = 0; nb < 8; ++nb) {
    OMNI_UNROLL
    for (int kk = 0; kk < HD / 16; ++kk) {
      const T* br = B + (8 * nb + g) * kLd + 16 * kk + 2 * t;
      const uint32_t bf[2] = {load32(br), load32(br + 8)};
      mma_16x8x16<T>(acc[nb], a[kk], bf);
    }
  }
}
// The A fragments of the 16 rows from row0 of a shared [.][HD + pad] tile.
template <typename T, int HD>
OMNI_DEVICE void load_a(uint32_t (&a)[HD / 16][4], const T* src, int row0) {
  constexpr int kLd = HD + kMmaPad;
  const int lane = threadIdx.x % kWarpSize, r = row0 + lane / 4, t = lane % 4;
  OMNI_UNROLL
  for (int kk = 0; kk < HD / 16; ++kk) {
    const int c = 16 * kk + 2 * t;
    a[kk][0] = load32(src + r * kLd + c);
    a[kk][1] = load32(src + (r + 8) * kLd + c);
    a[kk][2] = load32(src + r * kLd + c + 8);
    a[kk][3] = load32(src + (r + 8) * kLd + c + 8);
  }
}
// out[nd] (16 x HD) += X (16 x 64, accumulator layout, rounded to T) times Bt^T, Bt a shared
// transposed tile [HD][64 + pad]: O = P V, dV = P^T dO, dK = dS^T Q, dQ = dS K.
template <typename T, int HD>
OMNI_DEVICE void mma_acc_by_transposed(float (&out)[HD / 8][4], const float (&x)[8][4],
                                       const T* Bt) {
  constexpr int kLdT = kMmaRows + kMmaPad;
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  OMNI_UNROLL
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a[4] = {pack_floats<T>(x[2 * kk][0], x[2 * kk][1]),
                           pack_floats<T>(x[2 * kk][2], x[2 * kk][3]),
                           pack_floats<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]),
                           pack_floats<T>(x[2 * kk + 1][2], x[2 * kk + 1][3])};
    OMNI_UNROLL
    for (int nd = 0; nd < HD / 8; ++nd) {
      const T* br = Bt + (8 * nd + g) * kLdT + 16 * kk + 2 * t;
      const uint32_t bf[2] = {load32(br), load32(br + 8)};
      mma_16x8x16<T>(out[nd], a, bf);
    }
  }
}
// Stores rows r, r + 8 (below `rows`) of a 16 x HD accumulator, times `mul`, as T.
template <typename T, int HD>
OMNI_DEVICE void store_acc(T* dst, size_t ld, int r0, int rows, const float (&acc)[HD / 8][4],
                           float mul) {
  const int t = threadIdx.x % kWarpSize % 4;
  OMNI_UNROLL
  for (int x = 0; x < 2; ++x) {
    if (r0 + 8 * x >= rows) continue;
    T* row = dst + static_cast<size_t>(r0 + 8 * x) * ld;
    OMNI_UNROLL
    for (int nd = 0; nd < HD / 8; ++nd)
      store32(row + 8 * nd + 2 * t, pack_floats<T>(acc[nd][2 * x] * mul, acc[nd][2 * x + 1] * mul));
  }
}

// dK, dV of 64 keys of one (batch, key head); warp w owns keys 16w..16w+15 and computes the
// transposed tiles S^T = K Q^T and dP^T = V dO^T, so that P^T and dS^T are A operands.
template <typename T, int HD>
__global__ void __launch_bounds__(kMmaWarps* kWarpSize)
    dkdv_mma_kernel(T* dk, T* dv, const T* dout, const float* lse, const float* D, const T* q,
                    const T* k, const T* v, ops::AttentionDims d) {
  constexpr int kLd = HD + kMmaPad, kLdT = kMmaRows + kMmaPad, R = kMmaRows;
  const int b = blockIdx.y, g_head = blockIdx.x, k0 = blockIdx.z * R;
  const int hpg = d.heads / d.groups;
  const size_t ldq = static_cast<size_t>(d.heads) * HD, ldk = static_cast<size_t>(d.groups) * HD;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD)), qscale = scale * kLog2e;
  const bool drop = d.dropout.active();
  const float drop_scale = static_cast<float>(d.dropout.scale());

  OMNI_DYNAMIC_SHARED(smem);
  T* Ks = reinterpret_cast<T*>(smem);  // [64][kLd] each
  T* Vs = Ks + R * kLd;
  T* Qs = Vs + R * kLd;
  T* dOs = Qs + R * kLd;
  T* Qt = dOs + R * kLd;  // [HD][kLdT] each
  T* dOt = Qt + HD * kLdT;
  float* lse2 = reinterpret_cast<float*>(dOt + HD * kLdT);  // [64] per query row
  float* Ds = lse2 + R;
  int* first = reinterpret_cast<int*>(Ds + R);
  int* last = first + R;

  const size_t kvoff = static_cast<size_t>(b) * d.seq * ldk + g_head * HD;
  load_rows<T, HD>(Ks, k + kvoff, k0, d.seq, ldk);
  load_rows<T, HD>(Vs, v + kvoff, k0, d.seq, ldk);
  const int key_lo = warp * 16 + g, k_hi = imin(k0 + R, d.seq) - 1;
  float dK[HD / 8][4] = {}, dV[HD / 8][4] = {};
  const int qstart = d.q_index ? 0 : k0 / R * R;  // causal: earlier rows cannot see our keys
  for (int h = g_head * hpg; h < (g_head + 1) * hpg; ++h) {
    const size_t qoff = static_cast<size_t>(b) * d.seq * ldq + h * HD;
    const size_t roff = (static_cast<size_t>(b) * d.heads + h) * d.seq;
    for (int q0 = qstart; q0 < d.seq; q0 += R) {
      __syncthreads();  // the previous tiles are no longer read
      if (threadIdx.x < R) {
        const int i = q0 + threadIdx.x;
        const KeyRange kr = key_range(d, b, i);
        first[threadIdx.x] = kr.first, last[threadIdx.x] = kr.last;
        lse2[threadIdx.x] = i < d.seq ? lse[roff + i] * kLog2e : 0.0f;
        Ds[threadIdx.x] = i < d.seq ? D[roff + i] : 0.0f;
      }
      __syncthreads();
      bool seen = false, full = true;  // some / every query row sees some / every key of ours
      for (int r = 0; r < R; ++r) {
        seen |= first[r] <= k_hi && last[r] >= k0 && first[r] <= last[r];
        full &= first[r] <= k0 && last[r] >= k0 + R - 1;
      }
      if (!seen) continue;  // uniform over the block
      load_rows<T, HD>(Qs, q + qoff, q0, d.seq, ldq);
      load_rows<T, HD>(dOs, dout + qoff, q0, d.seq, ldq);
      load_rows_transposed<T, HD>(Qt, q + qoff, q0, d.seq, ldq);
      load_rows_transposed<T, HD>(dOt, dout + qoff, q0, d.seq, ldq);
      __syncthreads();
      float s[8][4] = {}, dp[8][4] = {};
      {
        uint32_t a[HD / 16][4];
        load_a<T, HD>(a, Ks, warp * 16);
        mma_rows_by_rows<T, HD>(s, a, Qs);
        load_a<T, HD>(a, Vs, warp * 16);
        mma_rows_by_rows<T, HD>(dp, a, dOs);
      }
      OMNI_UNROLL
      for (int nb = 0; nb < 8; ++nb) {
        OMNI_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int i = 8 * nb + 2 * t + (e & 1), j = k0 + key_lo + 8 * (e >= 2);
          const bool visible = full || (j >= first[i] && j <= last[i]);
          const float p = visible ? exp2f(s[nb][e] * qscale - lse2[i]) : 0.0f;
          const float z = drop ? dropout_factor(d, b, h, q0 + i, j, drop_scale) : 1.0f;
          s[nb][e] = p * z;
          dp[nb][e] = p * (z * dp[nb][e] - Ds[i]);
        }
      }
      mma_acc_by_transposed<T, HD>(dV, s, dOt);
      mma_acc_by_transposed<T, HD>(dK, dp, Qt);
    }
  }
  store_acc<T, HD>(dk + kvoff, ldk, k0 + key_lo, d.seq, dK, scale);
  store_acc<T, HD>(dv + kvoff, ldk, k0 + key_lo, d.seq, dV, 1.0f);
}

// dQ of 64 query rows of one (batch, head); warp w owns rows 16w..16w+15.
template <typename T, int HD>
__global__ void __launch_bounds__(kMmaWarps* kWarpSize)
    dq_mma_kernel(T* dq, const T* dout, const float* lse, const float* D, const T* q, const T* k,
                  const T* v, ops::AttentionDims d) {
  constexpr int kLd = HD + kMmaPad, kLdT = kMmaRows + kMmaPad, R = kMmaRows;
  const int b = blockIdx.y, h = blockIdx.x, q0 = last_tile_first(R);
  const int g_head = h / (d.heads / d.groups);
  const size_t ldq = static_cast<size_t>(d.heads) * HD, ldk = static_cast<size_t>(d.groups) * HD;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD)), qscale = scale * kLog2e;
  const bool drop = d.dropout.active();
  const float drop_scale = static_cast<float>(d.dropout.scale());

  OMNI_DYNAMIC_SHARED(smem);
  T* Ks = reinterpret_cast<T*>(smem);  // [64][kLd]; Q before the key loop
  T* Vs = Ks + R * kLd;                // [64][kLd]; dO before the key loop
  T* Kt = Vs + R * kLd;                // [HD][kLdT]
  int* first = reinterpret_cast<int*>(Kt + HD * kLdT);
  int* last = first + R;

  const size_t qoff = static_cast<size_t>(b) * d.seq * ldq + h * HD;
  const size_t kvoff = static_cast<size_t>(b) * d.seq * ldk + g_head * HD;
  const size_t roff = (static_cast<size_t>(b) * d.heads + h) * d.seq;
  load_rows<T, HD>(Ks, q + qoff, q0, d.seq, ldq);
  load_rows<T, HD>(Vs, dout + qoff, q0, d.seq, ldq);
  if (threadIdx.x < R) {
    const KeyRange kr = key_range(d, b, q0 + threadIdx.x);
    first[threadIdx.x] = kr.first, last[threadIdx.x] = kr.last;
  }
  __syncthreads();
  uint32_t qa[HD / 16][4], doa[HD / 16][4];
  load_a<T, HD>(qa, Ks, warp * 16);
  load_a<T, HD>(doa, Vs, warp * 16);
  int kmin = d.seq, kmax = -1, all_from = 0, all_to = d.seq - 1;
  for (int r = 0; r < R; ++r) {
    if (first[r] > last[r]) {
      all_to = -1;
      continue;
    }
    kmin = imin(kmin, first[r]), kmax = imax(kmax, last[r]);
    all_from = imax(all_from, first[r]), all_to = imin(all_to, last[r]);
  }
  const int r_lo = warp * 16 + g;
  int lo[2], hi[2];
  float row_lse2[2], row_D[2];
  OMNI_UNROLL
  for (int x = 0; x < 2; ++x) {
    const int r = r_lo + 8 * x, i = q0 + r;
    lo[x] = first[r], hi[x] = last[r];
    row_lse2[x] = i < d.seq ? lse[roff + i] * kLog2e : 0.0f;
    row_D[x] = i < d.seq ? D[roff + i] : 0.0f;
  }

  float dQ[HD / 8][4] = {};
  for (int k0 = kmin / R * R; k0 <= kmax; k0 += R) {
    __syncthreads();  // the previous tile (or Q and dO) is no longer read
    load_rows<T, HD>(Ks, k + kvoff, k0, d.seq, ldk);
    load_rows<T, HD>(Vs, v + kvoff, k0, d.seq, ldk);
    load_rows_transposed<T, HD>(Kt, k + kvoff, k0, d.seq, ldk);
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};
    mma_rows_by_rows<T, HD>(s, qa, Ks);
    mma_rows_by_rows<T, HD>(dp, doa, Vs);
    const bool masked = k0 < all_from || k0 + R - 1 > all_to;
    OMNI_UNROLL
    for (int nb = 0; nb < 8; ++nb) {
      OMNI_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int j = k0 + 8 * nb + 2 * t + (e & 1), x = e / 2;
        const bool visible = !masked || (j >= lo[x] && j <= hi[x]);
        const float p = visible ? exp2f(s[nb][e] * qscale - row_lse2[x]) : 0.0f;
        const float z = drop ? dropout_factor(d, b, h, q0 + r_lo + 8 * x, j, drop_scale) : 1.0f;
        dp[nb][e] = p * (z * dp[nb][e] - row_D[x]);
      }
    }
    mma_acc_by_transposed<T, HD>(dQ, dp, Kt);
  }
  store_acc<T, HD>(dq + qoff, ldq, q0 + r_lo, d.seq, dQ, scale);
}

template <typename T>
bool backward_mma(T* dq, T* dk, T* dv, const T* dout, const float* lse, const float* D, const T* q,
                  const T* k, const T* v, const ops::AttentionDims& d, gpuStream_t stream) {
  if constexpr (!kHasMma16816 || std::is_same_v<T, float>) {
    return false;
  } else {
    const int hd = d.head_dim;
    const size_t wq = size_t(d.heads) * hd, wk = size_t(d.groups) * hd;
    if ((hd != 64 && hd != 128) || !aligned16(q, wq, sizeof(T)) ||
        !aligned16(dout, wq, sizeof(T)) || !aligned16(dq, wq, sizeof(T)) ||
        !aligned16(k, wk, sizeof(T)) || !aligned16(v, wk, sizeof(T)) ||
        !aligned16(dk, wk, sizeof(T)) || !aligned16(dv, wk, sizeof(T)))
      return false;
    auto run = [&](auto head_dim) {
      constexpr int HD = decltype(head_dim)::value, R = kMmaRows;
      constexpr size_t rows_bytes = sizeof(T) * R * (HD + kMmaPad);
      constexpr size_t transposed_bytes = sizeof(T) * HD * (R + kMmaPad);
      const unsigned tiles = ceil_div(d.seq, R);
      const size_t kv_bytes = 4 * rows_bytes + 2 * transposed_bytes + 4 * sizeof(float) * R;
      auto dkdv = dkdv_mma_kernel<T, HD>;
      allow_shared(dkdv, kv_bytes);
      launch(dkdv, dim3(d.groups, d.batch, tiles), kMmaWarps * kWarpSize, kv_bytes, stream, dk, dv,
             dout, lse, D, q, k, v, d);
      const size_t q_bytes = 2 * rows_bytes + transposed_bytes + 2 * sizeof(int) * R;
      auto dqk = dq_mma_kernel<T, HD>;
      allow_shared(dqk, q_bytes);
      launch(dqk, dim3(d.heads, d.batch, tiles), kMmaWarps * kWarpSize, q_bytes, stream, dq, dout,
             lse, D, q, k, v, d);
    };
    if (hd == 64)
      run(std::integral_constant<int, 64>{});
    else
      run(std::integral_constant<int, 128>{});
    return true;
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
    launch(dkdv, dim3(d.groups, d.batch, tiles), Tile::kThreads, kv_bytes, stream, dk, dv, dout,
           lse, D, q, k, v, d);
    const size_t q_bytes = sizeof(float) * (4 * R * ld + R * (R + 1)) + sizeof(int) * 2 * R;
    auto dqk = dq_scalar_kernel<T, MaxHD>;
    allow_shared(dqk, q_bytes);
    launch(dqk, dim3(d.heads, d.batch, tiles), Tile::kThreads, q_bytes, stream, dq, dout, lse, D, q,
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
  if (!backward_mma(dq, dk, dv, dout, lse, D, q, k, v, d, s))
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
