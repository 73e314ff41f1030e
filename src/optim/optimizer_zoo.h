// The optimizer zoo: the optimizers of Megatron-DeepSpeed's OPT list beyond Adam and SGD,
// and the Lion and Muon that Megatron offers, on the flat parameter buffers of one rank's
// ParameterSet (the CPU). Optimizer<T> (optim/optimizer.h) holds one of these for the
// zoo's kinds and forwards step() and its state to it.
//
//   lamb                LAMB (You et al. 2019, arXiv:1904.00962), as DeepSpeed's FusedLamb:
//                       Adam's update scaled per tensor by the clamped trust ratio
//   lion                Lion (Chen et al. 2023, arXiv:2302.06675): the sign of interpolated
//                       momentum, decoupled weight decay
//   muon                Muon (Jordan et al. 2024; Megatron's TensorParallelMuon): momentum
//                       orthogonalised by Newton-Schulz for 2-D weights, AdamW for the rest
//   adamwschedulefree   Schedule-free AdamW and SGD (Defazio et al. 2024, arXiv:2405.15682),
//   sgdschedulefree     as facebookresearch/schedule_free's reference implementations
//   sophiag             SophiaG (Liu et al. 2023, arXiv:2305.14342), as Megatron-DeepSpeed's
//                       copy of the reference sophia.py
//   adam8bit            8-bit Adam with block-wise dynamic quantisation of both moments
//                       (Dettmers et al. 2022, arXiv:2110.02861), as bitsandbytes' Adam8bit
//   galoreadamw         GaLore (Zhao et al. 2024, arXiv:2403.03507), as galore_torch's
//   galoreadamw8bit     GaLoreAdamW and GaLoreAdamW8bit: Adam on the gradient of each hidden
//   galoreadamw8bitperlayer  matrix projected on its top singular vectors (the per-layer
//                       variant steps each tensor from a gradient hook there: same math here)
//   shampoo             Shampoo (Gupta, Koren, Singer 2018, arXiv:1802.09568), as Meta's
//                       DistributedShampoo with Adam grafting behind Megatron-DeepSpeed's
//                       OPT=shampoo
//
// Each family's file cites its reference and says how the state is laid out. States are
// exposed as buffers shaped like the flat parameter buffer, which checkpoints save.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace omni {

// The zoo's kind for an --optimizer or OPT name (aliases included), or none.
std::optional<OptimizerKind> parse_zoo_optimizer(const std::string& name);
// The zoo's names, for messages: "lamb, lion, ...".
std::string zoo_optimizer_names();
// The canonical name of a zoo kind (what checkpoints record).
const char* zoo_optimizer_name(OptimizerKind kind);
bool is_zoo_optimizer(OptimizerKind kind);

template <typename T>
class ZooOptimizer {
 public:
  virtual ~ZooOptimizer() = default;
  // One update at step `step` (1-based) with learning rate `lr`.
  virtual void step(ParameterSet<T>& params, double lr, int64_t step) = 0;
  virtual std::vector<std::string> state_names() const = 0;
  // A buffer of params.size() elements laid out like the parameters. What is written into
  // it is the state from the next step on.
  virtual T* state_buffer(const std::string& name) = 0;
  virtual std::vector<std::string> scalar_names() const { return {}; }
  // SophiaG's Hessian estimate: an EMA of the squares of the current gradients, which for
  // the Gauss-Newton-Bartlett estimator are those of a loss on labels sampled from the
  // model. Only SophiaG has one.
  virtual void update_hessian(const ParameterSet<T>& params);
  virtual double& scalar(const std::string& name);
};

// The zoo optimizer of `config.kind` for `params` (host memory, whole tensors).
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_zoo_optimizer(const OptimizerConfig& config,
                                                    const ParameterSet<T>& params);

// Families (one file each).
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_elementwise_zoo_optimizer(const OptimizerConfig& config,
                                                                const ParameterSet<T>& params);
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_muon(const OptimizerConfig& config,
                                           const ParameterSet<T>& params);
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_adam8bit(const OptimizerConfig& config,
                                               const ParameterSet<T>& params);
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_galore(const OptimizerConfig& config,
                                             const ParameterSet<T>& params);
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_shampoo(const OptimizerConfig& config,
                                              const ParameterSet<T>& params);

// The 2-D weights of the hidden layers (not the word embeddings or the output layer): the
// matrices Muon orthogonalises and GaLore projects.
bool is_hidden_matrix(const ParamInfo& p);

// bitsandbytes' 256-value dynamic quantisation map, sorted (signed: the first moment's).
std::array<float, 256> dynamic_quantization_map(bool is_signed);

// The zoo's parameter-shaped states: named buffers of params.size() zeros.
template <typename T>
class ZooStates {
 public:
  ZooStates(std::vector<std::string> names, int64_t size);
  const std::vector<std::string>& names() const { return names_; }
  T* get(const std::string& name);

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<T>> buffers_;
};

}  // namespace omni
