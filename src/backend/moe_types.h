// Types of the mixture-of-experts ops (backend/moe_ops.h) that TransformerConfig also names:
// Megatron-Core's router, load-balancing and capacity settings. Plain C++17.
#pragma once

#include <cstdint>
#include <vector>

namespace omni {

// --moe-router-score-function.
enum class MoEScoreFunction { Softmax, Sigmoid };
// --moe-router-load-balancing-type (Megatron's sinkhorn, global_aux_loss and
// quantile_balancing are not built).
enum class MoELoadBalancing { AuxLoss, SeqAuxLoss, None };
// --moe-token-drop-policy: which of an over-full expert's tokens are kept.
enum class MoETokenDropPolicy { Probs, Position };

const char* to_string(MoEScoreFunction f);
const char* to_string(MoELoadBalancing b);
const char* to_string(MoETokenDropPolicy p);

}  // namespace omni

namespace omni::ops {

// Top-k routing of `tokens` rows of router logits over `experts` (Megatron-Core's
// topk_routing_with_score_function).
struct MoERoutingArgs {
  int tokens = 0, experts = 0, topk = 2;
  MoEScoreFunction score_function = MoEScoreFunction::Softmax;
  bool pre_softmax = false;   // --moe-router-pre-softmax
  int num_groups = 0;         // --moe-router-num-groups (0: none)
  int group_topk = 0;         // --moe-router-group-topk (0: no group-limited routing)
  double scaling_factor = 0;  // --moe-router-topk-scaling-factor (0: none)
};

// A load-balancing loss (Megatron-Core's switch_load_balancing_loss_func on the scores of
// compute_routing_scores_for_aux_loss). SeqAuxLoss takes each sequence of seq_length tokens
// (omnitron's rows are batch-major: sequence b is rows [b*seq_length, (b+1)*seq_length)) as
// its own batch and averages over the sequences.
struct MoEAuxLossArgs {
  int tokens = 0, experts = 0, topk = 2;
  MoEScoreFunction score_function = MoEScoreFunction::Softmax;
  MoELoadBalancing type = MoELoadBalancing::AuxLoss;
  int seq_length = 0;  // SeqAuxLoss only
  double coeff = 0;    // --moe-aux-loss-coeff
  // Context parallelism: each sequence is split over `shards` ranks, these rows being this
  // rank's part; `counts` (null: this rank's own) are then moe_aux_loss_counts summed over
  // those ranks (in the memory the logits are in), and the loss is this rank's part of the
  // whole sequences' (Megatron's tp_cp-reduced tokens_per_expert), so the ranks' parts sum
  // to it.
  int shards = 1;
  const double* counts = nullptr;
};

// --moe-expert-capacity-factor (0: dropless), --moe-token-drop-policy,
// --moe-pad-expert-input-to-capacity.
struct MoECapacityArgs {
  double capacity_factor = 0;
  MoETokenDropPolicy drop_policy = MoETokenDropPolicy::Probs;
  bool pad_to_capacity = false;
};

// Where each routed (token, k) pair goes: the rows of every expert's input, expert after
// expert ("permuted" order, Megatron's), each expert's rows in ascending token order.
// Built on the host from the top-k indices (moe_dispatch_plan); the permutation ops read its
// int32 arrays.
struct MoEDispatchPlan {
  int tokens = 0, experts = 0, topk = 0;
  int capacity = 0;  // rows per expert when capacity-limited; 0: dropless
  // [experts + 1]: expert e's rows are [expert_offsets[e], expert_offsets[e+1]).
  std::vector<int32_t> expert_offsets;
  // [rows]: the token each row copies, and which of probs [tokens * topk] weighs its output
  // (t * topk + k), or -1 for a padding row (weight 0, no gradient).
  std::vector<int32_t> row_token, row_slot;
  // The inverse, for gathers without atomics: token t's rows are
  // token_rows[token_offsets[t] .. token_offsets[t+1]), ascending.
  std::vector<int32_t> token_offsets, token_rows;
  int64_t dropped = 0;  // (token, k) pairs dropped for capacity

  int rows() const { return static_cast<int>(row_token.size()); }
  int64_t expert_rows(int e) const { return expert_offsets[e + 1] - expert_offsets[e]; }
};

}  // namespace omni::ops
