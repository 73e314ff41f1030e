// The router's ops on the device (moe_kernels.h; backend/moe_ops.h for their meaning): top-k
// routing and its backward, the load-balancing and z losses, the expert-bias update. One
// thread per token walks its row of experts in double, in the CPU's order (backend/cpu/
// moe_router.cpp), so the choice of experts, ties included, is the CPU's; the losses' sums
// over tokens are per-token partials added on the host in token order. The load-balancing
// loss's token counts stay in device memory (summed over the context-parallel ranks there).
#include <cmath>
#include <vector>

#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/moe_kernels.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

constexpr int kThreads = 128;
constexpr int kScratchSlot = 20;  // the router's per-token workspace
constexpr double kSigmoidSumEps = 1e-20;

OMNI_DEVICE double sigmoid_d(double x) {
  return 1.0 / (1.0 + ::exp(-x));
}
template <typename T>
OMNI_DEVICE double load(const T* p, size_t i) {
  return double(to_float(p[i]));
}
template <typename T>
OMNI_DEVICE void store(T* p, size_t i, double v) {
  p[i] = from_float<T>(static_cast<float>(v));
}

// The k best of v[0..n) where allowed(i), best first: largest value, ties to the lower index
// (the CPU's partial_sort order). Each pick is the best element after the previous pick in
// that order. Returns the sum of the picked values, added in pick order.
template <typename Allowed>
OMNI_DEVICE double top_k(int32_t* out, const double* v, int n, int k, Allowed allowed) {
  double prev_v = 0, sum = 0;
  int prev_i = -1;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (!allowed(i)) continue;
      if (prev_i >= 0 && !(v[i] < prev_v || (v[i] == prev_v && i > prev_i))) continue;
      if (best < 0 || v[i] > v[best]) best = i;
    }
    if (out) out[j] = best;
    prev_v = v[best], prev_i = best;
    sum += v[best];
  }
  return sum;
}

// softmax of row[0..n) into out (double), the CPU's softmax_row.
template <typename T>
OMNI_DEVICE void softmax_row(double* out, const T* row, int n) {
  double m = -INFINITY;
  for (int i = 0; i < n; ++i) m = fmax(m, load(row, i));
  double s = 0;
  for (int i = 0; i < n; ++i) s += out[i] = ::exp(load(row, i) - m);
  for (int i = 0; i < n; ++i) out[i] /= s;
}

struct RoutingWorkspace {
  double *score, *sel, *group_score;  // [tokens, experts] x 2, [tokens, groups]
  int32_t* groups;                    // [tokens, group_topk]
};

