// Token dispatch for the experts: which rows each expert processes under a capacity
// (Megatron-Core's apply_router_token_dropping and get_capacity), the permutation of tokens
// into expert order and back with the combine weights (permute / unpermute), the experts'
// grouped GEMM, and the shared expert's gate.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/reduce.h"
#include "backend/moe_ops.h"
#include "backend/ops.h"
#include "base/error.h"

namespace omni::ops {

template <typename T>
MoEDispatchPlan moe_dispatch_plan(const int32_t* indices, const T* probs, int tokens, int experts,
                                  int topk, const MoECapacityArgs& cap) {
  MoEDispatchPlan plan;
  plan.tokens = tokens;
  plan.experts = experts;
  plan.topk = topk;
  // Each expert's (token, slot) pairs in ascending token order.
  std::vector<std::vector<int32_t>> routed(experts);
  for (int t = 0; t < tokens; ++t)
    for (int k = 0; k < topk; ++k) {
      const int32_t e = indices[static_cast<size_t>(t) * topk + k];
      OMNI_CHECK(e >= 0 && e < experts, "[moe_dispatch_plan] token ", t, " routed to expert ", e,
                 " of ", experts);
      routed[e].push_back(t * topk + k);
    }

  int capacity = 0;  // 0: every routed pair is kept
  if (cap.capacity_factor > 0) {
    // get_capacity(num_tokens = T * K): ceil(T K / E * factor), in Python's float order.
    const double c = std::ceil(double(tokens) * topk / experts * cap.capacity_factor);
    OMNI_REQUIRE(!cap.pad_to_capacity || c <= tokens,
                 "--moe-pad-expert-input-to-capacity: ", "--moe-expert-capacity-factor ",
                 cap.capacity_factor, " gives each expert a ", "capacity of ", c,
                 " rows, more than the ", tokens,
                 " tokens there are to fill them with; lower the factor");
    if (c <= tokens) capacity = static_cast<int>(c);
  }
  plan.capacity = capacity;

  plan.expert_offsets.assign(experts + 1, 0);
  std::vector<char> taken;
  for (int e = 0; e < experts; ++e) {
    std::vector<int32_t>& pairs = routed[e];
    if (capacity > 0 && static_cast<int>(pairs.size()) > capacity) {
      if (cap.drop_policy == MoETokenDropPolicy::Probs) {
        // The largest probs stay (ties: the earlier token); back to token order after.
        std::stable_sort(pairs.begin(), pairs.end(),
                         [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
      }
      plan.dropped += static_cast<int64_t>(pairs.size()) - capacity;
      pairs.resize(capacity);
      std::sort(pairs.begin(), pairs.end());
    }
    // Rows as (token, slot); padding rows fill up to capacity with the earliest other tokens.
    std::vector<std::pair<int32_t, int32_t>> rows;
    for (int32_t s : pairs) rows.emplace_back(s / topk, s);
    if (cap.pad_to_capacity && capacity > 0 && static_cast<int>(rows.size()) < capacity) {
      taken.assign(tokens, 0);
      for (int32_t s : routed[e]) taken[s / topk] = 1;
      for (int t = 0; t < tokens && static_cast<int>(rows.size()) < capacity; ++t)
        if (!taken[t]) rows.emplace_back(t, -1);
      std::sort(rows.begin(), rows.end());
    }
    for (const auto& [t, s] : rows) {
      plan.row_token.push_back(t);
      plan.row_slot.push_back(s);
    }
    plan.expert_offsets[e + 1] = static_cast<int32_t>(plan.row_token.size());
  }

  // The inverse map by counting sort (rows ascending within each token).
  plan.token_offsets.assign(tokens + 1, 0);
  for (int32_t t : plan.row_token) ++plan.token_offsets[t + 1];
  for (int t = 0; t < tokens; ++t) plan.token_offsets[t + 1] += plan.token_offsets[t];
  plan.token_rows.resize(plan.row_token.size());
  std::vector<int32_t> fill(plan.token_offsets.begin(), plan.token_offsets.end() - 1);
  for (int r = 0; r < plan.rows(); ++r) plan.token_rows[fill[plan.row_token[r]]++] = r;
  return plan;
}

template <typename T>
void moe_permute_rows(T* out, const T* x, const MoEDispatchPlan& plan, int C, int r0, int r1) {
#pragma omp parallel for schedule(static)
  for (int r = r0; r < r1; ++r)
    std::copy_n(x + static_cast<size_t>(plan.row_token[r]) * C, C,
                out + static_cast<size_t>(r) * C);
}

template <typename T>
void moe_permute(T* out, const T* x, const MoEDispatchPlan& plan, int C) {
  moe_permute_rows(out, x, plan, C, 0, plan.rows());
}

template <typename T>
void moe_permute_backward(T* dx, const T* dout, const MoEDispatchPlan& plan, int C,
                          bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < plan.tokens; ++t) {
    T* d = dx + static_cast<size_t>(t) * C;
    if (!accumulate) std::fill_n(d, C, T(0));
    for (int i = plan.token_offsets[t]; i < plan.token_offsets[t + 1]; ++i) {
      const T* g = dout + static_cast<size_t>(plan.token_rows[i]) * C;
      for (int c = 0; c < C; ++c) d[c] += g[c];
    }
  }
}

template <typename T>
void moe_row_weights(T* row_weight, const T* probs, const MoEDispatchPlan& plan) {
  for (int r = 0; r < plan.rows(); ++r)
    row_weight[r] = plan.row_slot[r] >= 0 ? probs[plan.row_slot[r]] : T(0);
}

template <typename T>
void moe_row_weights_backward(T* dprobs, const T* drow_weight, const MoEDispatchPlan& plan) {
  std::fill_n(dprobs, static_cast<size_t>(plan.tokens) * plan.topk, T(0));
  for (int r = 0; r < plan.rows(); ++r)
    if (plan.row_slot[r] >= 0) dprobs[plan.row_slot[r]] = drow_weight[r];
}

template <typename T>
void moe_unpermute(T* y, const T* expert_out, const T* row_weight, const MoEDispatchPlan& plan,
                   int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < plan.tokens; ++t) {
    T* out = y + static_cast<size_t>(t) * C;
    const int i0 = plan.token_offsets[t], i1 = plan.token_offsets[t + 1];
    if (i0 == i1) {
      std::fill_n(out, C, T(0));
      continue;
    }
    {  // the first row written, not added to zeros (the same sum: 0 + w v, one pass less)
      const int r = plan.token_rows[i0];
      const T w = row_weight[r];
      const T* v = expert_out + static_cast<size_t>(r) * C;
      for (int c = 0; c < C; ++c) out[c] = T(0) + w * v[c];
    }
    for (int i = i0 + 1; i < i1; ++i) {
      const int r = plan.token_rows[i];
      const T w = row_weight[r];
      const T* v = expert_out + static_cast<size_t>(r) * C;
      for (int c = 0; c < C; ++c) out[c] += w * v[c];
    }
  }
}

template <typename T>
void moe_unpermute_backward_rows(T* dexpert_out, T* drow_weight, const T* dy, const T* expert_out,
                                 const T* row_weight, const MoEDispatchPlan& plan, int C, int r0,
                                 int r1) {
  // The dot product in kLanes interleaved double sums (element c into lane c mod kLanes, the
  // lanes added in order): independent sums the compiler vectorises, where one is a chain of
  // dependent adds. A float row's products are exact in double: only the double sum's order
  // moved, and its float rounding almost never sees that.
  constexpr int kLanes = 16;
#pragma omp parallel for schedule(static)
  for (int r = r0; r < r1; ++r) {
    const T* g = dy + static_cast<size_t>(plan.row_token[r]) * C;
    const T* v = expert_out + static_cast<size_t>(r) * C;
    T* d = dexpert_out + static_cast<size_t>(r) * C;
    const T w = row_weight[r];
#pragma omp simd
    for (int c = 0; c < C; ++c) d[c] = w * g[c];
    double lanes[kLanes] = {};
    int c = 0;
    for (; c + kLanes <= C; c += kLanes)
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) lanes[l] += double(g[c + l]) * v[c + l];
    double dot = 0;
    for (double lane : lanes) dot += lane;
    for (; c < C; ++c) dot += double(g[c]) * v[c];
    drow_weight[r] = T(dot);
  }
}

