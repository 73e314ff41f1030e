// Optimizers over flat parameter buffers. Per Megatron, weight decay is decoupled
// (AdamW) and applied only to parameters marked weight_decay (not biases or norms).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "optim/optimizer_zoo_config.h"
#include "tensor/parameters.h"

namespace omni {

// Megatron's --optimizer adam is Adam with decoupled weight decay (its OptimizerConfig's
// decoupled_weight_decay defaults to true and no flag turns it off): AdamW. "adamw" names the
// same. sgd is torch.optim.SGD: momentum, weight decay added to the gradient (L2).
// The rest are the zoo (optim/optimizer_zoo.h): Megatron-DeepSpeed's OPT list, Lion and Muon.
enum class OptimizerKind {
  AdamW,
  SGD,
  Lamb,
  Lion,
  Muon,
  AdamWScheduleFree,
  SGDScheduleFree,
  Adam8bit,
  SophiaG,
  GaLoreAdamW,
  GaLoreAdamW8bit,
  GaLoreAdamW8bitPerLayer,
  Shampoo
};
OptimizerKind parse_optimizer(const std::string& s);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  double weight_decay = 0.01;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  double clip_grad = 1.0;  // global-norm clipping; 0 disables
  ZooConfig zoo;           // the zoo's own hyper-parameters
};

// Global L2 norm of all gradients, summed in a fixed order; `exec`: their device.
template <typename T>
double gradient_norm(const ParameterSet<T>& params, const ops::Exec& exec = {});
// Multiplies all gradients by `scale`.
template <typename T>
void scale_gradients(ParameterSet<T>& params, double scale, const ops::Exec& exec = {});

// One update of n consecutive elements of one parameter (weights w, gradients g, state m
// and, for Adam, v) at step `step` (1-based). Optimizer and DistributedOptimizer both call
// it, so a sharded update does the same arithmetic per element as the whole one.
// AdamW's `grad_scale` multiplies each gradient as it is read, as g * T(grad_scale): the
// clipping scale_gradients would do in a pass of its own, with the same rounding (SGD's must
// be 1). AdamW's `zero_grads`, where given, is g itself: each gradient is zeroed once read.
template <typename T>
void update_elements(const OptimizerConfig& cfg, int64_t step, double lr, bool decay, T* w,
                     const T* g, T* m, T* v, int64_t n, double grad_scale = 1.0,
                     T* zero_grads = nullptr);
// The same update on `exec`'s device (AdamW only on a GPU).
template <typename T>
void update_elements(const ops::Exec& exec, const OptimizerConfig& cfg, int64_t step, double lr,
                     bool decay, T* w, const T* g, T* m, T* v, int64_t n);

template <typename T>
class ZooOptimizer;

template <typename T>
class Optimizer {
 public:
  // The states live where `exec` says, as the parameters do. `tensor_parallel`: the group
  // over which tensor parallelism splits tensors (the zoo's per-tensor quantities are the
  // whole tensor's); `expert_tensor_parallel`: the one splitting the tensors `expert` marks
  // (one flag per parameter), where it is another (ZooLayout).
  Optimizer(const OptimizerConfig& config, const ParameterSet<T>& params,
            const ops::Exec& exec = {}, Communicator* tensor_parallel = nullptr,
            Communicator* expert_tensor_parallel = nullptr, std::vector<bool> expert = {});
  // One update with learning rate `lr` from the current gradients (already clipped), or
  // from the gradients times `grad_scale`: the clipping applied as the update reads them
  // (the gradients are left as they are); the same update as scale_gradients then step.
  // `zero_grads`: where the update can (AdamW on the CPU), it zeroes every gradient once read,
  // the flat buffer's padding too, and returns true: the next step needs no zeroing pass.
  bool step(ParameterSet<T>& params, double lr, double grad_scale = 1.0, bool zero_grads = false);
  int64_t steps() const { return step_; }
  // The state buffers by PyTorch's names ("exp_avg", "exp_avg_sq"; "momentum_buffer"),
  // each laid out like the parameters' flat buffer. Checkpoints save and restore these
  // with the step count, which is all an exact resume needs.
  std::vector<std::string> state_names() const;
  T* state_buffer(const std::string& name) const;
  void set_steps(int64_t steps) { step_ = steps; }
  OptimizerKind kind() const { return cfg_.kind; }
  // Scalar state beside the buffers (schedule-free's averaging weights), saved with them.
  std::vector<std::string> scalar_names() const;
  double& scalar(const std::string& name) const;

 private:
  OptimizerConfig cfg_;
  ops::Exec x_;
  int64_t step_ = 0;
  Tensor m_, v_;
  std::shared_ptr<ZooOptimizer<T>> zoo_;  // set for the zoo's kinds
};

}  // namespace omni