template <typename T>
__global__ void routing_forward_kernel(T* probs, int32_t* indices, const T* logits,
                                       const T* expert_bias, ops::MoERoutingArgs a,
                                       RoutingWorkspace w) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.tokens) return;
  const int E = a.experts, K = a.topk;
  const T* row = logits + size_t(t) * E;
  double* score = w.score + size_t(t) * E;
  double* sel = w.sel + size_t(t) * E;
  int32_t* idx = indices + size_t(t) * K;
  const bool softmax = a.score_function == MoEScoreFunction::Softmax;
  if (softmax && a.pre_softmax) {
    softmax_row(score, row, E);
    for (int e = 0; e < E; ++e) sel[e] = score[e];
  } else if (softmax) {
    for (int e = 0; e < E; ++e) sel[e] = score[e] = load(row, e);
  } else {
    for (int e = 0; e < E; ++e) {
      score[e] = sigmoid_d(load(row, e));
      sel[e] = score[e] + (expert_bias ? load(expert_bias, e) : 0.0);
    }
  }
  if (a.group_topk <= 0) {
    top_k(idx, sel, E, K, [](int) { return true; });
  } else {
    const int G = a.num_groups, per_group = E / G, per_group_k = K / a.group_topk;
    double* gs = w.group_score + size_t(t) * G;
    int32_t* groups = w.groups + size_t(t) * a.group_topk;
    for (int g = 0; g < G; ++g)
      gs[g] = top_k(static_cast<int32_t*>(nullptr), sel + g * per_group, per_group, per_group_k,
                    [](int) { return true; });
    top_k(groups, gs, G, a.group_topk, [](int) { return true; });
    top_k(idx, sel, E, K, [&](int i) {
      for (int j = 0; j < a.group_topk; ++j)
        if (groups[j] == i / per_group) return true;
      return false;
    });
  }
  const double scale = a.scaling_factor != 0 ? a.scaling_factor : 1.0;
  T* out = probs + size_t(t) * K;
  if (softmax && a.pre_softmax) {
    for (int k = 0; k < K; ++k) store(out, k, score[idx[k]] * scale);
  } else if (softmax) {  // softmax over the selected logits
    double m = -INFINITY, s = 0;
    for (int k = 0; k < K; ++k) m = fmax(m, score[idx[k]]);
    for (int k = 0; k < K; ++k) s += ::exp(score[idx[k]] - m);
    for (int k = 0; k < K; ++k) store(out, k, ::exp(score[idx[k]] - m) / s * scale);
  } else {
    double sum = 0;
    for (int k = 0; k < K; ++k) sum += score[idx[k]];
    for (int k = 0; k < K; ++k)
      store(out, k, (K > 1 ? score[idx[k]] / (sum + kSigmoidSumEps) : score[idx[k]]) * scale);
  }
}

template <typename T>
__global__ void routing_backward_kernel(T* dlogits, const T* dprobs, const T* logits,
                                        const int32_t* indices, ops::MoERoutingArgs a) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.tokens) return;
  const int E = a.experts, K = a.topk;
  const bool softmax = a.score_function == MoEScoreFunction::Softmax;
  const double scale = a.scaling_factor != 0 ? a.scaling_factor : 1.0;
  const T* row = logits + size_t(t) * E;
  const int32_t* idx = indices + size_t(t) * K;
  T* out = dlogits + size_t(t) * E;
  auto g = [&](int k) { return scale * load(dprobs, size_t(t) * K + k); };
  for (int e = 0; e < E; ++e) store(out, e, 0.0);
  if (softmax && a.pre_softmax) {
    double m = -INFINITY, s = 0;
    for (int e = 0; e < E; ++e) m = fmax(m, load(row, e));
    for (int e = 0; e < E; ++e) s += ::exp(load(row, e) - m);
    auto score = [&](int e) { return ::exp(load(row, e) - m) / s; };
    double dot = 0;
    for (int k = 0; k < K; ++k) dot += score(idx[k]) * g(k);
    for (int e = 0; e < E; ++e) {
      double d = -score(e) * dot;
      for (int k = 0; k < K; ++k)
        if (idx[k] == e) d += score(e) * g(k);
      store(out, e, d);
    }
  } else if (softmax) {
    double m = -INFINITY, s = 0;
    for (int k = 0; k < K; ++k) m = fmax(m, load(row, idx[k]));
    for (int k = 0; k < K; ++k) s += ::exp(load(row, idx[k]) - m);
    auto p = [&](int k) { return ::exp(load(row, idx[k]) - m) / s; };
    double dot = 0;
    for (int k = 0; k < K; ++k) dot += p(k) * g(k);
    for (int k = 0; k < K; ++k) store(out, idx[k], p(k) * (g(k) - dot));
  } else {
    double sum = 0, dot = 0;
    for (int k = 0; k < K; ++k) sum += sigmoid_d(load(row, idx[k]));
    for (int k = 0; k < K; ++k) dot += g(k) * sigmoid_d(load(row, idx[k]));
    const double denom = sum + kSigmoidSumEps;
    for (int k = 0; k < K; ++k) {
      const double p = sigmoid_d(load(row, idx[k]));
      const double ds = K > 1 ? g(k) / denom - dot / (denom * denom) : g(k);
      store(out, idx[k], ds * p * (1 - p));
    }
  }
}

