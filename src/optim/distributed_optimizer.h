// Megatron's distributed optimizer (--use-distributed-optimizer, ZeRO stage 1): each
// data-parallel rank keeps optimizer state only for its shard of the flat parameter buffer,
// the shard that DataParallelBuckets' reduce-scatter leaves it the averaged gradients of.
//
//   omni::DataParallelBuckets<float> ddp(grid.dp_cp(), params, opts.ddp_bucket_size,
//                                        omni::GradReduce::ReduceScatter);
//   omni::DistributedOptimizer<float> opt(opts.optim, ddp, params);
//   ... backward with ddp.mark_ready(...); ddp.finish();
//   const double norm = opt.gradient_norm(params, /*model-parallel group or null*/);
//   if (clip) opt.scale_gradients(params, coeff);
//   opt.step(params, lr);  // updates the shard, then all-gathers the parameters
//
// The update of each element is Optimizer<T>'s (update_elements), with weight decay only
// where ParamInfo::weight_decay, so parameters match an unsharded Optimizer fed the same
// reduced gradients. Checkpoints stay layout-independent: gather_state() assembles a state
// buffer laid out like the parameters on every rank, load_state() keeps this rank's shard
// of such a buffer.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel.h"

namespace omni {

template <typename T>
class DistributedOptimizer {
 public:
  // `buckets` (in ReduceScatter mode) must outlive this object. `exec`: the device the
  // parameters live on, where the states go too.
  // `tensor_parallel`: as Optimizer<T>'s.
  DistributedOptimizer(const OptimizerConfig& config, const DataParallelBuckets<T>& buckets,
                       const ParameterSet<T>& params, const ops::Exec& exec = {},
                       Communicator* tensor_parallel = nullptr);

  // L2 norm of all gradients: this rank's shard summed in a fixed order, then summed (in
  // f64) over the data-parallel group and, when given, over `model_parallel` too.
  double gradient_norm(const ParameterSet<T>& params, Communicator* model_parallel = nullptr) const;
  // Multiplies this rank's shard of the gradients by `scale` (the rest is not read).
  void scale_gradients(ParameterSet<T>& params, double scale) const;
  // Updates this rank's shard with learning rate `lr`, then all-gathers the parameters so
  // every rank holds all of them. Collective over the data-parallel group.
  void step(ParameterSet<T>& params, double lr);
  // ZeRO stage 3: step() leaves the parameters sharded (each layer is gathered where used).
  void set_gather_params(bool gather) { gather_params_ = gather; }

  int64_t steps() const { return step_; }
  void set_steps(int64_t steps) { step_ = steps; }
  OptimizerKind kind() const { return cfg_.kind; }
  // Optimizer<T>'s names: "exp_avg", "exp_avg_sq" (Adam, AdamW); "momentum_buffer" (SGD);
  // the zoo's (optimizer_zoo.h).
  std::vector<std::string> state_names() const;
  // The zoo's scalar state (schedule-free's), the same on every rank.
  std::vector<std::string> scalar_names() const;
  double& scalar(const std::string& name) const;
  // The whole state `name`, laid out like the parameters, into `full` (params.size()
  // elements, memory of the optimizer's device) on every rank. Collective over the
  // data-parallel group.
  void gather_state(const std::string& name, T* full) const;
  // Takes this rank's shard of a whole state buffer (as gather_state writes it).
  void load_state(const std::string& name, const T* full);
  // This rank's shard of state `name` in place: buckets.shard()'s ranges one after another,
  // in the optimizer's device memory (sharded checkpoints write and read it there).
  T* shard_state(const std::string& name) const;
  // The zoo optimizer that steps the shard (null for AdamW and SGD).
  const ZooOptimizer<T>* zoo() const { return zoo_.get(); }

 private:
  // A run of one parameter's elements inside this rank's shard.
  struct Piece {
    int64_t begin, end;  // in the flat buffer
    int64_t state;       // where its state starts in m_ / v_
    bool decay;
    size_t param;
  };
  // The shard's state buffer `name`: m_ (exp_avg, momentum_buffer), v_ (exp_avg_sq) or the
  // zoo's.
  T* state(const std::string& name) const;

  OptimizerConfig cfg_;
  const DataParallelBuckets<T>& buckets_;
  std::vector<Piece> pieces_;
  std::vector<int64_t> range_state_;  // per shard range, its start in m_ / v_
  int64_t step_ = 0;
  bool gather_params_ = true;
  ops::Exec x_;
  Tensor m_, v_;  // this rank's shard of each state, on the parameters' device
  std::shared_ptr<ZooOptimizer<T>> zoo_;  // set for the zoo's kinds (its own states)
};

}  // namespace omni
