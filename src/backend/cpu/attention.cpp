// Causal attention on the CPU. Each (batch, head) pair is independent; its matmuls go
// through single-threaded gemm calls inside one OpenMP region (OpenBLAS runs serially
// when called from a parallel region). Rows are processed in blocks of kRowBlock so that
// a block only touches keys [0, row_end): causality halves the work.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/dropout_words.h"
#include "backend/cpu/reduce.h"
#include "backend/dropout_mask.h"
#include "backend/ops.h"

namespace omni::ops {

namespace {
constexpr int kRowBlock = 64;
}

template <typename T>
void qkv_split(T* q, T* k, T* v, const T* qkv, const AttentionDims& d) {
  const int N = d.batch * d.seq, hd = d.head_dim, hpg = d.heads_per_group();
  const int W = d.qkv_width(), group_w = (hpg + 2) * hd;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* row = qkv + static_cast<size_t>(n) * W;
    for (int g = 0; g < d.groups; ++g) {
      const T* src = row + g * group_w;
      std::memcpy(q + (static_cast<size_t>(n) * d.heads + g * hpg) * hd, src, hpg * hd * sizeof(T));
      std::memcpy(k + (static_cast<size_t>(n) * d.groups + g) * hd, src + hpg * hd, hd * sizeof(T));
      std::memcpy(v + (static_cast<size_t>(n) * d.groups + g) * hd, src + (hpg + 1) * hd,
                  hd * sizeof(T));
    }
  }
}

template <typename T>
void qkv_merge(T* qkv, const T* q, const T* k, const T* v, const AttentionDims& d) {
  const int N = d.batch * d.seq, hd = d.head_dim, hpg = d.heads_per_group();
  const int W = d.qkv_width(), group_w = (hpg + 2) * hd;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* row = qkv + static_cast<size_t>(n) * W;
    for (int g = 0; g < d.groups; ++g) {
      T* dst = row + g * group_w;
      std::memcpy(dst, q + (static_cast<size_t>(n) * d.heads + g * hpg) * hd, hpg * hd * sizeof(T));
      std::memcpy(dst + hpg * hd, k + (static_cast<size_t>(n) * d.groups + g) * hd, hd * sizeof(T));
      std::memcpy(dst + (hpg + 1) * hd, v + (static_cast<size_t>(n) * d.groups + g) * hd,
                  hd * sizeof(T));
    }
  }
}

void rope_tables(double* cos, double* sin, int seq, const std::vector<double>& inv_freq) {
  const size_t half = inv_freq.size();
  for (int p = 0; p < seq; ++p)
    for (size_t i = 0; i < half; ++i) {
      cos[p * half + i] = std::cos(p * inv_freq[i]);
      sin[p * half + i] = std::sin(p * inv_freq[i]);
    }
}

void rope_tables(double* cos, double* sin, int seq, int head_dim, double base) {
  const int half = head_dim / 2;
  for (int p = 0; p < seq; ++p)
    for (int i = 0; i < half; ++i) {
      double inv_freq = std::pow(base, -2.0 * i / head_dim);
      cos[p * half + i] = std::cos(p * inv_freq);
      sin[p * half + i] = std::sin(p * inv_freq);
    }
}

// sign = +1 rotates by the position's angle (forward), -1 by its negative (backward:
// the Jacobian of a rotation is the rotation, so its transpose rotates back).
template <typename T>
static void rope_apply(T* x, const double* cos, const double* sin, int N, int seq, int nheads,
                       int hd, const int32_t* positions, double sign, int rotary_dim) {
  const int half = (rotary_dim > 0 ? rotary_dim : hd) / 2;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const size_t pos = static_cast<size_t>(positions ? positions[n] : n % seq);
    const double* c = cos + pos * half;
    const double* s = sin + pos * half;
    for (int h = 0; h < nheads; ++h) {
      T* r = x + (static_cast<size_t>(n) * nheads + h) * hd;
      for (int i = 0; i < half; ++i) {
        T x1 = r[i], x2 = r[i + half];
        T ci = T(c[i]), si = T(sign * s[i]);
        r[i] = x1 * ci - x2 * si;
        r[i + half] = x2 * ci + x1 * si;
      }
    }
  }
}

template <typename T>
void rope_forward(T* x, const double* cos, const double* sin, int N, int seq, int nheads, int hd,
                  const int32_t* positions, int rotary_dim) {
  rope_apply(x, cos, sin, N, seq, nheads, hd, positions, 1.0, rotary_dim);
}
template <typename T>
void rope_backward(T* dx, const double* cos, const double* sin, int N, int seq, int nheads, int hd,
                   const int32_t* positions, int rotary_dim) {
  rope_apply(dx, cos, sin, N, seq, nheads, hd, positions, -1.0, rotary_dim);
}

