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
                                                       bool sharded, const ops::Exec& exec) {
  if (grid.ep_size() == 1) return nullptr;
  // Also on a pipeline stage without MoE layers (no experts): sum() stays collective.
  return std::unique_ptr<ExpertGradients>(
      new ExpertGradients(grid, experts_of(infos, true), grads, bucket_size, sharded, exec));
}

std::vector<ParamInfo> ExpertGradients::dense(const ProcessGrid& grid,
                                              const std::vector<ParamInfo>& infos) {
  return grid.ep_size() == 1 ? infos : experts_of(infos, false);
}

ExpertGradients::ExpertGradients(const ProcessGrid& grid, std::vector<ParamInfo> experts,
                                 const Tensor& grads, double bucket_size, bool sharded,
                                 const ops::Exec& exec)
    : grid_(grid),
      experts_(std::move(experts)),
      grads_(grads),
      sharded_(sharded),
      exec_(exec),
      buckets_(grid.expert_dp(), experts_, grads, bucket_size,
               sharded ? GradReduce::ReduceScatter : GradReduce::AllReduce, exec) {}

void ExpertGradients::finish() {
  // The buckets average over the expert-data-parallel ranks; Megatron divides the sum by the
  // data-parallel size (dp x cp, ep times the group's size).
  float* g = grads_.data<float>();
  for (const ParamInfo& p : experts_)
    ops::scale(exec_, g + p.offset, 1.0 / grid_.ep_size(), size_t(p.numel));
  buckets_.finish();
}

std::vector<ShardRange> ExpertGradients::ranges() const {
  std::vector<ShardRange> r;
  for (const ParamInfo& p : experts_) r.push_back({p.offset, p.offset + p.numel});
  return r;
}

double ExpertGradients::sum(const float* data,
                            const std::function<double(const float*, size_t)>& op) const {
  double s = 0;
  for (const ShardRange& r : sharded_ ? buckets_.shard() : ranges())
    for (const ParamInfo& p : experts_) {
      const int64_t b = std::max(r.begin, p.offset), e = std::min(r.end, p.offset + p.numel);
      if (b < e) s += op(data + b, size_t(e - b));
    }
  if (sharded_) grid_.expert_dp().all_reduce(&s, 1);
  grid_.ep().all_reduce(&s, 1);
  grid_.model_parallel().all_reduce(&s, 1);
  return s;
}

void ExpertGradients::make_optimizer(const OptimizerConfig& config,
                                     const ParameterSet<float>& params) {
  optimizer_ = std::make_unique<DistributedOptimizer<float>>(config, buckets_, params, exec_);
}

}  // namespace omni
