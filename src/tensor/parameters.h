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

// Where a tensor-parallel rank's rows (shard_dim 0) or columns (shard_dim 1) sit in the
// full tensor: `length` of them from local index `local_start` are the full tensor's from
// `global_start`. Most shards are one segment; SwiGLU's fused [gate; up] is two.
struct ShardSegment {
  int64_t local_start, global_start, length;
};

struct ParamInfo {
  ParamInfo() = default;
  ParamInfo(std::string name, Shape shape, ParamInit init = ParamInit::Normal,
            bool weight_decay = true)
      : name(std::move(name)), shape(std::move(shape)), init(init), weight_decay(weight_decay) {}

  std::string name;  // Megatron-Core's names, e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Shape shape;       // this rank's part
  // The full tensor's shape (empty: same as shape) and, when tensor parallelism splits it,
  // the split dimension and this rank's segments along it.
  Shape global_shape;
  int shard_dim = -1;
  std::vector<ShardSegment> segments;
  // Where this rank's rows of dimension 0 start in the full tensor when dimension 0 is split
  // too, in one contiguous block (an MoE layer's experts under expert and tensor parallelism:
  // experts along dimension 0, their widths along shard_dim > 0).
  int64_t dim0_start = 0;
  // Replicated across tensor-parallel ranks (not split): the gradient norm counts it once.
  // tp_partial_grad: each rank computes only part of its gradient (sequence-parallel norms,
  // per-head qk-norms), so the ranks' gradients are summed before use.
  bool tp_replicated = false, tp_partial_grad = false;
  // An expert's tensor held whole by every expert tensor-parallel rank (fc2's bias under
  // ETP > 1), its gradient the same on each: the gradient norm counts it on the first only.
  bool etp_replicated = false;
  int64_t offset = 0;  // into the flat buffer, in elements
  int64_t numel = 0;
  ParamInit init = ParamInit::Normal;
  bool weight_decay = true;  // false for biases and norm weights, as Megatron groups them
};

// T: the values' storage (float, double, or bf16/f16 on a GPU). Gradients are accum_t<T>:
// float for 16-bit values (Megatron's fp32 main_grad), T itself otherwise.
template <typename T>
class ParameterSet {
 public:
  using Grad = accum_t<T>;
  ParameterSet() = default;
  // Lays out the parameters one after another, 16-element aligned, and allocates values
  // and gradients: in host memory, or in `memory` (a device's) when given.
  explicit ParameterSet(std::vector<ParamInfo> infos, Device device = {},
                        const DeviceMemory* memory = nullptr);

  const std::vector<ParamInfo>& infos() const { return infos_; }
  int64_t size() const { return values_.numel(); }
  // The device memory values() and grads() live in; null: host memory.
  const DeviceMemory* memory() const { return values_.memory(); }
  const Tensor& values_tensor() const { return values_; }
  const Tensor& grads_tensor() const { return grads_; }
  T* values() const { return values_.template data<T>(); }
  Grad* grads() const { return grads_.template data<Grad>(); }
  const ParamInfo& info(const std::string& name) const;
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  T* value(const std::string& name) const { return values() + info(name).offset; }
  Grad* grad(const std::string& name) const { return grads() + info(name).offset; }
  // Same as value()/grad() but null when the model has no such parameter (e.g. biases off).
  T* value_or_null(const std::string& name) const { return has(name) ? value(name) : nullptr; }
  Grad* grad_or_null(const std::string& name) const { return has(name) ? grad(name) : nullptr; }

  // Megatron's initialisation from the counter-based RNG: each element depends only on
  // (seed, name, index in the full tensor), whatever the layout. ScaledNormal uses scaled_std.
  // 16-bit values are the float draws rounded to nearest.
  void initialize(uint64_t seed, double std, double scaled_std);
  void zero_grads() { grads_.zero_(); }
  // Calls f(local_offset, global_index, count) for each run of elements of `p` that is
  // contiguous both here and in the full tensor (row-major).
  template <typename F>
  static void for_each_run(const ParamInfo& p, F&& f);

 private:
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, size_t> index_;
  Tensor values_, grads_;
};

template <typename T>
template <typename F>
void ParameterSet<T>::for_each_run(const ParamInfo& p, F&& f) {
  if (p.shard_dim < 0) {
    f(int64_t(0), int64_t(0), p.numel);
    return;
  }
  // Elements per row of the split dimension, the rows above it, and those of them in one
  // row of dimension 0 (the unit of dim0_start).
  int64_t inner = 1, outer = 1, middle = 1;
  for (size_t d = p.shard_dim + 1; d < p.shape.size(); ++d) inner *= p.shape[d];
  for (int d = 0; d < p.shard_dim; ++d) outer *= p.shape[d];
  for (int d = 1; d < p.shard_dim; ++d) middle *= p.shape[d];
  const int64_t first = p.shard_dim == 0 ? 0 : p.dim0_start * middle;
  const int64_t local_n = p.shape[p.shard_dim], global_n = p.global_shape[p.shard_dim];
  for (int64_t o = 0; o < outer; ++o)
    for (const ShardSegment& s : p.segments)
      f((o * local_n + s.local_start) * inner, ((first + o) * global_n + s.global_start) * inner,
        s.length * inner);
}

}  // namespace omni