namespace {

template <typename T>
T softmax_scale(const AttentionDims& d) {
  return d.softmax_scale > 0 ? T(d.softmax_scale) : T(1) / std::sqrt(T(d.head_dim));
}

// Row i of sequence b attends keys [first_key, last_key] of that sequence.
int last_key(const AttentionDims& d, int b, int i) {
  return d.q_index ? d.q_index[static_cast<size_t>(b) * d.seq + i] : i;
}
int first_key(const AttentionDims& d, int b, int i) {
  return d.key_start ? d.key_start[static_cast<size_t>(b) * d.seq + i] : 0;
}
// Keys a block of rows [r0, r1) can see: [0, returned).
int block_keys(const AttentionDims& d, int b, int r0, int r1) {
  int end = 0;
  for (int i = r0; i < r1; ++i) end = std::max(end, last_key(d, b, i) + 1);
  return end;
}

// Scores of rows [r0, r1) against keys [0, kend): S = scale q k^T into P (leading dimension
// ld), then each row i's probabilities exp(S - lse_i) over its keys [first, last] and 0
// elsewhere, given lse; or, when lse is to be computed (`find_lse`), the softmax, writing lse.
template <typename T>
void row_block_probabilities(T* P, int ld, const T* qb, int ldq, const T* kb, int ldk,
                             const AttentionDims& d, int b, int r0, int r1, int kend, T scale,
                             T* lse_rows, bool find_lse) {
  gemm<T>(false, true, r1 - r0, kend, d.head_dim, scale, qb + static_cast<size_t>(r0) * ldq, ldq,
          kb, ldk, T(0), P, ld);
  for (int i = r0; i < r1; ++i) {
    T* row = P + static_cast<size_t>(i - r0) * ld;
    const int j0 = first_key(d, b, i), j1 = last_key(d, b, i);
    if (j1 < j0) {
      std::fill(row, row + kend, T(0));
      if (find_lse) lse_rows[i] = -std::numeric_limits<T>::infinity();
      continue;
    }
    T shift = lse_rows[i];
    if (find_lse) {
      T mx = std::numeric_limits<T>::lowest();
      for (int j = j0; j <= j1; ++j) mx = std::max(mx, row[j]);
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int j = j0; j <= j1; ++j) sum += std::exp(row[j] - mx);
      shift = lse_rows[i] = mx + std::log(sum);
    }
#pragma omp simd
    for (int j = j0; j <= j1; ++j) row[j] = std::exp(row[j] - shift);
    std::fill(row, row + j0, T(0));
    std::fill(row + j1 + 1, row + kend, T(0));
  }
}

// Attention dropout's Philox words for the keys [j0, j1] of row i (head h, sequence b): calls
// f(j, count, words) for runs of keys j.. j + count - 1, words[m] being key j + m's word (a
// probability is kept, and scaled by 1/(1-p), where its word is at least the threshold).
// Under context parallelism the block's keys are two runs of consecutive positions.
template <typename F>
void for_each_dropout_run(const AttentionDims& d, int b, int h, int i, int j0, int j1, F&& f) {
  const DropoutKey& k = d.dropout;
  const int64_t sample = k.first_sample + b;
  const int half = k.cp > 1 ? d.seq / 2 : d.seq;
  for (int a = j0; a <= j1;) {
    const int stop = a < half ? std::min(j1 + 1, half) : j1 + 1;
    dropout::for_each_word_run(
        k, sample, dropout::attention_element(k, d.seq, h, i, a), stop - a,
        [&](int64_t at, int64_t count, const uint32_t* w) { f(a + int(at), int(count), w); });
    a = stop;
  }
}

// Rows [r0, r1) of probabilities P (leading dimension ld) times their dropout factors.
template <typename T>
void drop_probabilities(T* P, int ld, const AttentionDims& d, int b, int h, int r0, int r1) {
  const T scale = T(d.dropout.scale());
  const uint32_t threshold = d.dropout.threshold;
  for (int i = r0; i < r1; ++i) {
    T* row = P + static_cast<size_t>(i - r0) * ld;
    for_each_dropout_run(d, b, h, i, first_key(d, b, i), last_key(d, b, i),
                         [&](int j, int count, const uint32_t* w) {
                           T* p = row + j;
#pragma omp simd
                           for (int m = 0; m < count; ++m)
                             p[m] = w[m] >= threshold ? p[m] * scale : T(0);
                         });
  }
}

}  // namespace

