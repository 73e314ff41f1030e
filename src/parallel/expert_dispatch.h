// Expert parallelism's token dispatch (Megatron-Core's MoEAlltoAllTokenDispatcher and
// MoEAllGatherTokenDispatcher, megatron/core/transformer/moe/token_dispatcher.py): each MoE
// layer's E experts are split over the ep ranks of the expert-parallel group, rank r holding
// experts [r E/ep, (r+1) E/ep), while every rank routes its own tokens with the whole router.
// Routing, capacity and drops are decided by the rank that owns the tokens, over its tokens
// alone (as one rank running that micro-batch decides them), so both dispatchers compute the
// one-rank layer's function; only where the experts' rows are computed changes.
//
// Both give the experts the same rows in the same order: local expert after local expert,
// and within one expert the source ranks in order, each source's rows in its token order.
//
//   alltoall:  the source permutes its rows by expert (ops::moe_permute), the ranks exchange
//              row counts, then rows (all_to_all_v); the experts run; the rows go back the
//              same way and the source combines them with its routing weights.
//   allgather: every rank gathers every rank's tokens and routing and takes the rows routed to
//              its experts (expert_allgather_plan); after the experts it weights and sums them
//              per token over the gathered tokens and reduce-scatters that back.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/moe_types.h"
#include "backend/ops.h"
#include "comm/communicator.h"

namespace omni {

// The alltoall dispatcher's exchange for one layer's forward and backward.
class ExpertAllToAll {
 public:
  // Collective over `ep`: from this rank's dispatch plan over all `experts` (rows expert
  // after expert), the row counts each rank sends to and receives from every other.
  ExpertAllToAll(Communicator& ep, const ops::MoEDispatchPlan& plan, int experts);

  // Rows this rank's experts receive, and where each local expert's start ([local + 1]).
  int expert_rows() const { return expert_offsets_.back(); }
  const std::vector<int32_t>& expert_offsets() const { return expert_offsets_; }

  // Collective: `rows` [plan rows, width] (expert-major) to the experts' ranks; this rank's
  // experts' rows land in `expert_rows` [expert_rows(), width]. The arrays are `e`'s memory
  // (a GPU's with a communicator that moves it), `staging` [expert_rows(), width] too.
  template <typename T>
  void dispatch(T* expert_rows, const T* rows, int width, const ops::Exec& e, T* staging) const;
  // Collective, the inverse: the experts' rows back to their sources' plan order.
  template <typename T>
  void combine(T* rows, const T* expert_rows, int width, const ops::Exec& e, T* staging) const;

 private:
  Communicator* ep_;
  std::vector<size_t> send_rows_, recv_rows_;  // per rank
  std::vector<int32_t> expert_offsets_;
  // Expert-major row i is the received (source-major) row order_[i].
  std::vector<int32_t> order_;
};

// Expert tensor parallelism wider than the dense one (ETP a multiple of TP, Megatron-Core's
// alltoall dispatcher with an expert tensor-parallel group): the etp ranks of the group hold
// different tokens and each holds 1/etp of every local expert's width. The rows each rank
// holds for its local experts after the dispatch are gathered over the group, every rank runs
// its slice of the experts on all of them, and the partial outputs are summed back to the
// rows' owners (Megatron's gather and reduce-scatter over the expert tensor-parallel group).
// Gathered rows are expert-major: local expert after local expert, within one the group's
// ranks in order, each rank's rows in its own order. Each call sends one message to every
// other rank of the group and receives one from it (its rows for all the local experts
// together), staged and reordered by device copies where a side's rows are not contiguous.
class ExpertTensorExchange {
 public:
  // Collective over `etp`: from where each of this rank's `local_experts` starts in its rows
  // (offsets [local_experts + 1]), one all-gather of every rank's counts.
  ExpertTensorExchange(Communicator& etp, const int32_t* offsets, int local_experts);

  int own_rows() const { return own_.back(); }
  int rows() const { return expert_offsets_.back(); }  // gathered
  const std::vector<int32_t>& expert_offsets() const { return expert_offsets_; }
  // Rows of the scratch both calls take as `staging` ([staging_rows(), width]): the other
  // ranks' rows (gather receives them there; reduce_scatter packs its parts of them there), and
  // for reduce_scatter the parts of this rank's rows from all other ranks but one (that one
  // lands in `mine`): rows() - own_rows() + max(etp - 2, 0) own_rows().
  int staging_rows() const;

  // Collective: `all` [rows(), width] from every rank's `mine` [own_rows(), width] (the
  // arrays are `e`'s memory, moved by the group's sends and receives).
  template <typename T>
  void gather(T* all, const T* mine, int width, const ops::Exec& e, T* staging) const;
  // Collective, the inverse: `mine` [own_rows(), width] the sum over the group's ranks, in
  // rank order, of their `all`'s rows that are this rank's.
  template <typename T>
  void reduce_scatter(T* mine, const T* all, int width, const ops::Exec& e, T* staging) const;

 private:
  Communicator* etp_;
  int local_;
  std::vector<int32_t> own_;             // this rank's offsets [local + 1]
  std::vector<int32_t> counts_;          // rank r's rows of expert l at [r local + l]
  std::vector<int32_t> at_;              // where they sit among the gathered rows
  std::vector<int32_t> expert_offsets_;  // gathered [local + 1]
  // Where rank r's rows start in staging ([ranks + 1]; the other ranks' in rank order, this
  // rank's empty).
  std::vector<int32_t> peer_at_;
};

// The allgather dispatcher's routing of every rank of `ep`, in rank order: probabilities
// and expert indices [ranks tokens, topk] (host memory).
template <typename P>
struct GatheredRouting {
  std::vector<P> probs;
  std::vector<int32_t> indices;
};
// Collective over `ep`: one all-gather of every rank's token count, probabilities and
// indices (host arrays [tokens, topk]) packed as 1 + 2 tokens topk values of P (an index is
// exact in P). UsageError naming the dispatcher when the ranks' token counts differ (their
// micro-batches must be the same size).
template <typename P>
GatheredRouting<P> gather_routing(Communicator& ep, const P* probs, const int32_t* indices,
                                  int tokens, int topk);

// The allgather dispatcher's plan over the gathered tokens: `indices` and `probs` [ep tokens,
// topk] are every rank's routing in rank order (`tokens` per rank); the plan lists the rows
// of local experts [first_expert, first_expert + local_experts) (its `experts`), with
// row_token a gathered token and row_slot a gathered (token, k) slot. Each source's rows
// are those of its own plan (moe_dispatch_plan over its tokens, with its capacity).
template <typename T>
ops::MoEDispatchPlan expert_allgather_plan(const int32_t* indices, const T* probs, int tokens,
                                           int ranks, int experts, int topk,
                                           const ops::MoECapacityArgs& capacity, int first_expert,
                                           int local_experts);

}  // namespace omni