template <typename T>
void moe_unpermute_backward(T* dexpert_out, T* drow_weight, const T* dy, const T* expert_out,
                            const T* row_weight, const MoEDispatchPlan& plan, int C) {
  moe_unpermute_backward_rows(dexpert_out, drow_weight, dy, expert_out, row_weight, plan, C, 0,
                              plan.rows());
}

namespace {
// body(e) for each expert with rows. With at least two such experts per thread, the experts
// are spread over the threads whole (largest first, each thread taking the next): an
// expert's GEMMs then run on one thread (OpenBLAS's OpenMP build runs single-threaded inside
// a parallel region), with no split of its few hundred rows and no barrier inside it (on 2
// cores, 4 to 5 % less CPU time for the MoE layers of bench_moe_layer than each GEMM over both
// threads). With fewer, one expert after another, each op over all the threads as before.
// Every expert writes its own rows and weights. The bits are those of the experts' ops over
// all rows (bench_moe_layer's outputs are unchanged) where each expert's part of an
// elementwise op starts at a multiple of the vector width: GELU over [rows, F] with F not a
// multiple of it (16 floats on AVX-512) moves which elements take libmvec's vector erfc and
// which the scalar one, an ulp-level change as a different thread count makes already.
int experts_with_rows(const int32_t* offsets, int experts) {
  int n = 0;
  for (int e = 0; e < experts; ++e) n += offsets[e + 1] > offsets[e];
  return n;
}

bool whole_experts(int with_rows) {
  return with_rows >= 2 * omp_get_max_threads() && !omp_in_parallel();
}

template <typename Body>
void for_each_expert(const int32_t* offsets, int experts, Body&& body) {
  std::vector<int> order;
  for (int e = 0; e < experts; ++e)
    if (offsets[e + 1] > offsets[e]) order.push_back(e);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return offsets[a + 1] - offsets[a] > offsets[b + 1] - offsets[b];
  });
  const int n = static_cast<int>(order.size());
  const bool whole = whole_experts(n);
