#include "optim/distributed_optimizer.h"

#include <algorithm>
#include <cmath>

#include "backend/ops.h"
#include "base/error.h"
#include "base/trace.h"
#include "optim/optimizer_zoo.h"

namespace omni {

template <typename T>
DistributedOptimizer<T>::DistributedOptimizer(const OptimizerConfig& config,
                                              const DataParallelBuckets<T>& buckets,
                                              const ParameterSet<T>& params, const ops::Exec& exec,
                                              Communicator* tensor_parallel)
    : cfg_(config), buckets_(buckets), x_(exec) {
  OMNI_CHECK(buckets.mode() == GradReduce::ReduceScatter,
             "[distributed optimizer] needs data-parallel buckets in reduce-scatter mode");
  int64_t state = 0;
  for (const ShardRange& r : buckets.shard()) {
    range_state_.push_back(state);
    for (size_t i = 0; i < params.infos().size(); ++i) {
      const ParamInfo& p = params.infos()[i];
      const int64_t begin = std::max(r.begin, p.offset), end = std::min(r.end, p.offset + p.numel);
      if (begin < end)
        pieces_.push_back({begin, end, state + (begin - r.begin), p.weight_decay, i});
    }
    state += r.end - r.begin;
  }
  if (is_zoo_optimizer(cfg_.kind)) {  // the zoo on this rank's pieces (optimizer_zoo.h)
    ZooLayout<T> layout;
    for (const Piece& p : pieces_) layout.pieces.push_back({p.param, p.begin, p.end, p.state});
    layout.state_size = state;
    layout.data_parallel = &buckets.group();
    layout.gather_pieces = [&buckets](T* full) { buckets.all_gather(full); };
    layout.tensor_parallel = tensor_parallel;
    layout.exec = x_;
    zoo_ = make_zoo_optimizer(cfg_, params, layout);
    return;
  }
  const Device device = params.values_tensor().device();
  m_ = Tensor::zeros({state}, dtype_of<T>(), device, x_.memory());
  if (cfg_.kind != OptimizerKind::SGD)
    v_ = Tensor::zeros({state}, dtype_of<T>(), device, x_.memory());
}

template <typename T>
double DistributedOptimizer<T>::gradient_norm(const ParameterSet<T>& params,
                                              Communicator* model_parallel) const {
  double sum = 0;
  for (const ShardRange& r : buckets_.shard())
    sum += ops::sum_squares(x_, params.grads() + r.begin, static_cast<size_t>(r.end - r.begin));
  buckets_.group().all_reduce(&sum, 1);
  if (model_parallel) model_parallel->all_reduce(&sum, 1);
  return std::sqrt(sum);
}

template <typename T>
void DistributedOptimizer<T>::scale_gradients(ParameterSet<T>& params, double scale) const {
  for (const ShardRange& r : buckets_.shard())
    ops::scale(x_, params.grads() + r.begin, scale, static_cast<size_t>(r.end - r.begin));
}

template <typename T>
void DistributedOptimizer<T>::step(ParameterSet<T>& params, double lr) {
  ++step_;
  if (zoo_) {
    zoo_->step(params, lr, step_);
  } else {
    T* m = m_.template data<T>();
    T* v = v_.defined() ? v_.template data<T>() : nullptr;
    for (const Piece& p : pieces_)
      update_elements(x_, cfg_, step_, lr, p.decay, params.values() + p.begin,
                      params.grads() + p.begin, m + p.state, v ? v + p.state : nullptr,
                      p.end - p.begin);
  }
  if (!gather_params_) return;
  TraceSpan span("params-all-gather");
  buckets_.all_gather(params.values());
}

template <typename T>
std::vector<std::string> DistributedOptimizer<T>::state_names() const {
  if (zoo_) return zoo_->state_names();
  if (cfg_.kind == OptimizerKind::SGD) return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq"};
}

template <typename T>
std::vector<std::string> DistributedOptimizer<T>::scalar_names() const {
  return zoo_ ? zoo_->scalar_names() : std::vector<std::string>{};
}

template <typename T>
double& DistributedOptimizer<T>::scalar(const std::string& name) const {
  if (zoo_) return zoo_->scalar(name);
  throw InternalError("[distributed optimizer] no scalar state '" + name + "'");
}

template <typename T>
T* DistributedOptimizer<T>::state(const std::string& name) const {
  if (zoo_) return zoo_->state_buffer(name);
  const bool adam = cfg_.kind != OptimizerKind::SGD;
  if ((name == "exp_avg" && adam) || (name == "momentum_buffer" && !adam))
    return m_.template data<T>();
  if (name == "exp_avg_sq" && adam) return v_.template data<T>();
  throw InternalError("[distributed optimizer] no state buffer '" + name + "'");
}

template <typename T>
void DistributedOptimizer<T>::gather_state(const std::string& name, T* full) const {
  const T* s = state(name);
  const std::vector<ShardRange>& shard = buckets_.shard();
  for (size_t i = 0; i < shard.size(); ++i)
    ops::copy(x_, full + shard[i].begin, s + range_state_[i],
              size_t(shard[i].end - shard[i].begin));
  buckets_.all_gather(full);
}

template <typename T>
T* DistributedOptimizer<T>::shard_state(const std::string& name) const {
  return state(name);
}

template <typename T>
void DistributedOptimizer<T>::load_state(const std::string& name, const T* full) {
  T* s = state(name);
  const std::vector<ShardRange>& shard = buckets_.shard();
  for (size_t i = 0; i < shard.size(); ++i)
    ops::copy(x_, s + range_state_[i], full + shard[i].begin,
              size_t(shard[i].end - shard[i].begin));
}

template class DistributedOptimizer<float>;
template class DistributedOptimizer<double>;

}  // namespace omni
