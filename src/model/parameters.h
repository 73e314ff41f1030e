// Parameters and gradients live in flat buffers with named views (DESIGN.md invariant 4):
// data-parallel sync, the optimizer and checkpoint I/O are loops over contiguous ranges.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/tensor.h"

namespace omni {

enum class ParamInit { Normal, ScaledNormal, Ones, Zeros };

struct ParamInfo {
  std::string name;  // Megatron-Core's names, e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Shape shape;
  int64_t offset = 0;  // into the flat buffer, in elements
  int64_t numel = 0;
  ParamInit init = ParamInit::Normal;
  bool weight_decay = true;  // false for biases and norm weights, as Megatron groups them
};

template <typename T>
class ParameterSet {
 public:
  ParameterSet() = default;
  // Lays out the parameters one after another, 16-element aligned, and allocates values
  // and gradients.
  explicit ParameterSet(std::vector<ParamInfo> infos);

  const std::vector<ParamInfo>& infos() const { return infos_; }
  int64_t size() const { return values_.numel(); }
  T* values() const { return values_.template data<T>(); }
  T* grads() const { return grads_.template data<T>(); }
  const ParamInfo& info(const std::string& name) const;
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  T* value(const std::string& name) const { return values() + info(name).offset; }
  T* grad(const std::string& name) const { return grads() + info(name).offset; }
  // Same as value()/grad() but null when the model has no such parameter (e.g. biases off).
  T* value_or_null(const std::string& name) const { return has(name) ? value(name) : nullptr; }
  T* grad_or_null(const std::string& name) const { return has(name) ? grad(name) : nullptr; }

  // Megatron's initialisation from the counter-based RNG: each element depends only on
  // (seed, name, index), whatever the layout. ScaledNormal uses scaled_std.
  void initialize(uint64_t seed, double std, double scaled_std);
  void zero_grads() { grads_.zero_(); }

 private:
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, size_t> index_;
  Tensor values_, grads_;
};

}  // namespace omni