// The aux loss's scores over all experts [tokens, E] and each token's top K of them.
template <typename T>
__global__ void aux_scores_kernel(double* scores, int32_t* top, const T* logits,
                                  ops::MoEAuxLossArgs a) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.tokens) return;
  const int E = a.experts;
  double* s = scores + size_t(t) * E;
  const T* row = logits + size_t(t) * E;
  if (a.score_function == MoEScoreFunction::Softmax) {
    softmax_row(s, row, E);
  } else {
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += s[e] = sigmoid_d(load(row, e));
    for (int e = 0; e < E; ++e) s[e] /= sum + kSigmoidSumEps;
  }
  top_k(top + size_t(t) * a.topk, s, E, a.topk, [](int) { return true; });
}

// counts[b, e]: sequence b's tokens whose top K include e (one thread per (b, e)).
__global__ void aux_counts_kernel(double* counts, const int32_t* top, int batches, int seq, int E,
                                  int K) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= batches * E) return;
  const int b = i / E, e = i % E;
  double c = 0;
  for (int t = b * seq; t < (b + 1) * seq; ++t)
    for (int k = 0; k < K; ++k) c += top[size_t(t) * K + k] == e;
  counts[i] = c;
}

// partial[t] = sum_e scores[t, e] counts[t's sequence, e]; with dlogits, its gradient added.
template <typename T>
__global__ void aux_partial_kernel(double* partial, T* dlogits, const double* scores,
                                   const double* counts, const T* logits, ops::MoEAuxLossArgs a,
                                   int seq, double g) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.tokens) return;
  const int E = a.experts;
  const double* s = scores + size_t(t) * E;
  const double* c = counts + size_t(t / seq) * E;
  double dot = 0;
  for (int e = 0; e < E; ++e) dot += s[e] * c[e];
  partial[t] = dot;
  if (!dlogits) return;
  T* d = dlogits + size_t(t) * E;
  const T* row = logits + size_t(t) * E;
  if (a.score_function == MoEScoreFunction::Softmax) {
    for (int e = 0; e < E; ++e)
      d[e] = from_float<T>(to_float(d[e]) + static_cast<float>(g * s[e] * (c[e] - dot)));
  } else {
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += sigmoid_d(load(row, e));
    const double denom = sum + kSigmoidSumEps;
    for (int e = 0; e < E; ++e) {
      const double sig = sigmoid_d(load(row, e));
      d[e] = from_float<T>(to_float(d[e]) +
                           static_cast<float>(g * (c[e] - dot) / denom * sig * (1 - sig)));
    }
  }
}

template <typename T>
__global__ void z_lse_kernel(double* lse, const T* logits, int tokens, int E) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const T* row = logits + size_t(t) * E;
  double m = -INFINITY, s = 0;
  for (int e = 0; e < E; ++e) m = fmax(m, load(row, e));
  for (int e = 0; e < E; ++e) s += ::exp(load(row, e) - m);
  lse[t] = m + ::log(s);
}

template <typename T>
__global__ void z_grad_kernel(T* dlogits, const T* logits, const double* lse, int tokens, int E,
                              double scale) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const T* row = logits + size_t(t) * E;
  T* d = dlogits + size_t(t) * E;
  const double g = scale * lse[t];
  for (int e = 0; e < E; ++e)
    d[e] = from_float<T>(to_float(d[e]) + static_cast<float>(g * ::exp(load(row, e) - lse[t])));
}

template <typename T>
__global__ void expert_bias_kernel(T* bias, const double* counts, int E, double rate) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  double total = 0;
  for (int i = 0; i < E; ++i) total += counts[i];
  const double offset = total / E - counts[e];
  const double sign = offset > 0 ? 1.0 : offset < 0 ? -1.0 : 0.0;
  store(bias, e, load(bias, e) + sign * rate);
}

