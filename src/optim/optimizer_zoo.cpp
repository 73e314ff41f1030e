#include "optim/optimizer_zoo.h"

#include <algorithm>
#include <string>
#include <utility>

#include "base/error.h"

namespace omni {

namespace {

// The zoo's names and Megatron-DeepSpeed's OPT spellings of them. apex's FusedAdam
// decouples the weight decay (AdamW) and its FusedSGD is torch's SGD: ours.
const std::pair<const char*, OptimizerKind> kNames[] = {
    {"lamb", OptimizerKind::Lamb},
    {"ds.fusedlamb", OptimizerKind::Lamb},
    {"ipex.lamb", OptimizerKind::Lamb},
    {"ipex.fusedlamb", OptimizerKind::Lamb},
    {"lion", OptimizerKind::Lion},
    {"muon", OptimizerKind::Muon},
    {"adamwschedulefree", OptimizerKind::AdamWScheduleFree},
    {"sgdschedulefree", OptimizerKind::SGDScheduleFree},
    {"adam8bit", OptimizerKind::Adam8bit},
    {"sophiag", OptimizerKind::SophiaG},
    {"galoreadamw", OptimizerKind::GaLoreAdamW},
    {"galoreadamw8bit", OptimizerKind::GaLoreAdamW8bit},
    {"galoreadamw8bitperlayer", OptimizerKind::GaLoreAdamW8bitPerLayer},
    {"shampoo", OptimizerKind::Shampoo},
    {"dshampooadamw", OptimizerKind::Shampoo},
    {"apex.adam", OptimizerKind::AdamW},
    {"apex.sgd", OptimizerKind::SGD},
};

}  // namespace

std::optional<OptimizerKind> parse_zoo_optimizer(const std::string& name) {
  for (const auto& [n, kind] : kNames)
    if (name == n) return kind;
  return std::nullopt;
}

std::string zoo_optimizer_names() {
  std::string out;
  for (const auto& [n, kind] : kNames) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

bool is_zoo_optimizer(OptimizerKind kind) {
  return kind != OptimizerKind::AdamW && kind != OptimizerKind::SGD;
}

bool zoo_whole_only(OptimizerKind kind) {
  return kind == OptimizerKind::GaLoreAdamW || kind == OptimizerKind::GaLoreAdamW8bit ||
         kind == OptimizerKind::GaLoreAdamW8bitPerLayer || kind == OptimizerKind::Shampoo;
}

const char* zoo_optimizer_name(OptimizerKind kind) {
  for (const auto& [n, k] : kNames)
    if (k == kind) return n;
  return "?";
}

bool is_hidden_matrix(const ParamInfo& p) {
  return p.shape.size() == 2 && !p.name.ends_with(".bias") &&
         p.name != "embedding.word_embeddings.weight" && p.name != "output_layer.weight";
}

bool is_expert_matrices(const ParamInfo& p) {
  return p.shape.size() == 3 && (p.name.ends_with("experts.linear_fc1.weight") ||
                                 p.name.ends_with("experts.linear_fc2.weight"));
}

template <typename T>
double& ZooOptimizer<T>::scalar(const std::string& name) {
  throw InternalError("[optimizer] no scalar state '" + name + "'");
}

template <typename T>
void ZooOptimizer<T>::update_hessian(const ParameterSet<T>&) {
  throw InternalError("[optimizer] only sophiag keeps a Hessian estimate");
}

template <typename T>
int64_t ZooOptimizer<T>::state_bytes() const {
  throw InternalError("[optimizer] only galore counts the bytes of its state");
}

int64_t global_numel(const ParamInfo& p) {
  if (p.global_shape.empty()) return p.numel;
  int64_t n = 1;
  for (int64_t d : p.global_shape) n *= d;
  return n;
}

template <typename T>
ZooLayout<T> ZooLayout<T>::whole(const std::vector<ParamInfo>& infos,
                                 Communicator* tensor_parallel) {
  ZooLayout<T> l;
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& p = infos[i];
    l.pieces.push_back({i, p.offset, p.offset + p.numel, p.offset});
    l.state_size = std::max(l.state_size, p.offset + p.numel);
  }
  l.tensor_parallel = tensor_parallel;
  return l;
}

template <typename T>
void ZooLayout<T>::sum_over_parts(std::vector<double>& per_param,
                                  const std::vector<ParamInfo>& infos, size_t k) const {
  if (data_parallel && data_parallel->size() > 1)
    data_parallel->all_reduce(per_param.data(), per_param.size());
  // Over each slices' group its split tensors' sums (tensors a group's ranks hold whole are
  // each rank's already).
  for (Communicator* group : {tensor_parallel, expert_tensor_parallel}) {
    if (!group || group->size() == 1) continue;
    std::vector<double> sums = per_param;
    group->all_reduce(sums.data(), sums.size());
    for (size_t i = 0; i < infos.size(); ++i)
      if (infos[i].shard_dim >= 0 && slices_group(i) == group)
        std::copy_n(sums.begin() + std::ptrdiff_t(i * k), k,
                    per_param.begin() + std::ptrdiff_t(i * k));
  }
}

template <typename T>
void ZooLayout<T>::max_over_parts(std::vector<float>& values) const {
  if (values.empty()) return;
  for (Communicator* group : {data_parallel, tensor_parallel, expert_tensor_parallel})
    if (group && group->size() > 1) group->all_reduce(values.data(), values.size(), ReduceOp::Max);
}

template <typename T>
bool ZooLayout<T>::parts_elsewhere() const {
  for (Communicator* group : {data_parallel, tensor_parallel, expert_tensor_parallel})
    if (group && group->size() > 1) return true;
  return false;
}

template <typename T>
void require_whole_layout(OptimizerKind kind, const ZooLayout<T>& layout) {
  const std::string what = std::string("--optimizer ") + zoo_optimizer_name(kind);
  OMNI_REQUIRE(!layout.tensor_parallel || layout.tensor_parallel->size() == 1, what,
               " with --tensor-model-parallel-size ", layout.tensor_parallel->size(),
               ": not built yet: a slice's preconditioners are not a slice of the whole matrix's; "
               "use --tensor-model-parallel-size 1");
}

template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_zoo_optimizer(const OptimizerConfig& config,
                                                    const ParameterSet<T>& params,
                                                    const ZooLayout<T>& layout) {
  switch (config.kind) {
    case OptimizerKind::Muon:
      return make_muon(config, params, layout);
    case OptimizerKind::Adam8bit:
      return make_adam8bit(config, params, layout);
    case OptimizerKind::GaLoreAdamW:
    case OptimizerKind::GaLoreAdamW8bit:
    case OptimizerKind::GaLoreAdamW8bitPerLayer:
      return make_galore(config, params, layout);
    case OptimizerKind::Shampoo:
      return make_shampoo(config, params, layout);
    default:
      return make_elementwise_zoo_optimizer(config, params, layout);
  }
}

template <typename T>
ZooStates<T>::ZooStates(std::vector<std::string> names, int64_t size, Device device,
                        const DeviceMemory* memory)
    : names_(std::move(names)) {
  for (size_t i = 0; i < names_.size(); ++i)  // (one element where a rank's shard is empty)
    buffers_.push_back(Tensor::zeros({std::max<int64_t>(size, 1)}, dtype_of<T>(), device, memory));
}

template <typename T>
T* ZooStates<T>::get(const std::string& name) {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return buffers_[i].template data<T>();
  throw InternalError("[optimizer] no state buffer '" + name + "'");
}

template <typename T>
WholeTensorStates<T>::WholeTensorStates(const ParameterSet<T>& params, const ZooLayout<T>& layout)
    : layout_(layout), whole_size_(params.size()), device_(params.values_tensor().device()) {
  const std::vector<ParamInfo>& infos = params.infos();
  const bool whole = !sharded();
  held_.assign(infos.size(), whole);
  owned_ = held_;
  for (const ZooPiece& piece : layout.pieces) {
    held_[piece.param] = true;
    if (piece.begin == infos[piece.param].offset) owned_[piece.param] = true;
  }
  int64_t n = 0;
  for (size_t pi = 0; pi < infos.size(); ++pi) {
    offsets_.push_back(infos[pi].offset), numels_.push_back(infos[pi].numel);
    at_.push_back(whole ? infos[pi].offset : n);
    if (!whole && held_[pi]) n += infos[pi].numel;
  }
  size_ = whole ? params.size() : std::max<int64_t>(n, 1);
}

template <typename T>
T* WholeTensorStates<T>::buffer(Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() < n)
    t = Tensor::zeros({std::max<int64_t>(n, 1)}, dtype_of<T>(), device_, layout_.exec.memory());
  return t.template data<T>();
}

