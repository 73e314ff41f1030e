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

bool is_stacked_experts(const ParamInfo& p) {
  return is_expert_matrices(p) ||
         (p.shape.size() == 2 && (p.name.ends_with("experts.linear_fc1.bias") ||
                                  p.name.ends_with("experts.linear_fc2.bias")));
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

int64_t zoo_tensor_count(const ParamInfo& p) {
  if (!is_stacked_experts(p)) return 1;
  return p.global_shape.empty() ? p.shape[0] : p.global_shape[0];
}

int64_t zoo_tensor_numel(const ParamInfo& p) {
  return global_numel(p) / zoo_tensor_count(p);
}

ZooTensors zoo_tensors(const std::vector<ParamInfo>& infos, const std::vector<ZooPiece>& pieces) {
  ZooTensors t;
  t.first.push_back(0);
  for (const ParamInfo& p : infos)
    t.first.push_back(t.first.back() + size_t(is_stacked_experts(p) ? p.shape[0] : 1));
  for (const ZooPiece& piece : pieces) {
    const ParamInfo& p = infos[piece.param];
    // An expert's elements on this rank: its slice of the local [experts, ...] tensor.
    const int64_t each = is_stacked_experts(p) ? p.numel / p.shape[0] : p.numel;
    for (int64_t begin = piece.begin; begin < piece.end;) {
      const int64_t e = (begin - p.offset) / each;
      const int64_t end = std::min(piece.end, p.offset + (e + 1) * each);
      t.pieces.push_back({{piece.param, begin, end, piece.state + (begin - piece.begin)},
                          t.first[piece.param] + size_t(e)});
      begin = end;
    }
  }
  return t;
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
void ZooLayout<T>::sum_over_parts(std::vector<double>& per_tensor,
                                  const std::vector<ParamInfo>& infos, const ZooTensors& tensors,
                                  size_t k) const {
  if (data_parallel && data_parallel->size() > 1)
    data_parallel->all_reduce(per_tensor.data(), per_tensor.size());
  // Over each slices' group its split tensors' sums (tensors a group's ranks hold whole are
  // each rank's already).
  for (Communicator* group : {tensor_parallel, expert_tensor_parallel}) {
    if (!group || group->size() == 1) continue;
    std::vector<double> sums = per_tensor;
    group->all_reduce(sums.data(), sums.size());
    for (size_t i = 0; i < infos.size(); ++i)
      if (infos[i].shard_dim >= 0 && slices_group(i) == group)
        std::copy(sums.begin() + std::ptrdiff_t(tensors.first[i] * k),
                  sums.begin() + std::ptrdiff_t(tensors.first[i + 1] * k),
                  per_tensor.begin() + std::ptrdiff_t(tensors.first[i] * k));
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
WholeTensorStates<T>::WholeTensorStates(const ParameterSet<T>& params, const ZooLayout<T>& layout,
                                        const std::function<bool(const ParamInfo&)>& whole)
    : layout_(layout), local_(params.infos()), device_(params.values_tensor().device()) {
  const std::vector<ParamInfo>& infos = local_;
  held_.assign(infos.size(), !sharded());
  owned_ = held_;
  for (const ZooPiece& piece : layout.pieces) {
    held_[piece.param] = true;
    if (piece.begin == infos[piece.param].offset) owned_[piece.param] = true;
  }
  // The tensors as the optimizer steps them: an assembled one whole (an expert tensor: this
  // rank's experts, each whole), laid out as ParameterSet lays out the parameters.
  int64_t offset = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    ParamInfo p = infos[i];
    Communicator* group = layout.slices_group(i);
    const bool split = group && group->size() > 1 &&
                       (is_stacked_experts(p) ? p.shard_dim >= 1 : p.shard_dim >= 0);
    assembled_.push_back(split && whole && whole(p));
    first_.push_back(0);
    if (assembled_.back()) {
      assembling_ = true;
      first_.back() = p.dim0_start * (global_numel(p) / p.global_shape[0]);
      Shape shape = p.global_shape;
      if (p.shard_dim >= 1) shape[0] = p.shape[0];  // this rank's experts (dim0_start on)
      p.shape = p.global_shape = shape;
      p.shard_dim = -1, p.segments.clear(), p.dim0_start = 0;
      p.numel = 1;
      for (int64_t d : shape) p.numel *= d;
    }
    p.offset = offset;
    offset += (p.numel + 15) / 16 * 16;
    infos_.push_back(p);
  }
  whole_size_ = assembling_ ? offset : params.size();
  if (!assembling_) infos_ = local_;  // (the same offsets)
  int64_t n = 0;
  for (size_t pi = 0; pi < infos.size(); ++pi) {
    at_.push_back(sharded() ? n : infos_[pi].offset);
    if (held_[pi]) n += infos_[pi].numel;
  }
  size_ = sharded() ? std::max<int64_t>(n, 1) : whole_size_;
}

template <typename T>
T* WholeTensorStates<T>::buffer(Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() < n)
    t = Tensor::zeros({std::max<int64_t>(n, 1)}, dtype_of<T>(), device_, layout_.exec.memory());
  return t.template data<T>();
}

template <typename T>
template <typename F>
void WholeTensorStates<T>::runs(size_t i, int64_t lo, int64_t hi, F&& f) const {
  if (!assembled_[i]) return f(lo, lo, hi - lo);
  ParameterSet<T>::for_each_run(local_[i], [&](int64_t l, int64_t g, int64_t n) {
    const int64_t a = std::max(l, lo), b = std::min(l + n, hi);
    if (a < b) f(a, g - first_[i] + (a - l), b - a);
  });
}

template <typename T>
void WholeTensorStates<T>::assemble(size_t i, const T* local, T* whole) {
  const ops::Exec& x = layout_.exec;
  const size_t n = size_t(infos_[i].numel);
  ops::zero(x, whole, n);
  runs(i, 0, local_[i].numel,
       [&](int64_t l, int64_t w, int64_t k) { ops::copy(x, whole + w, local + l, size_t(k)); });
  layout_.slices_group(i)->all_reduce(whole, n);  // the others add zeros
}

template <typename T>
T* WholeTensorStates<T>::view(const std::string& name, const T* from, bool compact) {
  T* v = buffer(views_[name], layout_.state_size);
  for (const ZooPiece& piece : layout_.pieces) {
    const size_t i = piece.param;
    const int64_t o = local_[i].offset;
    const T* base = from + (compact ? at_[i] : infos_[i].offset);
    runs(i, piece.begin - o, piece.end - o, [&](int64_t l, int64_t w, int64_t k) {
      ops::copy(layout_.exec, v + piece.state + (l - (piece.begin - o)), base + w, size_t(k));
    });
  }
  return v;
}

template <typename T>
const T* WholeTensorStates<T>::gather_gradients(
    const ParameterSet<T>& params, const std::function<T*(const std::string&)>& compact,
    const std::function<void(const std::string&, const T*)>& whole) {
  const ops::Exec& e = layout_.exec;
  // A buffer laid out like the parameters from this rank's pieces (gathered over the
  // data-parallel ranks when sharded).
  auto gather = [&](Tensor& into, const T* pieces, bool state) -> const T* {
    if (!sharded()) return pieces;  // (a whole layout's views are the parameters' layout)
    T* full = buffer(into, params.size());
    for (const ZooPiece& piece : layout_.pieces)
      ops::copy(e, full + piece.begin, pieces + (state ? piece.state : piece.begin),
                size_t(piece.end - piece.begin));
    layout_.gather_pieces(full);
    return full;
  };
  // `flat` (laid out like the parameters) laid out like infos_: every tensor (`all`) or the
  // held ones, the assembled ones assembled (all of them: collectives in the same order on
  // every rank of a group).
  auto lay_out = [&](const T* flat, T* out, bool all) {
    for (size_t i = 0; i < infos_.size(); ++i) {
      if (assembled_[i]) {
        T* w = held_[i] || all ? out + infos_[i].offset : buffer(scratch_, infos_[i].numel);
        assemble(i, flat + local_[i].offset, w);
      } else if (held_[i] || all) {
        ops::copy(e, out + infos_[i].offset, flat + local_[i].offset, size_t(local_[i].numel));
      }
    }
  };
  const T* full = gather(full_, params.grads(), false);
  for (auto& [name, v] : views_) {
    const T* state = gather(gathered_, v.template data<T>(), true);
    T* to = compact(name);
    if (!to) {
      if (!assembling_) {
        whole(name, state);
        continue;
      }
      T* laid = buffer(assembled_values_, whole_size_);  // (scratch until values())
      lay_out(state, laid, true);
      whole(name, laid);
      continue;
    }
    if (!assembling_) {
      for (size_t pi = 0; pi < held_.size(); ++pi)
        if (held_[pi])
          ops::copy(e, to + at_[pi], state + local_[pi].offset, size_t(local_[pi].numel));
      continue;
    }
    T* laid = buffer(assembled_values_, whole_size_);
    lay_out(state, laid, false);
    for (size_t pi = 0; pi < held_.size(); ++pi)
      if (held_[pi]) ops::copy(e, to + at_[pi], laid + infos_[pi].offset, size_t(infos_[pi].numel));
  }
  views_.clear();
  if (!assembling_) return full;
  T* grads = buffer(assembled_grads_, whole_size_);
  lay_out(full, grads, false);
  return grads;
}

template <typename T>
T* WholeTensorStates<T>::values(ParameterSet<T>& params) {
  if (!assembling_) return params.values();
  T* out = buffer(assembled_values_, whole_size_);
  for (size_t i = 0; i < infos_.size(); ++i)
    if (held_[i])
      runs(i, 0, local_[i].numel, [&](int64_t l, int64_t w, int64_t k) {
        ops::copy(layout_.exec, out + infos_[i].offset + w, params.values() + local_[i].offset + l,
                  size_t(k));
      });
  return out;
}

template <typename T>
void WholeTensorStates<T>::keep_values(ParameterSet<T>& params) {
  if (!assembling_) return;
  const T* from = assembled_values_.template data<T>();
  for (size_t i = 0; i < infos_.size(); ++i)
    if (held_[i])
      runs(i, 0, local_[i].numel, [&](int64_t l, int64_t w, int64_t k) {
        ops::copy(layout_.exec, params.values() + local_[i].offset + l, from + infos_[i].offset + w,
                  size_t(k));
      });
}

template class ZooOptimizer<float>;
template class ZooOptimizer<double>;
template class ZooStates<float>;
template class WholeTensorStates<float>;
template class WholeTensorStates<double>;
template class ZooStates<double>;
template struct ZooLayout<float>;
template struct ZooLayout<double>;
template std::shared_ptr<ZooOptimizer<float>> make_zoo_optimizer(const OptimizerConfig&,
                                                                 const ParameterSet<float>&,
                                                                 const ZooLayout<float>&);
template std::shared_ptr<ZooOptimizer<double>> make_zoo_optimizer(const OptimizerConfig&,
                                                                  const ParameterSet<double>&,
                                                                  const ZooLayout<double>&);

}  // namespace omni
