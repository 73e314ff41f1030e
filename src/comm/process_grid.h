// ProcessGrid: the world split into Megatron's parallel groups. Ranks are numbered in
// Megatron's order tp-cp-ep-dp-pp, leftmost varying fastest (with --use-tp-pp-dp-mapping,
// tp-cp-ep-pp-dp): for world 16, TP 2, PP 2 the tensor-parallel groups are [0,1] [2,3] ...,
// the data-parallel groups [0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15] and the pipeline
// groups [0,8] [1,9] ... [7,15].
//
//   omni::ParallelLayout layout{.tp = opts.tensor_model_parallel_size,
//                               .cp = opts.context_parallel_size,
//                               .pp = opts.pipeline_model_parallel_size,
//                               .tp_pp_dp_mapping = opts.use_tp_pp_dp_mapping};
//   omni::ProcessGrid grid(omni::world_communicator(), layout);  // collective over the world
//   grid.tp().all_reduce(partial, n);           // row-parallel output
//   if (grid.is_last_stage()) ...;              // pipeline position
//   grid.dp_cp()                                // where gradients are reduced
//   grid.embedding()                            // first + last stage, for tied embeddings
//
// Dense layers see data parallelism over every rank that is not TP, CP or PP, as in
// Megatron-Core. MoE layers' experts are split over the expert-parallel group, carved out of
// those ranks: Megatron's expert grid orders tp-ep-edp-pp (tp-ep-pp-edp with the mapping
// flag), the expert tensor-parallel size being tp and CP folded into the expert data-parallel
// dimension, so with tp = cp = 1 an expert-parallel group is `ep` consecutive data-parallel
// ranks and the expert-data-parallel group (the ranks holding the same experts, over which
// experts' gradients are reduced) the ranks ep apart.
//
// The expert grid's tensor-parallel size is `etp` (--expert-tensor-parallel-size; 0 means tp,
// Megatron's default): the expert grid is then etp-ep-edp-pp with edp = world / (etp ep pp),
// the same world cut another way (etp dividing tp, or a multiple of it: then an expert
// tensor-parallel group is etp/tp whole tensor-parallel groups of consecutive ranks, of other
// data-parallel or context-parallel coordinates). With tp 2, etp 1, ep 2 on 2 ranks the
// expert-parallel group is the dense tensor-parallel group [0,1] and every expert-tensor-parallel
// group one rank; with world 8, tp 2, etp 1, ep 4 the expert-parallel groups are [0,1,2,3]
// [4,5,6,7] and the expert-data-parallel groups [0,4] [1,5] [2,6] [3,7]. The pipeline groups of
// both grids must agree (Megatron's assertion; with --use-tp-pp-dp-mapping and pp > 1 that needs
// etp x ep = tp x cp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace omni {

struct ParallelLayout {
  int tp = 1, cp = 1, ep = 1, pp = 1;
  int etp = 0;  // the experts' tensor-parallel size; 0: tp
  bool tp_pp_dp_mapping = false;
  int expert_tp() const { return etp > 0 ? etp : tp; }
};

// Checks that the layout fits a world of world_size ranks (UsageError naming the flags
// and numbers otherwise: tp cp ep pp must divide it when etp is tp, else tp cp pp and
// etp ep pp) and returns the data-parallel size, world / (tp * cp * pp).
int data_parallel_size(int world_size, const ParallelLayout& layout);

// Every group of one kind, each listing world ranks in ascending order, the groups in
// Megatron's order. `dims` names the dimensions that vary inside a group, joined by '-':
// "tp", "cp", "dp", "pp", "dp-cp" (data parallel with context parallel), "tp-pp" (model
// parallel), ... (as Megatron's RankGenerator.get_ranks).
std::vector<std::vector<int>> rank_groups(int world_size, const ParallelLayout& layout,
                                          const std::string& dims);
// The same over the expert grid's dimensions "tp" (of size etp), "ep", "edp", "pp" (see
// above).
std::vector<std::vector<int>> expert_rank_groups(int world_size, const ParallelLayout& layout,
                                                 const std::string& dims);

class ProcessGrid {
 public:
  // Collective over `world` (each group is a split of it); `world` must outlive the grid.
  ProcessGrid(Communicator& world, const ParallelLayout& layout);

  Communicator& world() const { return *world_; }
  Communicator& tp() const { return *tp_; }
  Communicator& cp() const { return *cp_; }
  Communicator& dp() const { return *dp_; }
  Communicator& pp() const { return *pp_; }
  // Data parallel together with context parallel: Megatron reduces gradients over it.
  Communicator& dp_cp() const { return *dp_cp_; }
  // Tensor and pipeline parallel together (Megatron's model-parallel group).
  Communicator& model_parallel() const { return *mp_; }
  // The first and last stage of this rank's pipeline, for tied embeddings; a group of this
  // rank alone when pp == 1 or on a middle stage.
  Communicator& embedding() const { return *embedding_; }
  // Expert parallel: the ranks that split each MoE layer's experts; expert data parallel: the
  // ranks holding the same experts (experts' gradients are reduced over it).
  Communicator& ep() const { return *ep_; }
  Communicator& expert_dp() const { return *expert_dp_; }
  // The ranks that split each expert's width (etp of them; the dense tp group when etp = tp).
  Communicator& expert_tp() const { return *expert_tp_; }
  // The expert grid's tp-ep ranks (Megatron's expert tp_ep group), made only when etp > tp
  // (else null): the allgather dispatcher gathers tokens over it, its ranks then holding
  // different tokens.
  Communicator* expert_tp_ep() const { return expert_tp_ep_.get(); }
  // The expert grid's tp-ep-pp ranks (Megatron's expert tensor-model-pipeline group): each
  // expert element lives once on them, so experts' norms are summed over it.
  Communicator& expert_model_parallel() const { return *expert_mp_; }
  // Tensor and context parallel together (Megatron's tp_cp group): with etp < tp every rank
  // routes its own sequence-parallel rows, and the balancing losses' counts are summed over it.
  Communicator& tp_cp() const { return *tp_cp_; }
  int ep_rank() const { return ep_->rank(); }
  int ep_size() const { return layout_.ep; }
  int expert_tp_size() const { return layout_.expert_tp(); }
  // Whether the experts have a tensor-parallel size of their own (etp != tp).
  bool own_expert_tp() const { return layout_.expert_tp() != layout_.tp; }

  const ParallelLayout& layout() const { return layout_; }
  int tp_rank() const { return tp_->rank(); }
  int cp_rank() const { return cp_->rank(); }
  int dp_rank() const { return dp_->rank(); }
  int pp_rank() const { return pp_->rank(); }
  int tp_size() const { return layout_.tp; }
  int cp_size() const { return layout_.cp; }
  int dp_size() const { return dp_->size(); }
  int pp_size() const { return layout_.pp; }
  bool is_first_stage() const { return pp_rank() == 0; }
  bool is_last_stage() const { return pp_rank() == pp_size() - 1; }

 private:
  Communicator* world_;
  ParallelLayout layout_;
  std::unique_ptr<Communicator> tp_, cp_, dp_, pp_, dp_cp_, mp_, embedding_, ep_, expert_dp_;
  std::unique_ptr<Communicator> expert_tp_, expert_tp_ep_, expert_mp_, tp_cp_;
};

}  // namespace omni
