// Flash attention forward (gpu_ops.h): FlashAttention-2 (Dao 2023). A block owns a tile of
// query rows of one (batch, head) and walks the key tiles its rows can see, keeping per row a
// running max m and sum l of exp(scores - m) (the online softmax: when the max grows from m to
// m', the partial sum and output are rescaled by exp(m - m')); the probability matrix is never
// stored. lse = m + log(l) is saved for the backward.
#include "backend/gpu/attention_common.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

using namespace attention;

// ---- Scalar path: any storage type and head_dim, and AMD ------------------------------------
template <typename T, int MaxHD>
__global__ void __launch_bounds__(ScalarTile<MaxHD>::kThreads)
    forward_scalar_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                          ops::AttentionDims d) {
  using Tile = ScalarTile<MaxHD>;
  constexpr int R = Tile::kRows, kSub = Tile::kSub;
  const int hd = d.head_dim, ld = hd + 1;  // +1: rows of a tile fall in different banks
  const int b = blockIdx.y, h = blockIdx.x, q0 = last_tile_first(R);
  const int g = h / (d.heads / d.groups);
  const int ldq = d.heads * hd, ldk = d.groups * hd;
  const int tid = threadIdx.x, r = tid / kSub, sub = tid % kSub;

  OMNI_DYNAMIC_SHARED(smem);
  float* Qs = reinterpret_cast<float*>(smem);             // [R][ld], pre-scaled by scale * log2(e)
  float* Ks = Qs + R * ld;                                // [R][ld]
  float* Vs = Ks + R * ld;                                // [R][ld]
  float* Ps = Vs + R * ld;                                // [R][R + 1]
  int* first = reinterpret_cast<int*>(Ps + R * (R + 1));  // [R]
  int* last = first + R;                                  // [R]

  const float qscale = kLog2e / sqrtf(static_cast<float>(hd));
  const bool drop = d.dropout.active();
  const float drop_scale = static_cast<float>(d.dropout.scale());
  const T* qb = q + static_cast<size_t>(b) * d.seq * ldq + h * hd;
  const T* kb = k + static_cast<size_t>(b) * d.seq * ldk + g * hd;
  const T* vb = v + static_cast<size_t>(b) * d.seq * ldk + g * hd;
  if (tid < R) {
    const KeyRange kr = key_range(d, b, q0 + tid);
    first[tid] = kr.first, last[tid] = kr.last;
  }
  for (int e = tid; e < R * hd; e += Tile::kThreads) {
    const int row = e / hd, c = e % hd, i = q0 + row;
    Qs[row * ld + c] = i < d.seq ? to_float(qb[static_cast<size_t>(i) * ldq + c]) * qscale : 0.0f;
  }
  __syncthreads();
  // Keys any row of the tile sees: tiles outside [kmin, kmax] are skipped whole.
  int kmin = d.seq, kmax = -1;
  for (int row = 0; row < R; ++row)
    if (first[row] <= last[row]) kmin = imin(kmin, first[row]), kmax = imax(kmax, last[row]);
  const int my_first = first[r], my_last = last[r];

  float m = -INFINITY, l = 0.0f, acc[Tile::kDims];
  OMNI_UNROLL
  for (int e = 0; e < Tile::kDims; ++e) acc[e] = 0.0f;
  for (int k0 = kmin / R * R; k0 <= kmax; k0 += R) {
    __syncthreads();  // the previous tile is no longer read
    for (int e = tid; e < R * hd; e += Tile::kThreads) {
      const int row = e / hd, c = e % hd, j = k0 + row;
      const bool in = j < d.seq;
      Ks[row * ld + c] = in ? to_float(kb[static_cast<size_t>(j) * ldk + c]) : 0.0f;
      Vs[row * ld + c] = in ? to_float(vb[static_cast<size_t>(j) * ldk + c]) : 0.0f;
    }
    __syncthreads();
    float s[Tile::kCols], mx = -INFINITY;
    OMNI_UNROLL
    for (int jj = 0; jj < Tile::kCols; ++jj) {
      const int c = sub + kSub * jj, j = k0 + c;
      float dot = 0.0f;
      for (int x = 0; x < hd; ++x) dot += Qs[r * ld + x] * Ks[c * ld + x];
      s[jj] = (j < my_first || j > my_last) ? -INFINITY : dot;
      mx = fmaxf(mx, s[jj]);
    }
    OMNI_UNROLL
    for (int o = 1; o < kSub; o *= 2) mx = fmaxf(mx, warp_shfl_xor(mx, o));
    const float m_new = fmaxf(m, mx);
    // A row that has seen no key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = exp2f(m - base);
    float sum = 0.0f;
    OMNI_UNROLL
    for (int jj = 0; jj < Tile::kCols; ++jj) {
      const float p = exp2f(s[jj] - base);
      // The sum is the softmax's; dropout scales what multiplies V.
      const int c = sub + kSub * jj;
      Ps[r * (R + 1) + c] = drop ? p * dropout_factor(d, b, h, q0 + r, k0 + c, drop_scale) : p;
      sum += p;
    }
    OMNI_UNROLL
    for (int o = 1; o < kSub; o *= 2) sum += warp_shfl_xor(sum, o);
    l = l * alpha + sum;
    m = m_new;
    __syncthreads();  // the row's probabilities come from its four threads
    OMNI_UNROLL
    for (int e = 0; e < Tile::kDims; ++e) {
      const int c = sub + kSub * e;
      if (c >= hd) continue;
      float o = acc[e] * alpha;
      for (int j = 0; j < R; ++j) o += Ps[r * (R + 1) + j] * Vs[j * ld + c];
      acc[e] = o;
    }
  }

  const int i = q0 + r;
  if (i >= d.seq) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* ob = out + (static_cast<size_t>(b) * d.seq + i) * ldq + h * hd;
  OMNI_UNROLL
  for (int e = 0; e < Tile::kDims; ++e) {
    const int c = sub + kSub * e;
    if (c >= hd) continue;
    ob[c] = from_float<T>(acc[e] * inv);
  }
  if (sub == 0)
    lse[(static_cast<size_t>(b) * d.heads + h) * d.seq + i] =
        l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

// ---- Tensor-core path: bf16/f16, head_dim 64 and 128, NVIDIA (and the emulator) -------------
// Warp w owns query rows 16w..16w+15 of the block. Per key tile: S = Q K^T with Q's A
// fragments held in registers; the S accumulators (rows g and g+8, columns 2t, 2t+1 of each
// 8-key block) are, after the softmax, exactly the A fragments of P for O += P V (the PTX
// accumulator and A layouts agree), so P never goes through shared memory. V is stored
// transposed so that its B fragments (pairs of consecutive keys) are 32-bit loads.
template <typename T, int HD>
__global__ void __launch_bounds__(kMmaWarps* kWarpSize)
    forward_mma_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                       ops::AttentionDims d) {
  constexpr int BK = kMmaRows, kLd = HD + kMmaPad, kLdT = BK + kMmaPad;
  constexpr int KSteps = HD / 16, NKey = BK / 8, NDim = HD / 8;
  const int b = blockIdx.y, h = blockIdx.x, q0 = last_tile_first(kMmaRows);
  const int g_head = h / (d.heads / d.groups);
  const size_t ldq = static_cast<size_t>(d.heads) * HD, ldk = static_cast<size_t>(d.groups) * HD;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;

  OMNI_DYNAMIC_SHARED(smem);
  T* Qs = reinterpret_cast<T*>(smem);  // [64][kLd]
  T* Ks = Qs + kMmaRows * kLd;         // [64][kLd]
  T* Vt = Ks + BK * kLd;               // [HD][kLdT]
  int* first = reinterpret_cast<int*>(Vt + HD * kLdT);
  int* last = first + kMmaRows;

  const T* qb = q + static_cast<size_t>(b) * d.seq * ldq + h * HD;
  const T* kb = k + static_cast<size_t>(b) * d.seq * ldk + g_head * HD;
  const T* vb = v + static_cast<size_t>(b) * d.seq * ldk + g_head * HD;
  load_rows<T, HD>(Qs, qb, q0, d.seq, ldq);
  if (threadIdx.x < kMmaRows) {
    const KeyRange kr = key_range(d, b, q0 + threadIdx.x);
    first[threadIdx.x] = kr.first, last[threadIdx.x] = kr.last;
  }
  __syncthreads();
  // Keys the block sees, and the keys every row of it sees (tiles inside need no mask).
  int kmin = d.seq, kmax = -1, all_from = 0, all_to = d.seq - 1;
  for (int r = 0; r < kMmaRows; ++r) {
    if (first[r] > last[r]) {
      all_to = -1;
      continue;
    }
    kmin = imin(kmin, first[r]), kmax = imax(kmax, last[r]);
    all_from = imax(all_from, first[r]), all_to = imin(all_to, last[r]);
  }
  const int r_lo = warp * 16 + g, r_hi = r_lo + 8;
  const int first_lo = first[r_lo], last_lo = last[r_lo];
  const int first_hi = first[r_hi], last_hi = last[r_hi];

  uint32_t qa[KSteps][4];
  OMNI_UNROLL
  for (int kk = 0; kk < KSteps; ++kk) {
    const int c = 16 * kk + 2 * t;
    qa[kk][0] = load32(Qs + r_lo * kLd + c);
    qa[kk][1] = load32(Qs + r_hi * kLd + c);
    qa[kk][2] = load32(Qs + r_lo * kLd + c + 8);
    qa[kk][3] = load32(Qs + r_hi * kLd + c + 8);
  }
  const float qscale = kLog2e / sqrtf(static_cast<float>(HD));
  const bool drop = d.dropout.active();
  const float drop_scale = static_cast<float>(d.dropout.scale());
  float o[NDim][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int k0 = kmin / BK * BK; k0 <= kmax; k0 += BK) {
    __syncthreads();  // the previous tile is no longer read
    load_rows<T, HD>(Ks, kb, k0, d.seq, ldk);
    load_rows_transposed<T, HD>(Vt, vb, k0, d.seq, ldk);
    __syncthreads();
    float s[NKey][4] = {};
    OMNI_UNROLL
    for (int nb = 0; nb < NKey; ++nb) {
      OMNI_UNROLL
      for (int kk = 0; kk < KSteps; ++kk) {
        const T* kr = Ks + (8 * nb + g) * kLd + 16 * kk + 2 * t;
        const uint32_t kf[2] = {load32(kr), load32(kr + 8)};
        mma_16x8x16<T>(s[nb], qa[kk], kf);
      }
    }
    const bool masked = k0 < all_from || k0 + BK - 1 > all_to;
    float mx[2] = {-INFINITY, -INFINITY};
    OMNI_UNROLL
    for (int nb = 0; nb < NKey; ++nb) {
      OMNI_UNROLL
      for (int e = 0; e < 4; ++e) {
        float x = s[nb][e] * qscale;
        if (masked) {
          const int j = k0 + 8 * nb + 2 * t + (e & 1);
          const bool hi = e >= 2;
          if (j < (hi ? first_hi : first_lo) || j > (hi ? last_hi : last_lo)) x = -INFINITY;
        }
        s[nb][e] = x;
        mx[e / 2] = fmaxf(mx[e / 2], x);
      }
    }
    float alpha[2], base[2], sum[2] = {0.0f, 0.0f};
    OMNI_UNROLL
    for (int x = 0; x < 2; ++x) {
      OMNI_UNROLL
      for (int o2 = 1; o2 < 4; o2 *= 2) mx[x] = fmaxf(mx[x], warp_shfl_xor(mx[x], o2));
      const float m_new = fmaxf(m[x], mx[x]);
      base[x] = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: exp2(-inf - 0) = 0
      alpha[x] = exp2f(m[x] - base[x]);
      m[x] = m_new;
    }
    OMNI_UNROLL
    for (int nb = 0; nb < NKey; ++nb) {
      OMNI_UNROLL
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = exp2f(s[nb][e] - base[e / 2]);
        sum[e / 2] += s[nb][e];
      }
    }
    OMNI_UNROLL
    for (int x = 0; x < 2; ++x) {
      OMNI_UNROLL
      for (int o2 = 1; o2 < 4; o2 *= 2) sum[x] += warp_shfl_xor(sum[x], o2);
      l[x] = l[x] * alpha[x] + sum[x];
    }
    OMNI_UNROLL
    for (int nd = 0; nd < NDim; ++nd) {
      OMNI_UNROLL
      for (int e = 0; e < 4; ++e) o[nd][e] *= alpha[e / 2];
    }
    if (drop) {  // after the softmax's sum: dropout scales what multiplies V
      OMNI_UNROLL
      for (int nb = 0; nb < NKey; ++nb) {
        OMNI_UNROLL
        for (int e = 0; e < 4; ++e)
          s[nb][e] *= dropout_factor(d, b, h, q0 + (e >= 2 ? r_hi : r_lo),
                                     k0 + 8 * nb + 2 * t + (e & 1), drop_scale);
      }
    }
    OMNI_UNROLL
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint32_t pa[4] = {pack_floats<T>(s[2 * kk][0], s[2 * kk][1]),
                              pack_floats<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack_floats<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_floats<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      OMNI_UNROLL
      for (int nd = 0; nd < NDim; ++nd) {
        const T* vr = Vt + (8 * nd + g) * kLdT + 16 * kk + 2 * t;
        const uint32_t vf[2] = {load32(vr), load32(vr + 8)};
        mma_16x8x16<T>(o[nd], pa, vf);
      }
    }
  }

  float* lse_row = lse + (static_cast<size_t>(b) * d.heads + h) * d.seq;
  OMNI_UNROLL
  for (int x = 0; x < 2; ++x) {
    const int i = q0 + (x ? r_hi : r_lo);
    if (i >= d.seq) continue;
    const float inv = l[x] > 0.0f ? 1.0f / l[x] : 0.0f;
    T* ob = out + static_cast<size_t>(i) * ldq + static_cast<size_t>(b) * d.seq * ldq + h * HD;
    OMNI_UNROLL
    for (int nd = 0; nd < NDim; ++nd)
      store32(ob + 8 * nd + 2 * t, pack_floats<T>(o[nd][2 * x] * inv, o[nd][2 * x + 1] * inv));
    if (t == 0) lse_row[i] = l[x] > 0.0f ? (m[x] + log2f(l[x])) * kLn2 : -INFINITY;
  }
}

