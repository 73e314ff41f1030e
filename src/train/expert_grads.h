// Expert parallelism's gradient reduction in the trainer (Megatron-Core's
// finalize_model_grads with expert parallelism): dense parameters are averaged over the data-
// (and context-) parallel ranks as before, while each routed expert's gradient already holds
// the contributions of every expert-parallel rank's tokens (the dispatch brought them to it),
// so it is summed over the expert-data-parallel group (the ranks holding the same experts) and
// divided by the data-parallel size, which is an average over that group times 1/ep.
#pragma once

#include <memory>
#include <vector>

#include "backend/ops.h"
#include "comm/process_grid.h"
#include "parallel/data_parallel.h"
#include "tensor/parameters.h"

namespace omni {

class ExpertGradients {
 public:
  // Null without expert parallelism (ep 1): then the dense buckets reduce every parameter.
  static std::unique_ptr<ExpertGradients> make(const ProcessGrid& grid,
                                               const std::vector<ParamInfo>& infos,
                                               const Tensor& grads, double bucket_size,
                                               const ops::Exec& exec);
  // The parameters the data-parallel buckets reduce: all but the experts' when ep > 1.
  static std::vector<ParamInfo> dense(const ProcessGrid& grid, const std::vector<ParamInfo>& infos);

  // After the backward (and the dense buckets' finish): the experts' gradients reduced.
  void finish();
  // The squared L2 norm of the experts' gradients `grads` (laid out like the parameters) that
  // the other expert-parallel ranks hold: added to this rank's sum over all its parameters,
  // every expert counts once in the model-parallel norm.
  double other_ranks_norm_squared(const float* grads) const;

 private:
  ExpertGradients(const ProcessGrid& grid, std::vector<ParamInfo> experts, const Tensor& grads,
                  double bucket_size, const ops::Exec& exec);
  const ProcessGrid& grid_;
  std::vector<ParamInfo> experts_;
  Tensor grads_;
  ops::Exec exec_;
  DataParallelBuckets<float> buckets_;
};

}  // namespace omni