#pragma omp parallel for schedule(dynamic, 1) if (whole)
  for (int i = 0; i < n; ++i) body(order[i]);
}
}  // namespace

void moe_for_each_expert(const int32_t* offsets, int experts,
                         const std::function<void(int)>& body) {
  for_each_expert(offsets, experts, body);
}

bool moe_experts_run_whole(const int32_t* offsets, int experts) {
  return whole_experts(experts_with_rows(offsets, experts));
}

template <typename T>
void moe_grouped_linear_forward(T* y, const T* x, const T* w, const T* bias, const int32_t* offsets,
                                int experts, int K, int N) {
  for_each_expert(offsets, experts, [&](int e) {
    const int r0 = offsets[e], rows = offsets[e + 1] - r0;
    linear_forward(y + static_cast<size_t>(r0) * N, x + static_cast<size_t>(r0) * K,
                   w + static_cast<size_t>(e) * N * K,
                   bias ? bias + static_cast<size_t>(e) * N : nullptr, rows, K, N);
  });
}

template <typename T>
void moe_grouped_linear_backward(T* dx, T* dw, T* dbias, const T* dy, const T* x, const T* w,
                                 const int32_t* offsets, int experts, int K, int N) {
  for_each_expert(offsets, experts, [&](int e) {
    const int r0 = offsets[e], rows = offsets[e + 1] - r0;
    linear_backward(
        dx ? dx + static_cast<size_t>(r0) * K : nullptr, dw + static_cast<size_t>(e) * N * K,
        dbias ? dbias + static_cast<size_t>(e) * N : nullptr, dy + static_cast<size_t>(r0) * N,
        x + static_cast<size_t>(r0) * K, w + static_cast<size_t>(e) * N * K, rows, K, N);
  });
}