// The workspace's pieces, 8-byte aligned, from one scratch buffer.
struct Carve {
  unsigned char* base;
  size_t used = 0;
  template <typename U>
  U* take(size_t n) {
    U* p = reinterpret_cast<U*>(base + used);
    used += (n * sizeof(U) + 7) / 8 * 8;
    return p;
  }
};

std::vector<double> download_doubles(const double* p, size_t n) {
  std::vector<double> h(n);
  copy_to_host(h.data(), p, n * sizeof(double));
  return h;
}

}  // namespace

template <typename T>
void moe_topk_routing_forward(T* probs, int32_t* indices, const T* logits, const T* expert_bias,
                              const ops::MoERoutingArgs& a, Stream stream) {
  if (a.tokens == 0) return;
  const size_t n = size_t(a.tokens), E = size_t(a.experts);
  const size_t G = a.group_topk > 0 ? size_t(a.num_groups) : 0;
  const size_t gk = a.group_topk > 0 ? size_t(a.group_topk) : 0;
  const size_t bytes = 2 * n * E * 8 + n * G * 8 + (n * gk * 4 + 7) / 8 * 8;
  Carve c{static_cast<unsigned char*>(scratch(bytes, kScratchSlot))};
  RoutingWorkspace w;
  w.score = c.take<double>(n * E), w.sel = c.take<double>(n * E);
  w.group_score = c.take<double>(n * G), w.groups = c.take<int32_t>(n * gk);
  launch(routing_forward_kernel<T>, ceil_div(n, kThreads), kThreads, 0,
         static_cast<gpuStream_t>(stream), probs, indices, logits, expert_bias, a, w);
}

template <typename T>
void moe_topk_routing_backward(T* dlogits, const T* dprobs, const T* logits, const int32_t* indices,
                               const ops::MoERoutingArgs& a, Stream stream) {
  launch(routing_backward_kernel<T>, ceil_div(size_t(a.tokens), kThreads), kThreads, 0,
         static_cast<gpuStream_t>(stream), dlogits, dprobs, logits, indices, a);
}

namespace {
// The tokens of one sequence (of the whole micro-batch for aux_loss), checked.
int aux_sequence(const ops::MoEAuxLossArgs& a) {
  const int seq = a.type == MoELoadBalancing::SeqAuxLoss ? a.seq_length : a.tokens;
  OMNI_CHECK(seq > 0 && a.tokens % seq == 0 && a.topk >= 1 && a.topk <= a.experts && a.shards >= 1,
             "[moe_aux_loss] ", a.tokens, " tokens in sequences of ", seq, ", top-", a.topk, " of ",
             a.experts, " experts, ", a.shards, " shard(s)");
  return seq;
}

// The scores [tokens, E] into `scores`, and each sequence's counts into `counts` (null: not
// wanted), from the workspace `c` (its top-k indices after the caller's pieces).
template <typename T>
void aux_scores_and_counts(double* scores, double* counts, Carve& c, const T* logits,
                           const ops::MoEAuxLossArgs& a, int seq, gpuStream_t s) {
  const size_t n = size_t(a.tokens);
  int32_t* top = c.take<int32_t>(n * a.topk);
  launch(aux_scores_kernel<T>, ceil_div(n, kThreads), kThreads, 0, s, scores, top, logits, a);
  if (counts)
    launch(aux_counts_kernel, ceil_div(n / seq * a.experts, kThreads), kThreads, 0, s, counts, top,
           a.tokens / seq, seq, a.experts, a.topk);
}
}  // namespace

template <typename T>
void moe_aux_loss_counts(double* counts, const T* logits, const ops::MoEAuxLossArgs& a,
                         Stream stream) {
  const int seq = aux_sequence(a);
  const size_t n = size_t(a.tokens);
  Carve c{static_cast<unsigned char*>(
      scratch(n * a.experts * 8 + (n * a.topk * 4 + 7) / 8 * 8, kScratchSlot))};
  double* scores = c.take<double>(n * a.experts);
  aux_scores_and_counts(scores, counts, c, logits, a, seq, static_cast<gpuStream_t>(stream));
}

