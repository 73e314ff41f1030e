// The mixture-of-experts ops, CPU reference implementations (backend/cpu/moe_*.cpp), with the
// conventions of backend/ops.h (row-major [rows, channels]; parameter gradients +=;
// activation gradients overwritten unless the name or argument says accumulate; float and
// double instantiations; deterministic). They follow Megatron-Core's
// megatron/core/transformer/moe (router.py, moe_utils.py, token_dispatcher.py, experts.py,
// shared_experts.py); each declaration names the function whose semantics it has.
//
// Shapes: T tokens, C hidden, E experts, K = top-k, R = rows of the experts' input after
// dispatch (T*K dropless; fewer with drops; E * capacity when padded to capacity).
#pragma once

#include <cstdint>

#include "backend/moe_types.h"

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

// The shared expert's gate (SharedExpertMLP, --moe-shared-expert-gate): y[t] = h[t] *
// sigmoid(x[t] . w) with w [C]; gate [T] receives the sigmoid.
template <typename T>
void moe_shared_gate_forward(T* y, T* gate, const T* h, const T* x, const T* w, int tokens, int C);
// dh (overwritten) = dy * gate; dx += d/dx; dw += d/dw.
template <typename T>
void moe_shared_gate_backward(T* dh, T* dx, T* dw, const T* dy, const T* h, const T* gate,
                              const T* x, const T* w, int tokens, int C);

}  // namespace omni::ops