template <typename T>
void moe_shared_gate_forward(T* y, T* gate, const T* h, const T* x, const T* w, int tokens, int C) {
#pragma omp parallel for schedule(static)
  for (int t = 0; t < tokens; ++t) {
    const T* xr = x + static_cast<size_t>(t) * C;
    double z = 0;
    for (int c = 0; c < C; ++c) z += double(xr[c]) * w[c];
    const T g = T(1.0 / (1.0 + std::exp(-z)));
    gate[t] = g;
    const T* hr = h + static_cast<size_t>(t) * C;
    T* yr = y + static_cast<size_t>(t) * C;
    for (int c = 0; c < C; ++c) yr[c] = hr[c] * g;
  }
}

template <typename T>
void moe_shared_gate_backward(T* dh, T* dx, T* dw, const T* dy, const T* h, const T* gate,
                              const T* x, const T* w, int tokens, int C) {
  // d gate logit[t] = g (1 - g) <dy[t], h[t]>.
  std::vector<double> dz(tokens);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < tokens; ++t) {
    const T* g = dy + static_cast<size_t>(t) * C;
    const T* hr = h + static_cast<size_t>(t) * C;
    T* d = dh + static_cast<size_t>(t) * C;
    double dot = 0;
    for (int c = 0; c < C; ++c) {
      dot += double(g[c]) * hr[c];
      d[c] = g[c] * gate[t];
    }
    dz[t] = dot * gate[t] * (1 - double(gate[t]));
    T* dxr = dx + static_cast<size_t>(t) * C;
    for (int c = 0; c < C; ++c) dxr[c] += T(dz[t] * w[c]);
  }
  cpu::blocked_row_reduce(dw, tokens, C, [&](int r0, int r1, double* acc) {
    for (int t = r0; t < r1; ++t) {
      const T* xr = x + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) acc[c] += dz[t] * xr[c];
    }
  });
}

#define INSTANTIATE(T)                                                                          \
  template MoEDispatchPlan moe_dispatch_plan<T>(const int32_t*, const T*, int, int, int,        \
                                                const MoECapacityArgs&);                        \
  template void moe_permute<T>(T*, const T*, const MoEDispatchPlan&, int);                      \
  template void moe_permute_rows<T>(T*, const T*, const MoEDispatchPlan&, int, int, int);       \
  template void moe_permute_backward<T>(T*, const T*, const MoEDispatchPlan&, int, bool);       \
  template void moe_row_weights<T>(T*, const T*, const MoEDispatchPlan&);                       \
  template void moe_row_weights_backward<T>(T*, const T*, const MoEDispatchPlan&);              \
  template void moe_unpermute<T>(T*, const T*, const T*, const MoEDispatchPlan&, int);          \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const T*,                 \
                                          const MoEDispatchPlan&, int);                         \
  template void moe_unpermute_backward_rows<T>(T*, T*, const T*, const T*, const T*,            \
                                               const MoEDispatchPlan&, int, int, int);          \
  template void moe_grouped_linear_forward<T>(T*, const T*, const T*, const T*, const int32_t*, \
                                              int, int, int);                                   \
  template void moe_grouped_linear_backward<T>(T*, T*, T*, const T*, const T*, const T*,        \
                                               const int32_t*, int, int, int);                  \
  template void moe_shared_gate_forward<T>(T*, T*, const T*, const T*, const T*, int, int);     \
  template void moe_shared_gate_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, \
                                            const T*, int, int);
OMNI_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace omni::ops
