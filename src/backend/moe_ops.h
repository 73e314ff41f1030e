// The mixture-of-experts ops, CPU reference implementations (backend/cpu/moe_*.cpp), and at the
// end of this file their dispatching forms ops::X(exec, args) (the CPU, or a GPU through
// backend/gpu_moe_backend.h), with the conventions of backend/ops.h (row-major [rows, channels];
// parameter gradients +=; activation gradients overwritten unless the name or argument says
// accumulate; float and double instantiations; deterministic). They follow Megatron-Core's
// megatron/core/transformer/moe (router.py, moe_utils.py, token_dispatcher.py, experts.py,
// shared_experts.py); each declaration names the function whose semantics it has.
//
// Shapes: T tokens, C hidden, E experts, K = top-k, R = rows of the experts' input after
// dispatch (T*K dropless; fewer with drops; E * capacity when padded to capacity).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/gpu_moe_backend.h"
#include "backend/moe_types.h"
#include "backend/ops.h"

namespace omni::ops {

// ---- Router -----------------------------------------------------------------------------------

// probs [T, K] and indices [T, K] (expert ids, by descending selection score; ties to the
// lower expert) of the top-k routing of logits [T, E] (topk_routing_with_score_function):
//  - softmax: probs = softmax over the k largest logits; with pre_softmax, softmax over all E
//    first and the k largest of those (not renormalised);
//  - sigmoid: s = sigmoid(logits), the k experts of largest s + expert_bias (expert_bias may
//    be null; it steers the choice only), probs = s / sum of the k s (k > 1; + 1e-20);
//  - group-limited (group_topk > 0): the E experts form num_groups groups; a group's score is
//    the sum of its top (K / group_topk) selection scores, the group_topk best groups are
//    kept and the k experts are chosen among theirs;
//  - probs *= scaling_factor when it is non-zero.
template <typename T>
void moe_topk_routing_forward(T* probs, int32_t* indices, const T* logits, const T* expert_bias,
                              const MoERoutingArgs& a);
// dlogits [T, E] (overwritten) from dprobs [T, K], recomputing the scores from logits.
template <typename T>
void moe_topk_routing_backward(T* dlogits, const T* dprobs, const T* logits, const int32_t* indices,
                               const MoERoutingArgs& a);

// The load-balancing loss (returned, coefficient included, as Megatron's probs carry it):
//   aux = E coeff / (K T^2) sum_e (sum_t scores[t, e]) count[e]
// where scores are the softmax of the logits over all E (sigmoid: sigmoid normalised to sum
// 1, + 1e-20) and count[e] the tokens whose top-K of those scores include e (neither the
// expert bias nor the groups take part); SeqAuxLoss applies it per sequence (T = seq_length)
// and averages over the sequences. With dlogits non-null, adds grad_scale * d aux / d logits
// (the counts are constants), as Megatron's MoEAuxLossAutoScaler makes the loss's gradient
// grad_scale (its main_loss_backward_scale: the loss scale over the micro-batches).
template <typename T>
double moe_aux_loss(T* dlogits, const T* logits, const MoEAuxLossArgs& a, double grad_scale);
// The counts of moe_aux_loss [sequences (1 for AuxLoss), E]: each sequence's tokens whose
// top-K scores include e.
template <typename T>
std::vector<double> moe_aux_loss_counts(const T* logits, const MoEAuxLossArgs& a);
// The router z-loss (z_loss_func): coeff * mean_t logsumexp(logits[t])^2; with dlogits
// non-null adds grad_scale * its gradient.
template <typename T>
double moe_z_loss(T* dlogits, const T* logits, int tokens, int experts, double coeff,
                  double grad_scale);

// Aux-loss-free balancing (get_updated_expert_bias): bias[e] += rate * sign(mean - count[e])
// with the counts of a global batch's routed tokens per expert.
template <typename T>
void moe_expert_bias_update(T* expert_bias, const double* tokens_per_expert, int experts,
                            double rate);

// ---- Dispatch ---------------------------------------------------------------------------------

// The rows each expert processes, from the top-k choice (indices, probs [T, K]):
//  - dropless (capacity_factor 0): every pair, expert after expert, tokens ascending;
//  - capacity = ceil(T K / E * capacity_factor) (get_capacity); when it is below T, an expert
//    keeps at most `capacity` of its tokens: the largest probs (ties: the earlier token), or
//    the earliest tokens (Position); the others' probs count as 0 (dropped);
//  - pad_to_capacity: every expert gets exactly `capacity` rows, its kept tokens and then the
//    earliest tokens not routed to it, as padding rows of weight 0
//    (apply_router_token_dropping, then the drop-and-pad permute).
// Throws naming the flags when padding cannot fill `capacity` rows (capacity above T).
template <typename T>
MoEDispatchPlan moe_dispatch_plan(const int32_t* indices, const T* probs, int tokens, int experts,
                                  int topk, const MoECapacityArgs& capacity);

// out[r] = x[row_token[r]]: the experts' input rows [R, C] (permute).
template <typename T>
void moe_permute(T* out, const T* x, const MoEDispatchPlan& plan, int C);
// The same for rows [r0, r1) only (on the CPU, an expert's rows gathered by its own task).
template <typename T>
void moe_permute_rows(T* out, const T* x, const MoEDispatchPlan& plan, int C, int r0, int r1);
// dx[t] (+)= sum of dout over token t's rows (overwritten unless accumulate).
template <typename T>
void moe_permute_backward(T* dx, const T* dout, const MoEDispatchPlan& plan, int C,
                          bool accumulate);
// row_weight[r] = probs[row_slot[r]], 0 for padding rows: each row's combine weight.
template <typename T>
void moe_row_weights(T* row_weight, const T* probs, const MoEDispatchPlan& plan);
// dprobs [T, K] (overwritten) from the rows' weight gradients; dropped pairs get 0.
template <typename T>
void moe_row_weights_backward(T* dprobs, const T* drow_weight, const MoEDispatchPlan& plan);
// y[t] = sum over token t's rows of row_weight[r] * expert_out[r] (overwritten; a token
// every expert dropped gets 0): unpermute with the combine weights.
template <typename T>
void moe_unpermute(T* y, const T* expert_out, const T* row_weight, const MoEDispatchPlan& plan,
                   int C);
// dexpert_out[r] = row_weight[r] dy[row_token[r]]; drow_weight[r] = <dy[row_token[r]],
// expert_out[r]> (both overwritten).
template <typename T>
void moe_unpermute_backward(T* dexpert_out, T* drow_weight, const T* dy, const T* expert_out,
                            const T* row_weight, const MoEDispatchPlan& plan, int C);
// The same for rows [r0, r1) only.
template <typename T>
void moe_unpermute_backward_rows(T* dexpert_out, T* drow_weight, const T* dy, const T* expert_out,
                                 const T* row_weight, const MoEDispatchPlan& plan, int C, int r0,
                                 int r1);

// ---- Experts ----------------------------------------------------------------------------------

// The experts' linear layers as one grouped GEMM: rows [offsets[e], offsets[e+1]) of x [R, K]
// go through expert e's w [N, K] (w: [E, N, K]) and bias [N] (bias [E, N], may be null) into
// y [R, N]. On the CPU a BLAS gemm per non-empty expert.
template <typename T>
void moe_grouped_linear_forward(T* y, const T* x, const T* w, const T* bias, const int32_t* offsets,
                                int experts, int K, int N);
// dx [R, K] (overwritten; may be null), dw += , dbias += (may be null).
template <typename T>
void moe_grouped_linear_backward(T* dx, T* dw, T* dbias, const T* dy, const T* x, const T* w,
                                 const int32_t* offsets, int experts, int K, int N);

// body(e) for each expert e < experts with rows (offsets [experts + 1]); with two or more
// such experts per CPU thread they run in parallel, each whole on one thread, largest first
// (a BLAS call inside body then runs on its thread alone), else one after another. Each body
// must touch only its expert's rows and weights.
void moe_for_each_expert(const int32_t* offsets, int experts, const std::function<void(int)>& body);
// Whether moe_for_each_expert runs these experts in parallel, each whole on one thread.
bool moe_experts_run_whole(const int32_t* offsets, int experts);

// The shared expert's gate (SharedExpertMLP, --moe-shared-expert-gate): y[t] = h[t] *
// sigmoid(x[t] . w) with w [C]; gate [T] receives the sigmoid.
template <typename T>
void moe_shared_gate_forward(T* y, T* gate, const T* h, const T* x, const T* w, int tokens, int C);
// dh (overwritten) = dy * gate; dx += d/dx; dw += d/dw.
template <typename T>
void moe_shared_gate_backward(T* dh, T* dx, T* dw, const T* dy, const T* h, const T* gate,
                              const T* x, const T* w, int tokens, int C);

// ---- On a device ------------------------------------------------------------------------------
// The ops above where an Exec says (backend/ops.h): the CPU's, or the GPU backend's MoE ops
// (float, bf16, f16 storage; parameter gradients accum_t<T>).

// A dispatch plan where an Exec's ops read it: the host plan (built on the host on every
// device, so that capacity drops and ties choose the CPU's tokens; the grouped GEMM's expert
// offsets and the token counts are read from it) and, on a GPU, its arrays in device memory.
class MoEPlan {
 public:
  MoEPlan() = default;
  MoEPlan(const Exec& e, MoEDispatchPlan plan) : host_(std::move(plan)) {
    const MoEDispatchPlan& h = host_;
    device_.tokens = h.tokens, device_.topk = h.topk, device_.rows = h.rows();
    if (!e.gpu) return;
    const size_t R = h.row_token.size(), n = 3 * R + h.token_offsets.size();
    const DeviceMemory* m = e.memory();
    storage_ = std::shared_ptr<int32_t>(static_cast<int32_t*>(m->allocate(n * sizeof(int32_t))),
                                        [m](int32_t* p) { m->deallocate(p); });
    int32_t* p = storage_.get();
    auto put = [&](const std::vector<int32_t>& v) {
      if (!v.empty()) m->upload(p, v.data(), v.size() * sizeof(int32_t));
      const int32_t* at = p;
      p += v.size();
      return at;
    };
    device_.row_token = put(h.row_token), device_.row_slot = put(h.row_slot);
    device_.token_offsets = put(h.token_offsets), device_.token_rows = put(h.token_rows);
  }
  const MoEDispatchPlan& host() const { return host_; }
  const MoEDevicePlan& device() const { return device_; }

