#include "optim/distributed_optimizer.h"

#include <algorithm>
#include <cmath>

#include "backend/ops.h"
#include "base/error.h"
#include "base/trace.h"

namespace omni {

template <typename T>
DistributedOptimizer<T>::DistributedOptimizer(const OptimizerConfig& config,
                                              const DataParallelBuckets<T>& buckets,
                                              const ParameterSet<T>& params, const ops::Exec& exec)
    : cfg_(config), buckets_(buckets), x_(exec) {
  OMNI_CHECK(buckets.mode() == GradReduce::ReduceScatter,
             "[distributed optimizer] needs data-parallel buckets in reduce-scatter mode");
  int64_t state = 0;
  for (const ShardRange& r : buckets.shard()) {
    range_state_.push_back(state);
    for (const ParamInfo& p : params.infos()) {
      const int64_t begin = std::max(r.begin, p.offset), end = std::min(r.end, p.offset + p.numel);
      if (begin < end) pieces_.push_back({begin, end, state + (begin - r.begin), p.weight_decay});
    }
    state += r.end - r.begin;
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
  T* m = m_.template data<T>();
  T* v = v_.defined() ? v_.template data<T>() : nullptr;
  for (const Piece& p : pieces_)
    update_elements(x_, cfg_, step_, lr, p.decay, params.values() + p.begin,
                    params.grads() + p.begin, m + p.state, v ? v + p.state : nullptr,
                    p.end - p.begin);
  if (!gather_params_) return;
  TraceSpan span("params-all-gather");
  buckets_.all_gather(params.values());
}

template <typename T>
std::vector<std::string> DistributedOptimizer<T>::state_names() const {
  if (cfg_.kind == OptimizerKind::SGD) return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq"};
}

template <typename T>
bool DistributedOptimizer<T>::is_second_moment(const std::string& name) const {
  const bool adam = cfg_.kind != OptimizerKind::SGD;
  if ((name == "exp_avg" && adam) || (name == "momentum_buffer" && !adam)) return false;
  if (name == "exp_avg_sq" && adam) return true;
  throw InternalError("[distributed optimizer] no state buffer '" + name + "'");
}

template <typename T>
void DistributedOptimizer<T>::gather_state(const std::string& name, T* full) const {
  const T* s = (is_second_moment(name) ? v_ : m_).template data<T>();
  const std::vector<ShardRange>& shard = buckets_.shard();
  for (size_t i = 0; i < shard.size(); ++i)
    ops::copy(x_, full + shard[i].begin, s + range_state_[i],
              size_t(shard[i].end - shard[i].begin));
  buckets_.all_gather(full);
}

template <typename T>
T* DistributedOptimizer<T>::shard_state(const std::string& name) const {
  return (is_second_moment(name) ? v_ : m_).template data<T>();
}

template <typename T>
void DistributedOptimizer<T>::load_state(const std::string& name, const T* full) {
  T* s = (is_second_moment(name) ? v_ : m_).template data<T>();
  const std::vector<ShardRange>& shard = buckets_.shard();
  for (size_t i = 0; i < shard.size(); ++i)
    ops::copy(x_, s + range_state_[i], full + shard[i].begin,
              size_t(shard[i].end - shard[i].begin));
}

template class DistributedOptimizer<float>;
template class DistributedOptimizer<double>;

}  // namespace omni