template <typename T>
bool forward_mma(T* out, float* lse, const T* q, const T* k, const T* v,
                 const ops::AttentionDims& d, gpuStream_t stream) {
  if constexpr (!kHasMma16816 || std::is_same_v<T, float>) {
    return false;
  } else {
    const int hd = d.head_dim;
    if ((hd != 64 && hd != 128) || !aligned16(q, size_t(d.heads) * hd, sizeof(T)) ||
        !aligned16(k, size_t(d.groups) * hd, sizeof(T)) ||
        !aligned16(v, size_t(d.groups) * hd, sizeof(T)) ||
        !aligned16(out, size_t(d.heads) * hd, sizeof(T)))
      return false;
    auto run = [&](auto head_dim) {
      constexpr int HD = decltype(head_dim)::value;
      const size_t bytes = sizeof(T) * (2 * kMmaRows * (HD + kMmaPad) + HD * (kMmaRows + kMmaPad)) +
                           sizeof(int) * 2 * kMmaRows;
      auto kernel = forward_mma_kernel<T, HD>;
      allow_shared(kernel, bytes);
      launch(kernel, dim3(d.heads, d.batch, ceil_div(d.seq, kMmaRows)), kMmaWarps * kWarpSize,
             bytes, stream, out, lse, q, k, v, d);
    };
    if (hd == 64)
      run(std::integral_constant<int, 64>{});
    else
      run(std::integral_constant<int, 128>{});
    return true;
  }
}

