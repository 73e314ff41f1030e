#include "tensor/parameters.h"

#include <algorithm>
#include <cstring>

#include "base/philox.h"

namespace omni {

template <typename T>
ParameterSet<T>::ParameterSet(std::vector<ParamInfo> infos, Device device,
                              const DeviceMemory* memory)
    : infos_(std::move(infos)) {
  int64_t offset = 0;
  for (size_t i = 0; i < infos_.size(); ++i) {
    ParamInfo& p = infos_[i];
    OMNI_CHECK(index_.emplace(p.name, i).second, "[parameters] duplicate name ", p.name);
    p.numel = 1;
    for (int64_t d : p.shape) p.numel *= d;
    if (p.global_shape.empty()) p.global_shape = p.shape;
    OMNI_CHECK(p.shard_dim < int(p.shape.size()) && p.global_shape.size() == p.shape.size() &&
                   (p.dim0_start == 0 || p.shard_dim > 0),
               "[parameters] bad shard of ", p.name);
    p.offset = offset;
    offset += (p.numel + 15) / 16 * 16;
  }
  values_ = Tensor::zeros({offset}, dtype_of<T>(), device, memory);
  grads_ = Tensor::zeros({offset}, dtype_of<Grad>(), device, memory);
}

template <typename T>
const ParamInfo& ParameterSet<T>::info(const std::string& name) const {
  auto it = index_.find(name);
  OMNI_CHECK(it != index_.end(), "[parameters] no parameter named ", name);
  return infos_[it->second];
}

template <typename T>
void ParameterSet<T>::initialize(uint64_t seed, double std, double scaled_std) {
  // Drawn in T (float for 16-bit storage) on the host, then rounded or copied over.
  using Draw = accum_t<T>;
  const bool staged = memory() || is_16bit<T>;
  std::vector<Draw> host(staged ? size_t(size()) : 0);
  for (const ParamInfo& p : infos_) {
    Draw* v = (staged ? host.data() : reinterpret_cast<Draw*>(values())) + p.offset;
    switch (p.init) {
      case ParamInit::Normal:
      case ParamInit::ScaledNormal: {
        const double s = p.init == ParamInit::Normal ? std : scaled_std;
        for_each_run(p, [&](int64_t local, int64_t global, int64_t n) {
          fill_normal<Draw>(v + local, n, seed, p.name, global, 0.0, s);
        });
        break;
      }
      case ParamInit::Ones:
        std::fill(v, v + p.numel, Draw(1));
        break;
      case ParamInit::Zeros:
        std::fill(v, v + p.numel, Draw(0));
        break;
    }
  }
  if (!staged) return;
  std::vector<T> rounded;
  const void* src = host.data();
  if constexpr (is_16bit<T>) {
    rounded.resize(host.size());
    convert(host.data(), DType::F32, rounded.data(), dtype_of<T>(), host.size());
    src = rounded.data();
  }
  if (memory())
    memory()->upload(values(), src, host.size() * sizeof(T));
  else
    std::memcpy(static_cast<void*>(values()), src, host.size() * sizeof(T));
}

template class ParameterSet<float>;
template class ParameterSet<double>;
template class ParameterSet<bf16>;
template class ParameterSet<f16>;

}  // namespace omni