template <typename T>
T* WholeTensorStates<T>::view(const std::string& name, const T* from, bool compact) {
  T* v = buffer(views_[name], layout_.state_size);
  for (const ZooPiece& piece : layout_.pieces) {
    const int64_t at =
        compact ? at_[piece.param] + piece.begin - offsets_[piece.param] : piece.begin;
    ops::copy(layout_.exec, v + piece.state, from + at, size_t(piece.end - piece.begin));
  }
  return v;
}

template <typename T>
const T* WholeTensorStates<T>::gather_gradients(
    const ParameterSet<T>& params, const std::function<T*(const std::string&)>& compact,
    const std::function<void(const std::string&, const T*)>& whole) {
  const ops::Exec& e = layout_.exec;
  auto gather = [&](Tensor& into, const T* pieces, bool state) {
    T* full = buffer(into, whole_size_);
    for (const ZooPiece& piece : layout_.pieces)
      ops::copy(e, full + piece.begin, pieces + (state ? piece.state : piece.begin),
                size_t(piece.end - piece.begin));
    layout_.gather_pieces(full);
    return full;
  };
  const T* full = gather(full_, params.grads(), false);
  for (auto& [name, v] : views_) {
    const T* state = gather(gathered_, v.template data<T>(), true);
    T* to = compact(name);
    if (!to) {
      whole(name, state);
      continue;
    }
    for (size_t pi = 0; pi < held_.size(); ++pi)
      if (held_[pi]) ops::copy(e, to + at_[pi], state + offsets_[pi], size_t(numels_[pi]));
  }
  views_.clear();
  return full;
}

template class ZooOptimizer<float>;
template class ZooOptimizer<double>;
template class ZooStates<float>;
template class WholeTensorStates<float>;
template class WholeTensorStates<double>;
template class ZooStates<double>;
template struct ZooLayout<float>;
template struct ZooLayout<double>;
template void require_whole_layout(OptimizerKind, const ZooLayout<float>&);
template void require_whole_layout(OptimizerKind, const ZooLayout<double>&);
template std::shared_ptr<ZooOptimizer<float>> make_zoo_optimizer(const OptimizerConfig&,
                                                                 const ParameterSet<float>&,
                                                                 const ZooLayout<float>&);
template std::shared_ptr<ZooOptimizer<double>> make_zoo_optimizer(const OptimizerConfig&,
                                                                  const ParameterSet<double>&,
                                                                  const ZooLayout<double>&);

}  // namespace omni