template <typename T>
void forward_scalar(T* out, float* lse, const T* q, const T* k, const T* v,
                    const ops::AttentionDims& d, gpuStream_t stream) {
  with_max_head_dim(d.head_dim, [&](auto max_hd) {
    constexpr int MaxHD = decltype(max_hd)::value;
    using Tile = ScalarTile<MaxHD>;
    constexpr int R = Tile::kRows;
    const int ld = d.head_dim + 1;
    const size_t bytes = sizeof(float) * (3 * R * ld + R * (R + 1)) + sizeof(int) * 2 * R;
    auto kernel = forward_scalar_kernel<T, MaxHD>;
    allow_shared(kernel, bytes);
    launch(kernel, dim3(d.heads, d.batch, ceil_div(d.seq, R)), Tile::kThreads, bytes, stream, out,
           lse, q, k, v, d);
  });
}

}  // namespace

template <typename T>
void flash_attention_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                             const ops::AttentionDims& d, Stream stream) {
  check_dims(d, "flash_attention_forward");
  const auto s = static_cast<gpuStream_t>(stream);
  if (!forward_mma(out, lse, q, k, v, d, s)) forward_scalar(out, lse, q, k, v, d, s);
}

#define OMNI_INSTANTIATE(T)                                                          \
  template void flash_attention_forward<T>(T*, float*, const T*, const T*, const T*, \
                                           const ops::AttentionDims&, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
