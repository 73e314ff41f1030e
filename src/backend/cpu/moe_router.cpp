// The router's ops: top-k routing with its score functions and group limits, the
// load-balancing and z losses, and the aux-loss-free expert bias update (Megatron-Core's
// moe_utils.py: topk_routing_with_score_function, group_limited_topk,
// compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func, z_loss_func,
// get_updated_expert_bias). Scores are computed in double whatever T is.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/reduce.h"
#include "backend/moe_ops.h"
#include "base/error.h"

namespace omni {
const char* to_string(MoEScoreFunction f) {
  return f == MoEScoreFunction::Softmax ? "softmax" : "sigmoid";
}
const char* to_string(MoELoadBalancing b) {
  switch (b) {
    case MoELoadBalancing::AuxLoss:
      return "aux_loss";
    case MoELoadBalancing::SeqAuxLoss:
      return "seq_aux_loss";
    case MoELoadBalancing::None:
      return "none";
  }
  return "?";
}
const char* to_string(MoETokenDropPolicy p) {
  return p == MoETokenDropPolicy::Probs ? "probs" : "position";
}
}  // namespace omni

namespace omni::ops {

namespace {

// Megatron's normalisation guard of the sigmoid scores.
constexpr double kSigmoidSumEps = 1e-20;

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// softmax of row[0..n) into out.
template <typename T>
void softmax_row(double* out, const T* row, int n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) m = std::max(m, double(row[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += out[i] = std::exp(double(row[i]) - m);
  for (int i = 0; i < n; ++i) out[i] /= s;
}

// The k largest of v[0..n) where allowed (null: all), largest first, ties to the lower index
// (torch.topk's order for distinct values; its order among equal values is unspecified).
void top_k(int32_t* out, const double* v, int n, int k, const std::vector<char>* allowed,
           std::vector<int32_t>& scratch) {
  scratch.clear();
  for (int i = 0; i < n; ++i)
    if (!allowed || (*allowed)[i]) scratch.push_back(i);
  auto before = [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(), before);
  std::copy(scratch.begin(), scratch.begin() + k, out);
}

// The k experts of row t by selection score sel[0..E), within the group limits.
void select_experts(int32_t* out, const double* sel, const MoERoutingArgs& a,
                    std::vector<int32_t>& scratch) {
  if (a.group_topk <= 0) return top_k(out, sel, a.experts, a.topk, nullptr, scratch);
  const int G = a.num_groups, per_group = a.experts / G, per_group_k = a.topk / a.group_topk;
  std::vector<double> group_score(G);
  std::vector<int32_t> best(per_group_k);
  for (int g = 0; g < G; ++g) {
    top_k(best.data(), sel + g * per_group, per_group, per_group_k, nullptr, scratch);
    double s = 0;
    for (int32_t i : best) s += sel[g * per_group + i];
    group_score[g] = s;
  }
  std::vector<int32_t> groups(a.group_topk);
  top_k(groups.data(), group_score.data(), G, a.group_topk, nullptr, scratch);
  std::vector<char> allowed(a.experts, 0);
  for (int32_t g : groups) std::fill_n(allowed.begin() + g * per_group, per_group, 1);
  top_k(out, sel, a.experts, a.topk, &allowed, scratch);
}

void check_routing(const MoERoutingArgs& a) {
  OMNI_CHECK(a.topk >= 1 && a.topk <= a.experts, "[moe_topk_routing] top-k ", a.topk, " of ",
             a.experts, " experts");
  if (a.group_topk > 0) {
    OMNI_CHECK(a.num_groups > 0 && a.experts % a.num_groups == 0 && a.group_topk <= a.num_groups &&
                   a.topk >= a.group_topk && a.topk / a.group_topk <= a.experts / a.num_groups &&
                   a.topk <= a.group_topk * (a.experts / a.num_groups),
               "[moe_topk_routing] groups ", a.num_groups, ", group top-k ", a.group_topk,
               ", top-k ", a.topk, ", experts ", a.experts);
  }
}

}  // namespace

template <typename T>
void moe_topk_routing_forward(T* probs, int32_t* indices, const T* logits, const T* expert_bias,
                              const MoERoutingArgs& a) {
  check_routing(a);
  const int E = a.experts, K = a.topk;
  const bool softmax = a.score_function == MoEScoreFunction::Softmax;
  const double scale = a.scaling_factor != 0 ? a.scaling_factor : 1.0;
#pragma omp parallel
  {
    std::vector<double> score(E), sel(E), p(K);
    std::vector<int32_t> scratch;
#pragma omp for schedule(static)
    for (int t = 0; t < a.tokens; ++t) {
      const T* row = logits + static_cast<size_t>(t) * E;
      int32_t* idx = indices + static_cast<size_t>(t) * K;
      T* out = probs + static_cast<size_t>(t) * K;
      if (softmax && a.pre_softmax) {
        softmax_row(score.data(), row, E);
        select_experts(idx, score.data(), a, scratch);
        for (int k = 0; k < K; ++k) p[k] = score[idx[k]];
      } else if (softmax) {
        for (int e = 0; e < E; ++e) score[e] = row[e];
        select_experts(idx, score.data(), a, scratch);
        for (int k = 0; k < K; ++k) p[k] = score[idx[k]];
        softmax_row(p.data(), p.data(), K);
      } else {
        for (int e = 0; e < E; ++e) {
          score[e] = sigmoid(row[e]);
          sel[e] = score[e] + (expert_bias ? double(expert_bias[e]) : 0.0);
        }
        select_experts(idx, sel.data(), a, scratch);
        double sum = 0;
        for (int k = 0; k < K; ++k) sum += p[k] = score[idx[k]];
        if (K > 1)
          for (int k = 0; k < K; ++k) p[k] /= sum + kSigmoidSumEps;
      }
      for (int k = 0; k < K; ++k) out[k] = T(p[k] * scale);
    }
  }
}

template <typename T>
void moe_topk_routing_backward(T* dlogits, const T* dprobs, const T* logits, const int32_t* indices,
                               const MoERoutingArgs& a) {
  const int E = a.experts, K = a.topk;
  const bool softmax = a.score_function == MoEScoreFunction::Softmax;
  const double scale = a.scaling_factor != 0 ? a.scaling_factor : 1.0;
#pragma omp parallel
  {
    std::vector<double> score(E), grad(E), p(K), g(K);
#pragma omp for schedule(static)
    for (int t = 0; t < a.tokens; ++t) {
      const T* row = logits + static_cast<size_t>(t) * E;
      const int32_t* idx = indices + static_cast<size_t>(t) * K;
      T* out = dlogits + static_cast<size_t>(t) * E;
      for (int k = 0; k < K; ++k) g[k] = scale * double(dprobs[static_cast<size_t>(t) * K + k]);
      std::fill(grad.begin(), grad.end(), 0.0);
      if (softmax && a.pre_softmax) {
        // probs_k = s[idx_k], s = softmax(row): d row_e = s_e (ds_e - sum_i s_i ds_i).
        softmax_row(score.data(), row, E);
        double dot = 0;
        for (int k = 0; k < K; ++k) dot += score[idx[k]] * g[k];
        for (int e = 0; e < E; ++e) grad[e] = -score[e] * dot;
        for (int k = 0; k < K; ++k) grad[idx[k]] += score[idx[k]] * g[k];
      } else if (softmax) {
        // probs = softmax of the selected logits.
        for (int k = 0; k < K; ++k) p[k] = row[idx[k]];
        softmax_row(p.data(), p.data(), K);
        double dot = 0;
        for (int k = 0; k < K; ++k) dot += p[k] * g[k];
        for (int k = 0; k < K; ++k) grad[idx[k]] = p[k] * (g[k] - dot);
      } else {
        // probs_k = s_k / (S + eps) (K > 1), s = sigmoid: ds_k = g_k / (S + eps) -
        // sum_i g_i s_i / (S + eps)^2, then ds/dlogit = s (1 - s).
        double sum = 0;
        for (int k = 0; k < K; ++k) sum += p[k] = sigmoid(double(row[idx[k]]));
        double dot = 0;
        for (int k = 0; k < K; ++k) dot += g[k] * p[k];
        const double denom = sum + kSigmoidSumEps;
        for (int k = 0; k < K; ++k) {
          const double ds = K > 1 ? g[k] / denom - dot / (denom * denom) : g[k];
          grad[idx[k]] = ds * p[k] * (1 - p[k]);
        }
      }
      for (int e = 0; e < E; ++e) out[e] = T(grad[e]);
    }
  }
}

namespace {
// The load-balancing scores of every row: the softmax over all E (sigmoid: normalised).
template <typename T>
std::vector<double> aux_loss_scores(const T* logits, const MoEAuxLossArgs& a) {
  const int E = a.experts;
  const bool softmax = a.score_function == MoEScoreFunction::Softmax;
  std::vector<double> scores(static_cast<size_t>(a.tokens) * E);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < a.tokens; ++t) {
    double* s = scores.data() + static_cast<size_t>(t) * E;
    const T* row = logits + static_cast<size_t>(t) * E;
    if (softmax) {
      softmax_row(s, row, E);
    } else {
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += s[e] = sigmoid(row[e]);
      for (int e = 0; e < E; ++e) s[e] /= sum + kSigmoidSumEps;
    }
  }
  return scores;
}

int aux_loss_sequence(const MoEAuxLossArgs& a) {
  const int seq = a.type == MoELoadBalancing::SeqAuxLoss ? a.seq_length : a.tokens;
  OMNI_CHECK(seq > 0 && a.tokens % seq == 0, "[moe_aux_loss] ", a.tokens,
             " tokens in sequences of ", seq);
  OMNI_CHECK(a.topk >= 1 && a.topk <= a.experts, "[moe_aux_loss] top-k ", a.topk, " of ", a.experts,
             " experts");
  OMNI_CHECK(a.shards >= 1, "[moe_aux_loss] ", a.shards, " shards");
  return seq;
}

std::vector<double> counts_of(const std::vector<double>& scores, const MoEAuxLossArgs& a, int seq) {
  const int E = a.experts, K = a.topk;
  std::vector<double> counts(static_cast<size_t>(a.tokens / seq) * E, 0.0);
  std::vector<int32_t> idx(K), scratch;
  for (int t = 0; t < a.tokens; ++t) {
    top_k(idx.data(), scores.data() + static_cast<size_t>(t) * E, E, K, nullptr, scratch);
    for (int32_t e : idx) counts[static_cast<size_t>(t / seq) * E + e] += 1;
  }
  return counts;
}
}  // namespace

template <typename T>
std::vector<double> moe_aux_loss_counts(const T* logits, const MoEAuxLossArgs& a) {
  const int seq = aux_loss_sequence(a);
  return counts_of(aux_loss_scores(logits, a), a, seq);
}

template <typename T>
double moe_aux_loss(T* dlogits, const T* logits, const MoEAuxLossArgs& a, double grad_scale) {
  const int E = a.experts, K = a.topk;
  const int seq = aux_loss_sequence(a);
  const int batches = a.tokens / seq;
  const bool softmax = a.score_function == MoEScoreFunction::Softmax;

  // Scores over all experts, and each sequence's tokens per expert among their top K (over
  // every shard of the sequence when given).
  const std::vector<double> scores = aux_loss_scores(logits, a);
  std::vector<double> own;
  if (!a.counts) own = counts_of(scores, a, seq);
  const double* counts = a.counts ? a.counts : own.data();
  const double whole = double(seq) * a.shards;  // tokens of a whole sequence (or batch)
  // loss = factor sum_b sum_e count[b, e] sum_{t in b} scores[t, e].
  const double factor = double(E) * a.coeff / (double(K) * whole * whole) / batches;
  double loss = 0;
  for (int t = 0; t < a.tokens; ++t) {
    const double* s = scores.data() + static_cast<size_t>(t) * E;
    const double* c = counts + static_cast<size_t>(t / seq) * E;
    for (int e = 0; e < E; ++e) loss += s[e] * c[e];
  }
  loss *= factor;
  if (!dlogits) return loss;

#pragma omp parallel for schedule(static)
  for (int t = 0; t < a.tokens; ++t) {
    const double* s = scores.data() + static_cast<size_t>(t) * E;
    const double* c = counts + static_cast<size_t>(t / seq) * E;
    T* d = dlogits + static_cast<size_t>(t) * E;
    const double g = grad_scale * factor;  // d loss / d scores[t, e] = g c[e]
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += s[e] * c[e];
    if (softmax) {
      for (int e = 0; e < E; ++e) d[e] += T(g * s[e] * (c[e] - dot));
    } else {
      // s = sig / (S + eps): d sig_e = g (c_e - sum_i c_i s_i) / (S + eps), and
      // d logit = d sig sig (1 - sig). S + eps = sig_e / s_e, recomputed from the logits.
      double sum = 0;
      for (int e = 0; e < E; ++e) sum += sigmoid(double(logits[static_cast<size_t>(t) * E + e]));
      const double denom = sum + kSigmoidSumEps;
      for (int e = 0; e < E; ++e) {
        const double sig = sigmoid(double(logits[static_cast<size_t>(t) * E + e]));
        d[e] += T(g * (c[e] - dot) / denom * sig * (1 - sig));
      }
    }
  }
  return loss;
}

template <typename T>
double moe_z_loss(T* dlogits, const T* logits, int tokens, int experts, double coeff,
                  double grad_scale) {
  std::vector<double> lse(tokens);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < tokens; ++t) {
    const T* row = logits + static_cast<size_t>(t) * experts;
    double m = -std::numeric_limits<double>::infinity();
    for (int e = 0; e < experts; ++e) m = std::max(m, double(row[e]));
    double s = 0;
    for (int e = 0; e < experts; ++e) s += std::exp(double(row[e]) - m);
    lse[t] = m + std::log(s);
  }
  double sum = 0;
  for (double l : lse) sum += l * l;
  const double loss = coeff * sum / tokens;
  if (!dlogits) return loss;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < tokens; ++t) {
    const T* row = logits + static_cast<size_t>(t) * experts;
    T* d = dlogits + static_cast<size_t>(t) * experts;
    const double g = grad_scale * coeff * 2 * lse[t] / tokens;
    for (int e = 0; e < experts; ++e) d[e] += T(g * std::exp(double(row[e]) - lse[t]));
  }
  return loss;
}