template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttentionDims& d) {
  const int S = d.seq, H = d.heads, G = d.groups, hd = d.head_dim, vd = d.v_dim();
  const int hpg = d.heads_per_group(), ldq = H * hd, ldk = G * hd, ldv = G * vd, ldo = H * vd;
  const T scale = softmax_scale<T>(d);
#pragma omp parallel
  {
    std::vector<T> P(static_cast<size_t>(kRowBlock) * S);
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < d.batch * H; ++bh) {
      const int b = bh / H, h = bh % H, g = h / hpg;
      const T* qb = q + static_cast<size_t>(b) * S * ldq + h * hd;
      const T* kb = k + static_cast<size_t>(b) * S * ldk + g * hd;
      const T* vb = v + static_cast<size_t>(b) * S * ldv + g * vd;
      T* ob = out + static_cast<size_t>(b) * S * ldo + h * vd;
      T* lse_rows = lse + static_cast<size_t>(bh) * S;
      for (int r0 = 0; r0 < S; r0 += kRowBlock) {
        const int r1 = std::min(S, r0 + kRowBlock), rows = r1 - r0;
        const int kend = block_keys(d, b, r0, r1);
        if (kend == 0) {  // no row of the block sees a key
          for (int i = r0; i < r1; ++i) {
            std::fill(ob + static_cast<size_t>(i) * ldo, ob + static_cast<size_t>(i) * ldo + vd,
                      T(0));
            lse_rows[i] = -std::numeric_limits<T>::infinity();
          }
          continue;
        }
        row_block_probabilities(P.data(), S, qb, ldq, kb, ldk, d, b, r0, r1, kend, scale, lse_rows,
                                true);
        if (d.dropout.active()) drop_probabilities(P.data(), S, d, b, h, r0, r1);
        gemm<T>(false, false, rows, vd, kend, T(1), P.data(), S, vb, ldv, T(0),
                ob + static_cast<size_t>(r0) * ldo, ldo);
      }
    }
  }
}

// Per row i: P_ij = exp(s_ij - lse_i), dS_ij = P_ij (dP_ij - D_i) with D_i = dO_i . O_i
// (= sum_j P_ij dP_ij when O is this block's attention alone; with O and lse of attention
// over several blocks, this block's part of the gradient). Work is split by (batch, group) so
// the heads sharing a key/value head accumulate into dk/dv from one thread, in a fixed order.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, const AttentionDims& d) {
  const int S = d.seq, H = d.heads, G = d.groups, hd = d.head_dim, vd = d.v_dim();
  const int hpg = d.heads_per_group(), ldq = H * hd, ldk = G * hd, ldv = G * vd, ldo = H * vd;
  const T scale = softmax_scale<T>(d);
