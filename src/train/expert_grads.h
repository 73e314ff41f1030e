// Expert parallelism in the trainer (Megatron-Core's finalize_model_grads and its expert
// optimizer groups): dense parameters are averaged over the data- (and context-) parallel
// ranks as before, while each routed expert's gradient already holds the contributions of
// every expert-parallel rank's tokens (the dispatch brought them to it), so it is summed over
// the expert-data-parallel group (the ranks holding the same experts) and divided by the
// data-parallel size: an average over that group times 1/ep. With the distributed optimizer
// the experts' states are sharded over that group (their own buckets and optimizer); under
// ZeRO 2/3 so are their gradients and parameters (ZeroSharding reduces their buckets).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/ops.h"
#include "comm/process_grid.h"
#include "optim/distributed_optimizer.h"
#include "parallel/data_parallel.h"
#include "tensor/parameters.h"

namespace omni {

class ExpertGradients {
 public:
  // Null without expert parallelism (ep 1): then the dense buckets reduce every parameter.
  // `sharded`: the distributed optimizer's reduce-scatter (then call make_optimizer).
  // close_at: where buckets must close as well (ZeRO 2/3: zero_bucket_boundaries).
  static std::unique_ptr<ExpertGradients> make(const ProcessGrid& grid,
                                               const std::vector<ParamInfo>& infos,
                                               const Tensor& grads, double bucket_size,
                                               bool sharded, const ops::Exec& exec,
                                               const std::vector<int64_t>& close_at = {});
  // The parameters the data-parallel buckets reduce: all but the experts' when ep > 1.
  static std::vector<ParamInfo> dense(const ProcessGrid& grid, const std::vector<ParamInfo>& infos);

  // After the backward: the experts' gradients reduced (with sharding: this rank's shard),
  // scaled by 1/dp as the buckets' collective starts (no pass of its own). Under ZeRO 2/3
  // ZeroSharding reduces buckets() instead.
  void finish();
  DataParallelBuckets<float>& buckets() { return buckets_; }
  // Sums over every parameter, each element counted once over the whole grid. On entry
  // sums[i] is this rank's part over the dense parameters (its dense shard when sharded, a
  // tensor-parallel replicated tensor on one tp rank only); parts[i] adds its op over the
  // experts' elements of its data (laid out like the parameters) that this rank owns. All n
  // then travel in one buffer: sharded, one all-reduce over the data x context-parallel
  // group (the expert-parallel and expert-data-parallel groups together span it); else
  // one over the expert-parallel group (the dense parts are whole on every rank); then one
  // over the model-parallel group where it has several ranks. Collective over those groups.
  struct Part {
    const float* data;
    std::function<double(const float*, size_t)> op;
  };
  void complete_sums(double* sums, const std::vector<Part>& parts) const;
  // The experts' ranges of the flat buffer, and (sharded) this rank's shard of them.
  std::vector<ShardRange> ranges() const;
  const std::vector<ShardRange>& shard() const { return buckets_.shard(); }

  // The distributed optimizer of the experts' shard (sharded only); the zoo's per-tensor
  // quantities over the expert-data-parallel and expert-tensor-parallel groups.
  void make_optimizer(const OptimizerConfig& config, const ParameterSet<float>& params);
  DistributedOptimizer<float>* optimizer() const { return optimizer_.get(); }

 private:
  ExpertGradients(const ProcessGrid& grid, std::vector<ParamInfo> experts, const Tensor& grads,
                  double bucket_size, bool sharded, const ops::Exec& exec,
                  const std::vector<int64_t>& close_at);
  const ProcessGrid& grid_;
  std::vector<ParamInfo> experts_;
  bool sharded_;
  ops::Exec exec_;
  DataParallelBuckets<float> buckets_;
  std::unique_ptr<DistributedOptimizer<float>> optimizer_;
};

}  // namespace omni