 private:
  MoEDispatchPlan host_;
  std::shared_ptr<int32_t> storage_;  // the device arrays
  MoEDevicePlan device_;
};

#define OMNI_MOE_DISPATCH(op, cpu_call, gpu_call) OMNI_DISPATCH_TO(op, cpu_call, moe_ops, gpu_call)

template <typename T>
void moe_topk_routing_forward(const Exec& e, T* probs, int32_t* indices, const T* logits,
                              const T* expert_bias, const MoERoutingArgs& a) {
  OMNI_MOE_DISPATCH(moe_topk_routing_forward,
                    moe_topk_routing_forward(probs, indices, logits, expert_bias, a),
                    topk_routing_forward(probs, indices, logits, expert_bias, a));
}
template <typename T>
void moe_topk_routing_backward(const Exec& e, T* dlogits, const T* dprobs, const T* logits,
                               const int32_t* indices, const MoERoutingArgs& a) {
  OMNI_MOE_DISPATCH(moe_topk_routing_backward,
                    moe_topk_routing_backward(dlogits, dprobs, logits, indices, a),
                    topk_routing_backward(dlogits, dprobs, logits, indices, a));
}
template <typename T>
double moe_aux_loss(const Exec& e, T* dlogits, const T* logits, const MoEAuxLossArgs& a,
                    double grad_scale) {
  OMNI_MOE_DISPATCH(moe_aux_loss, moe_aux_loss(dlogits, logits, a, grad_scale),
                    aux_loss(dlogits, logits, a, grad_scale));
}
// counts [sequences, E] (overwritten) in the Exec's memory: moe_aux_loss_counts. Under context
// parallelism they are summed over the ranks where they are (a communicator moves the Exec's
// memory) and given to moe_aux_loss as MoEAuxLossArgs::counts, also the Exec's memory.
template <typename T>
void moe_aux_loss_counts(const Exec& e, double* counts, const T* logits, const MoEAuxLossArgs& a) {
  if (!e.gpu) {
    if constexpr (is_16bit<T>) {
      detail::cpu_has_no_16bit("moe_aux_loss_counts");
    } else {
      const std::vector<double> c = moe_aux_loss_counts(logits, a);
      std::copy(c.begin(), c.end(), counts);
    }
  } else if constexpr (std::is_same_v<T, double>) {
    detail::gpu_has_no_double("moe_aux_loss_counts");
  } else {
    e.gpu->template moe_ops<T>().aux_loss_counts(counts, logits, a);
  }
}
template <typename T>
double moe_z_loss(const Exec& e, T* dlogits, const T* logits, int tokens, int experts, double coeff,
                  double grad_scale) {
  OMNI_MOE_DISPATCH(moe_z_loss, moe_z_loss(dlogits, logits, tokens, experts, coeff, grad_scale),
                    z_loss(dlogits, logits, tokens, experts, coeff, grad_scale));
}
// tokens_per_expert: host memory on every device.
template <typename T>
void moe_expert_bias_update(const Exec& e, T* expert_bias, const double* tokens_per_expert,
                            int experts, double rate) {
  OMNI_MOE_DISPATCH(moe_expert_bias_update,
                    moe_expert_bias_update(expert_bias, tokens_per_expert, experts, rate),
                    expert_bias_update(expert_bias, tokens_per_expert, experts, rate));
}
// The plan of the routing in indices and probs (the device's memory): on a GPU they are
// copied to the host (probs only when a capacity drops by probs), the plan is built there and
// its arrays copied back.
template <typename T>
MoEPlan moe_dispatch_plan(const Exec& e, const int32_t* indices, const T* probs, int tokens,
                          int experts, int topk, const MoECapacityArgs& cap) {
  if (!e.gpu) {
    if constexpr (is_16bit<T>)
      detail::cpu_has_no_16bit("moe_dispatch_plan");
    else
      return MoEPlan(e, moe_dispatch_plan(indices, probs, tokens, experts, topk, cap));
  } else if constexpr (std::is_same_v<T, double>) {
    detail::gpu_has_no_double("moe_dispatch_plan");
  } else {
    const size_t n = size_t(tokens) * topk;
    std::vector<int32_t> idx(n);
    download(e, idx.data(), indices, n);
    std::vector<float> p;
    if (cap.capacity_factor > 0 && cap.drop_policy == MoETokenDropPolicy::Probs) {
      std::vector<T> raw(n);
      download(e, raw.data(), probs, n);
      p.resize(n);
      for (size_t i = 0; i < n; ++i) p[i] = ::omni::to_float(raw[i]);
    }
    return MoEPlan(e, moe_dispatch_plan(idx.data(), p.empty() ? nullptr : p.data(), tokens, experts,
                                        topk, cap));
  }
}
template <typename T>
void moe_permute(const Exec& e, T* out, const T* x, const MoEPlan& plan, int C) {
  OMNI_MOE_DISPATCH(moe_permute, moe_permute(out, x, plan.host(), C),
                    permute(out, x, plan.device(), C));
}
template <typename T>
void moe_permute_backward(const Exec& e, T* dx, const T* dout, const MoEPlan& plan, int C,
                          bool accumulate) {
  OMNI_MOE_DISPATCH(moe_permute_backward,
                    moe_permute_backward(dx, dout, plan.host(), C, accumulate),
                    permute_backward(dx, dout, plan.device(), C, accumulate));
}
template <typename T>
void moe_row_weights(const Exec& e, T* row_weight, const T* probs, const MoEPlan& plan) {
  OMNI_MOE_DISPATCH(moe_row_weights, moe_row_weights(row_weight, probs, plan.host()),
                    row_weights(row_weight, probs, plan.device()));
}
template <typename T>
void moe_row_weights_backward(const Exec& e, T* dprobs, const T* drow_weight, const MoEPlan& plan) {
  OMNI_MOE_DISPATCH(moe_row_weights_backward,
                    moe_row_weights_backward(dprobs, drow_weight, plan.host()),
                    row_weights_backward(dprobs, drow_weight, plan.device()));
}
template <typename T>
void moe_unpermute(const Exec& e, T* y, const T* expert_out, const T* row_weight,
                   const MoEPlan& plan, int C) {
  OMNI_MOE_DISPATCH(moe_unpermute, moe_unpermute(y, expert_out, row_weight, plan.host(), C),
                    unpermute(y, expert_out, row_weight, plan.device(), C));
}
template <typename T>
void moe_unpermute_backward(const Exec& e, T* dexpert_out, T* drow_weight, const T* dy,
                            const T* expert_out, const T* row_weight, const MoEPlan& plan, int C) {
  OMNI_MOE_DISPATCH(
      moe_unpermute_backward,
      moe_unpermute_backward(dexpert_out, drow_weight, dy, expert_out, row_weight, plan.host(), C),
      unpermute_backward(dexpert_out, drow_weight, dy, expert_out, row_weight, plan.device(), C));
}
// offsets: [experts + 1], host memory on every device.
template <typename T>
void moe_grouped_linear_forward(const Exec& e, T* y, const T* x, const T* w, const T* bias,
                                const int32_t* offsets, int experts, int K, int N) {
  OMNI_MOE_DISPATCH(moe_grouped_linear_forward,
                    moe_grouped_linear_forward(y, x, w, bias, offsets, experts, K, N),
                    grouped_linear_forward(y, x, w, bias, offsets, experts, K, N));
}
template <typename T>
void moe_grouped_linear_backward(const Exec& e, T* dx, accum_t<T>* dw, accum_t<T>* dbias,
                                 const T* dy, const T* x, const T* w, const int32_t* offsets,
                                 int experts, int K, int N) {
  OMNI_MOE_DISPATCH(moe_grouped_linear_backward,
                    moe_grouped_linear_backward(dx, dw, dbias, dy, x, w, offsets, experts, K, N),
                    grouped_linear_backward(dx, dw, dbias, dy, x, w, offsets, experts, K, N));
}
template <typename T>
void moe_shared_gate_forward(const Exec& e, T* y, T* gate, const T* h, const T* x, const T* w,
                             int tokens, int C) {
  OMNI_MOE_DISPATCH(moe_shared_gate_forward, moe_shared_gate_forward(y, gate, h, x, w, tokens, C),
                    shared_gate_forward(y, gate, h, x, w, tokens, C));
}
template <typename T>
void moe_shared_gate_backward(const Exec& e, T* dh, T* dx, accum_t<T>* dw, const T* dy, const T* h,
                              const T* gate, const T* x, const T* w, int tokens, int C) {
  OMNI_MOE_DISPATCH(moe_shared_gate_backward,
                    moe_shared_gate_backward(dh, dx, dw, dy, h, gate, x, w, tokens, C),
                    shared_gate_backward(dh, dx, dw, dy, h, gate, x, w, tokens, C));
}

#undef OMNI_MOE_DISPATCH

}  // namespace omni::ops