template <typename T>
void moe_expert_bias_update(T* expert_bias, const double* tokens_per_expert, int experts,
                            double rate) {
  double total = 0;
  for (int e = 0; e < experts; ++e) total += tokens_per_expert[e];
  const double mean = total / experts;
  for (int e = 0; e < experts; ++e) {
    const double offset = mean - tokens_per_expert[e];
    const double sign = offset > 0 ? 1.0 : offset < 0 ? -1.0 : 0.0;
    expert_bias[e] = T(double(expert_bias[e]) + sign * rate);
  }
}

#define INSTANTIATE(T)                                                                  \
  template void moe_topk_routing_forward<T>(T*, int32_t*, const T*, const T*,           \
                                            const MoERoutingArgs&);                     \
  template void moe_topk_routing_backward<T>(T*, const T*, const T*, const int32_t*,    \
                                             const MoERoutingArgs&);                    \
  template double moe_aux_loss<T>(T*, const T*, const MoEAuxLossArgs&, double);         \
  template std::vector<double> moe_aux_loss_counts<T>(const T*, const MoEAuxLossArgs&); \
  template double moe_z_loss<T>(T*, const T*, int, int, double, double);                \
  template void moe_expert_bias_update<T>(T*, const double*, int, double);
OMNI_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace omni::ops