#pragma omp parallel
  {
    std::vector<T> P(static_cast<size_t>(kRowBlock) * S), dS(static_cast<size_t>(kRowBlock) * S);
#pragma omp for schedule(dynamic, 1)
    for (int bg = 0; bg < d.batch * G; ++bg) {
      const int b = bg / G, g = bg % G;
      const T* kb = k + static_cast<size_t>(b) * S * ldk + g * hd;
      const T* vb = v + static_cast<size_t>(b) * S * ldv + g * vd;
      T* dkb = dk + static_cast<size_t>(b) * S * ldk + g * hd;
      T* dvb = dv + static_cast<size_t>(b) * S * ldv + g * vd;
      for (int s = 0; s < S; ++s) {
        std::fill(dkb + static_cast<size_t>(s) * ldk, dkb + static_cast<size_t>(s) * ldk + hd,
                  T(0));
        std::fill(dvb + static_cast<size_t>(s) * ldv, dvb + static_cast<size_t>(s) * ldv + vd,
                  T(0));
      }
      for (int h = g * hpg; h < (g + 1) * hpg; ++h) {
        const size_t qoff = static_cast<size_t>(b) * S * ldq + h * hd;
        const size_t ooff = static_cast<size_t>(b) * S * ldo + h * vd;
        const T* lse_rows = lse + (static_cast<size_t>(b) * H + h) * S;
        for (int r0 = 0; r0 < S; r0 += kRowBlock) {
          const int r1 = std::min(S, r0 + kRowBlock), rows = r1 - r0;
          const int kend = block_keys(d, b, r0, r1);
          const T* dOb = dout + ooff + static_cast<size_t>(r0) * ldo;
          if (kend == 0) {  // no row of the block sees a key
            for (int i = r0; i < r1; ++i)
              std::fill(dq + qoff + static_cast<size_t>(i) * ldq,
                        dq + qoff + static_cast<size_t>(i) * ldq + hd, T(0));
            continue;
          }
          row_block_probabilities(P.data(), S, q + qoff, ldq, kb, ldk, d, b, r0, r1, kend, scale,
                                  const_cast<T*>(lse_rows), false);
          // dP = dO V^T (of the probabilities after dropout, P Z with Z the mask's factors)
          gemm<T>(false, true, rows, kend, vd, T(1), dOb, ldo, vb, ldv, T(0), dS.data(), S);
          for (int i = r0; i < r1; ++i) {
            const T* o = out + ooff + static_cast<size_t>(i) * ldo;
            const T* go = dout + ooff + static_cast<size_t>(i) * ldo;
            T D = 0;
            for (int c = 0; c < vd; ++c) D += go[c] * o[c];
            T* p = P.data() + static_cast<size_t>(i - r0) * S;
            T* ds = dS.data() + static_cast<size_t>(i - r0) * S;
            if (!d.dropout.active()) {
#pragma omp simd
              for (int j = 0; j < kend; ++j) ds[j] = p[j] * (ds[j] - D);
              continue;
            }
            // dS = P (Z dP - D) (D = dO . O is still sum_j P_ij Z_ij dP_ij); P becomes P Z
            // for dV. Keys outside [first, last] have P = 0.
            const int j0 = first_key(d, b, i), j1 = last_key(d, b, i);
            for (int j = 0; j < kend; ++j)
              if (j < j0 || j > j1) ds[j] = T(0);
            const T keep = T(d.dropout.scale());
            const uint32_t threshold = d.dropout.threshold;
            for_each_dropout_run(d, b, h, i, j0, j1, [&](int j, int count, const uint32_t* w) {
              T *pj = p + j, *dsj = ds + j;
#pragma omp simd
              for (int m = 0; m < count; ++m) {
                const T z = w[m] >= threshold ? keep : T(0);
                dsj[m] = pj[m] * (z * dsj[m] - D);
                pj[m] *= z;
              }
            });
          }
          // dV[0:kend] += (P Z)^T dO
          gemm<T>(true, false, kend, vd, rows, T(1), P.data(), S, dOb, ldo, T(1), dvb, ldv);
          // dQ = scale dS K ; dK[0:kend] += scale dS^T Q
          gemm<T>(false, false, rows, hd, kend, scale, dS.data(), S, kb, ldk, T(0),
                  dq + qoff + static_cast<size_t>(r0) * ldq, ldq);
          gemm<T>(true, false, kend, hd, rows, scale, dS.data(), S,
                  q + qoff + static_cast<size_t>(r0) * ldq, ldq, T(1), dkb, ldk);
        }
      }
    }
  }
}

template <typename T>
void attention_merge(T* out, T* lse, const T* block_out, const T* block_lse,
                     const AttentionDims& d) {
  const int H = d.heads, hd = d.v_dim();
  constexpr T kNone = -std::numeric_limits<T>::infinity();
#pragma omp parallel for schedule(static)
  for (int bh = 0; bh < d.batch * H; ++bh)
    for (int i = 0; i < d.seq; ++i) {
      const int b = bh / H, h = bh % H;
      const size_t row = static_cast<size_t>(bh) * d.seq + i;
      const T lb = block_lse[row], lm = lse[row];
      if (lb == kNone) continue;
      const T m = std::max(lb, lm), total = m + std::log(std::exp(lm - m) + std::exp(lb - m));
      const T keep = std::exp(lm - total), add = std::exp(lb - total);
      const size_t at = (static_cast<size_t>(b) * d.seq + i) * H * hd + static_cast<size_t>(h) * hd;
      for (int c = 0; c < hd; ++c) out[at + c] = out[at + c] * keep + block_out[at + c] * add;
      lse[row] = total;
    }
}

#define INSTANTIATE(T)                                                                            \
  template void qkv_split<T>(T*, T*, T*, const T*, const AttentionDims&);                         \
  template void qkv_merge<T>(T*, const T*, const T*, const T*, const AttentionDims&);             \
  template void rope_forward<T>(T*, const double*, const double*, int, int, int, int,             \
                                const int32_t*, int);                                             \
  template void rope_backward<T>(T*, const double*, const double*, int, int, int, int,            \
                                 const int32_t*, int);                                            \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*, const AttentionDims&); \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,         \
                                      const T*, const T*, const AttentionDims&);                  \
  template void attention_merge<T>(T*, T*, const T*, const T*, const AttentionDims&);
OMNI_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace omni::ops