template <typename T>
double moe_aux_loss(T* dlogits, const T* logits, const ops::MoEAuxLossArgs& a, double grad_scale,
                    Stream stream) {
  const int E = a.experts, K = a.topk;
  const int seq = aux_sequence(a);
  const int batches = a.tokens / seq;
  const size_t n = size_t(a.tokens);
  Carve c{static_cast<unsigned char*>(scratch(
      n * E * 8 + size_t(batches) * E * 8 + n * 8 + (n * K * 4 + 7) / 8 * 8, kScratchSlot))};
  double* scores = c.take<double>(n * E);
  double* own = c.take<double>(size_t(batches) * E);
  double* partial = c.take<double>(n);
  const auto s = static_cast<gpuStream_t>(stream);
  // Under context parallelism the caller's counts (device memory) of the whole sequences.
  aux_scores_and_counts(scores, a.counts ? nullptr : own, c, logits, a, seq, s);
  const double* counts = a.counts ? a.counts : own;
  const double whole = double(seq) * a.shards;  // tokens of a whole sequence (or batch)
  const double factor = double(E) * a.coeff / (double(K) * whole * whole) / batches;
  launch(aux_partial_kernel<T>, ceil_div(n, kThreads), kThreads, 0, s, partial, dlogits, scores,
         counts, logits, a, seq, grad_scale * factor);
  synchronize(stream);
  double loss = 0;
  for (double p : download_doubles(partial, n)) loss += p;
  return loss * factor;
}

template <typename T>
double moe_z_loss(T* dlogits, const T* logits, int tokens, int experts, double coeff,
                  double grad_scale, Stream stream) {
  auto* lse = static_cast<double*>(scratch(size_t(tokens) * 8, kScratchSlot));
  const auto s = static_cast<gpuStream_t>(stream);
  launch(z_lse_kernel<T>, ceil_div(size_t(tokens), kThreads), kThreads, 0, s, lse, logits, tokens,
         experts);
  synchronize(stream);
  double sum = 0;
  for (double l : download_doubles(lse, size_t(tokens))) sum += l * l;
  if (dlogits)
    launch(z_grad_kernel<T>, ceil_div(size_t(tokens), kThreads), kThreads, 0, s, dlogits, logits,
           lse, tokens, experts, grad_scale * coeff * 2 / tokens);
  return coeff * sum / tokens;
}

template <typename T>
void moe_expert_bias_update(T* expert_bias, const double* tokens_per_expert, int experts,
                            double rate, Stream stream) {
  auto* counts = static_cast<double*>(scratch(size_t(experts) * 8, kScratchSlot));
  synchronize(stream);  // the scratch may still be read by an earlier op
  copy_to_device(counts, tokens_per_expert, size_t(experts) * 8);
  launch(expert_bias_kernel<T>, ceil_div(size_t(experts), kThreads), kThreads, 0,
         static_cast<gpuStream_t>(stream), expert_bias, counts, experts, rate);
}

#define OMNI_INSTANTIATE(T)                                                                    \
  template void moe_topk_routing_forward<T>(T*, int32_t*, const T*, const T*,                  \
                                            const ops::MoERoutingArgs&, Stream);               \
  template void moe_topk_routing_backward<T>(T*, const T*, const T*, const int32_t*,           \
                                             const ops::MoERoutingArgs&, Stream);              \
  template double moe_aux_loss<T>(T*, const T*, const ops::MoEAuxLossArgs&, double, Stream);   \
  template void moe_aux_loss_counts<T>(double*, const T*, const ops::MoEAuxLossArgs&, Stream); \
  template double moe_z_loss<T>(T*, const T*, int, int, double, double, Stream);               \
  template void moe_expert_bias_update<T>(T*, const double*, int, double, Stream);
OMNI_INSTANTIATE(float)
OMNI_INSTANTIATE(bf16)
OMNI_INSTANTIATE(f16)
#undef OMNI_INSTANTIATE

OMNI_GPU_NAMESPACE_END
