#include "optim/optimizer_zoo.h"

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

const char* zoo_optimizer_name(OptimizerKind kind) {
  for (const auto& [n, k] : kNames)
    if (k == kind) return n;
  return "?";
}

bool is_hidden_matrix(const ParamInfo& p) {
  return p.shape.size() == 2 && p.name != "embedding.word_embeddings.weight" &&
         p.name != "output_layer.weight";
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
std::shared_ptr<ZooOptimizer<T>> make_zoo_optimizer(const OptimizerConfig& config,
                                                    const ParameterSet<T>& params) {
  OMNI_REQUIRE(params.memory() == nullptr, "--optimizer ", zoo_optimizer_name(config.kind),
               " runs on the CPU only in this version; use --device cpu");
  for (const ParamInfo& p : params.infos())
    OMNI_REQUIRE(p.shard_dim < 0, "--optimizer ", zoo_optimizer_name(config.kind),
                 " does not run with tensor parallelism yet (", p.name,
                 " is split across ranks); use --tensor-model-parallel-size 1");
  switch (config.kind) {
    case OptimizerKind::Muon:
      return make_muon(config, params);
    case OptimizerKind::Adam8bit:
      return make_adam8bit(config, params);
    case OptimizerKind::GaLoreAdamW:
    case OptimizerKind::GaLoreAdamW8bit:
    case OptimizerKind::GaLoreAdamW8bitPerLayer:
      return make_galore(config, params);
    case OptimizerKind::Shampoo:
      return make_shampoo(config, params);
    default:
      return make_elementwise_zoo_optimizer(config, params);
  }
}

template <typename T>
ZooStates<T>::ZooStates(std::vector<std::string> names, int64_t size) : names_(std::move(names)) {
  for (size_t i = 0; i < names_.size(); ++i) buffers_.emplace_back(size_t(size), T(0));
}

template <typename T>
T* ZooStates<T>::get(const std::string& name) {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return buffers_[i].data();
  throw InternalError("[optimizer] no state buffer '" + name + "'");
}

template class ZooOptimizer<float>;
template class ZooOptimizer<double>;
template class ZooStates<float>;
template class ZooStates<double>;
template std::shared_ptr<ZooOptimizer<float>> make_zoo_optimizer(const OptimizerConfig&,
                                                                 const ParameterSet<float>&);
template std::shared_ptr<ZooOptimizer<double>> make_zoo_optimizer(const OptimizerConfig&,
                                                                  const ParameterSet<double>&);

}  // namespace omni
