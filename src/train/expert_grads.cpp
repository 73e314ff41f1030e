#include "train/expert_grads.h"

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
                                                       const ops::Exec& exec) {
  if (grid.ep_size() == 1) return nullptr;
  std::vector<ParamInfo> experts = experts_of(infos, true);
  if (experts.empty()) return nullptr;  // a pipeline stage without MoE layers
  return std::unique_ptr<ExpertGradients>(
      new ExpertGradients(grid, std::move(experts), grads, bucket_size, exec));
}

std::vector<ParamInfo> ExpertGradients::dense(const ProcessGrid& grid,
                                              const std::vector<ParamInfo>& infos) {
  return grid.ep_size() == 1 ? infos : experts_of(infos, false);
}

ExpertGradients::ExpertGradients(const ProcessGrid& grid, std::vector<ParamInfo> experts,
                                 const Tensor& grads, double bucket_size, const ops::Exec& exec)
    : grid_(grid),
      experts_(std::move(experts)),
      grads_(grads),
      exec_(exec),
      buckets_(grid.expert_dp(), experts_, grads, bucket_size, GradReduce::AllReduce, exec) {}

void ExpertGradients::finish() {
  // The buckets average over the expert-data-parallel ranks; Megatron divides the sum by the
  // data-parallel size (dp x cp, ep times the group's size).
  float* g = grads_.data<float>();
  for (const ParamInfo& p : experts_)
    ops::scale(exec_, g + p.offset, 1.0 / grid_.ep_size(), size_t(p.numel));
  buckets_.finish();
}

double ExpertGradients::other_ranks_norm_squared(const float* grads) const {
  double mine = 0;
  for (const ParamInfo& p : experts_)
    mine += ops::sum_squares(exec_, grads + p.offset, size_t(p.numel));
  double all = mine;
  grid_.ep().all_reduce(&all, 1);
  return all - mine;
}

}  // namespace omni
