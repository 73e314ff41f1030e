#include "train/expert_grads.h"

#include <algorithm>

#include "model/moe_layer.h"

namespace omni {

namespace {
std::vector<ParamInfo> experts_of(const std::vector<ParamInfo>& infos, bool experts) {
  std::vector<ParamInfo> out;
  for (const ParamInfo& p : infos)
    if (is_expert_parameter(p.name) == experts) out.push_back(p);
  return out;
}
}  // namespace

std::unique_ptr<ExpertGradients> ExpertGradients::make(const ProcessGrid& grid,
                                                       const std::vector<ParamInfo>& infos,
                                                       const Tensor& grads, double bucket_size,
                                                       bool sharded, const ops::Exec& exec,
                                                       const std::vector<int64_t>& close_at) {
  if (grid.ep_size() == 1 && !grid.own_expert_tp()) return nullptr;
  // Also on a pipeline stage without MoE layers (no experts): sum() stays collective.
  return std::unique_ptr<ExpertGradients>(new ExpertGradients(
      grid, experts_of(infos, true), grads, bucket_size, sharded, exec, close_at));
}

std::vector<ParamInfo> ExpertGradients::dense(const ProcessGrid& grid,
                                              const std::vector<ParamInfo>& infos) {
  return grid.ep_size() == 1 && !grid.own_expert_tp() ? infos : experts_of(infos, false);
}

ExpertGradients::ExpertGradients(const ProcessGrid& grid, std::vector<ParamInfo> experts,
                                 const Tensor& grads, double bucket_size, bool sharded,
                                 const ops::Exec& exec, const std::vector<int64_t>& close_at)
    : grid_(grid),
      experts_(std::move(experts)),
      sharded_(sharded),
      exec_(exec),
      buckets_(grid.expert_dp(), experts_, grads, bucket_size,
               sharded ? GradReduce::ReduceScatter : GradReduce::AllReduce, exec, close_at) {
  // The buckets sum over the expert-data-parallel ranks; Megatron divides that sum by the
  // data-parallel size (dp x cp: ep times the group's size when etp = tp), in the one
  // scaling pass.
  buckets_.set_gradient_scale(1.0 / double(grid.dp_cp().size()));
}

void ExpertGradients::finish() {
  buckets_.finish();
}

std::vector<ShardRange> ExpertGradients::ranges() const {
  std::vector<ShardRange> r;
  for (const ParamInfo& p : experts_) r.push_back({p.offset, p.offset + p.numel});
  return r;
}

void ExpertGradients::complete_sums(double* sums, const std::vector<Part>& parts) const {
  const size_t n = parts.size();
  std::vector<double> experts(n, 0.0);
  // fc2's biases, whole on every expert tensor-parallel rank: counted on the first.
  const bool first_slice = grid_.expert_tp().rank() == 0;
  for (const ShardRange& r : sharded_ ? buckets_.shard() : ranges())
    for (const ParamInfo& p : experts_) {
      if (p.etp_replicated && !first_slice) continue;
      const int64_t b = std::max(r.begin, p.offset), e = std::min(r.end, p.offset + p.numel);
      if (b < e)
        for (size_t i = 0; i < n; ++i) experts[i] += parts[i].op(parts[i].data + b, size_t(e - b));
    }
  if (sharded_) {  // every rank holds a shard of both: one sum over all their ranks
    for (size_t i = 0; i < n; ++i) sums[i] += experts[i];
    grid_.dp_cp().all_reduce(sums, n);
  } else if (grid_.own_expert_tp()) {
    // The experts' elements each once on the expert grid's tp-ep-pp ranks, the dense ones on
    // the dense tp-pp ranks: two sums.
    if (grid_.expert_model_parallel().size() > 1)
      grid_.expert_model_parallel().all_reduce(experts.data(), n);
    if (grid_.model_parallel().size() > 1) grid_.model_parallel().all_reduce(sums, n);
    for (size_t i = 0; i < n; ++i) sums[i] += experts[i];
    return;
  } else {  // the dense parts are whole here, the experts' split over the expert-parallel ranks
    grid_.ep().all_reduce(experts.data(), n);
    for (size_t i = 0; i < n; ++i) sums[i] += experts[i];
  }
  if (grid_.model_parallel().size() > 1) grid_.model_parallel().all_reduce(sums, n);
}

void ExpertGradients::make_optimizer(const OptimizerConfig& config,
                                     const ParameterSet<float>& params) {
  // The zoo's per-tensor quantities (LAMB's norms, adam8bit's block maxima) are reduced over
  // the shard's group and over the expert tensor-parallel ranks holding the other slices of
  // each expert (one rank at ETP 1; at ETP = TP the dense tp group).
  optimizer_ = std::make_unique<DistributedOptimizer<float>>(config, buckets_, params, exec_,
                                                             &grid_.expert_tp());
}

}  // namespace omni
