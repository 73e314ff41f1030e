#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "backend/ops.h"
#include "base/error.h"
#include "optim/optimizer_zoo.h"

namespace omni {

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "adam" || s == "adamw") return OptimizerKind::AdamW;
  if (s == "sgd") return OptimizerKind::SGD;
  if (auto zoo = parse_zoo_optimizer(s)) return *zoo;
  throw UsageError("--optimizer: '" + s + "' is not one of adam (adamw), sgd, " +
                   zoo_optimizer_names());
}

template <typename T>
double gradient_norm(const ParameterSet<T>& params, const ops::Exec& exec) {
  return std::sqrt(ops::sum_squares(exec, params.grads(), static_cast<size_t>(params.size())));
}

template <typename T>
void scale_gradients(ParameterSet<T>& params, double scale, const ops::Exec& exec) {
  ops::scale(exec, params.grads(), scale, static_cast<size_t>(params.size()));
}

template <typename T>
Optimizer<T>::Optimizer(const OptimizerConfig& config, const ParameterSet<T>& params,
                        const ops::Exec& exec, Communicator* tensor_parallel,
                        Communicator* expert_tensor_parallel, std::vector<bool> expert)
    : cfg_(config), x_(exec) {
  if (is_zoo_optimizer(cfg_.kind)) {
    ZooLayout<T> layout = ZooLayout<T>::whole(params.infos(), tensor_parallel);
    layout.expert_tensor_parallel = expert_tensor_parallel;
    layout.expert = std::move(expert);
    layout.state_size = params.size();  // the flat buffer's padding too, as checkpoints read it
    layout.exec = exec;
    zoo_ = make_zoo_optimizer(cfg_, params, layout);
    return;
  }
  const Device device = params.values_tensor().device();
  m_ = Tensor::zeros({params.size()}, dtype_of<T>(), device, exec.memory());
  if (cfg_.kind != OptimizerKind::SGD)
    v_ = Tensor::zeros({params.size()}, dtype_of<T>(), device, exec.memory());
}

template <typename T>
std::vector<std::string> Optimizer<T>::state_names() const {
  if (zoo_) return zoo_->state_names();
  if (cfg_.kind == OptimizerKind::SGD) return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq"};
}

template <typename T>
T* Optimizer<T>::state_buffer(const std::string& name) const {
  if (zoo_) return zoo_->state_buffer(name);
  if (name == "exp_avg" && cfg_.kind != OptimizerKind::SGD) return m_.template data<T>();
  if (name == "exp_avg_sq" && cfg_.kind != OptimizerKind::SGD) return v_.template data<T>();
  if (name == "momentum_buffer" && cfg_.kind == OptimizerKind::SGD) return m_.template data<T>();
  throw InternalError("[optimizer] no state buffer '" + name + "'");
}

template <typename T>
std::vector<std::string> Optimizer<T>::scalar_names() const {
  return zoo_ ? zoo_->scalar_names() : std::vector<std::string>{};
}

template <typename T>
double& Optimizer<T>::scalar(const std::string& name) const {
  if (zoo_) return zoo_->scalar(name);
  throw InternalError("[optimizer] no scalar state '" + name + "'");
}

namespace {
// AdamW over n elements. kZeroGrads: each gradient is zeroed once read (`zero` is g), the next
// step's zeroing done while its line is in the cache.
template <bool kZeroGrads, typename T>
void adamw_elements(const OptimizerConfig& cfg, int64_t step, double lr, double wd, T* w,
                    const T* g, T* m, T* v, int64_t n, T gs, T* zero) {
  const double b1 = cfg.adam_beta1, b2 = cfg.adam_beta2;
  const double bc1 = 1.0 - std::pow(b1, double(step)), bc2 = 1.0 - std::pow(b2, double(step));
  const T tb1 = T(b1), tb2 = T(b2), tlr = T(lr), twd = T(wd), eps = T(cfg.adam_eps);
  const T step_size = T(lr / bc1), inv_sqrt_bc2 = T(1.0 / std::sqrt(bc2));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    // Decay applied to the weights directly, not folded into the gradient (Loshchilov &
    // Hutter, "Decoupled Weight Decay"; torch.optim.AdamW's order: decay, then Adam).
    const T grad = g[i] * gs;
    if constexpr (kZeroGrads) zero[i] = T(0);
    w[i] -= tlr * twd * w[i];
    m[i] = tb1 * m[i] + (T(1) - tb1) * grad;
    v[i] = tb2 * v[i] + (T(1) - tb2) * grad * grad;
    w[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
  }
}
}  // namespace

template <typename T>
void update_elements(const OptimizerConfig& cfg, int64_t step, double lr, bool decay, T* w,
                     const T* g, T* m, T* v, int64_t n, double grad_scale, T* zero_grads) {
  const double wd = decay ? cfg.weight_decay : 0.0;
  const T gs = T(grad_scale);  // x * 1 is x: an unscaled update is unchanged
  OMNI_CHECK(!zero_grads || (zero_grads == g && cfg.kind == OptimizerKind::AdamW),
             "[optimizer] only AdamW zeroes its own gradients");
  switch (cfg.kind) {
    case OptimizerKind::AdamW:
      if (zero_grads)
        adamw_elements<true>(cfg, step, lr, wd, w, g, m, v, n, gs, zero_grads);
      else
        adamw_elements<false>(cfg, step, lr, wd, w, g, m, v, n, gs, zero_grads);
      break;
    case OptimizerKind::SGD: {
      OMNI_CHECK(grad_scale == 1.0, "[optimizer] SGD takes its gradients clipped beforehand");
      const T mom = T(cfg.sgd_momentum), tlr = T(lr), twd = T(wd);
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        T grad = g[i] + twd * w[i];
        m[i] = mom * m[i] + grad;
        w[i] -= tlr * m[i];
      }
      break;
    }
    default:  // the zoo steps through its ZooOptimizer (optimizer_zoo.h)
      throw InternalError(std::string("[optimizer] ") + zoo_optimizer_name(cfg.kind) +
                          " has no element update of its own");
  }
}

template <typename T>
bool Optimizer<T>::step(ParameterSet<T>& params, double lr, double grad_scale, bool zero_grads) {
  // AdamW on the CPU reads the gradients only through products, so the scale folded into
  // its loop rounds as a pass of its own would. SGD (its sum could contract into another
  // FMA), the zoo and the GPU's kernels read clipped gradients: scaled in place first.
  const bool fused = cfg_.kind == OptimizerKind::AdamW && !zoo_ && !x_.on_gpu();
  if (grad_scale != 1.0 && !fused) scale_gradients(params, grad_scale, x_);
  ++step_;
  if (zoo_) {
    zoo_->step(params, lr, step_);
    return false;
  }
  T* m = m_.template data<T>();
  T* v = v_.defined() ? v_.template data<T>() : nullptr;
  zero_grads = zero_grads && fused;
  int64_t zeroed = 0;  // the flat buffer's elements before here, the alignment's gaps too
  for (const ParamInfo& p : params.infos()) {
    T *w = params.values() + p.offset, *mp = m + p.offset, *vp = v ? v + p.offset : nullptr;
    T* g = params.grads() + p.offset;
    if (zero_grads) std::fill(params.grads() + zeroed, g, T(0));
    zeroed = p.offset + p.numel;
    if (fused)
      update_elements(cfg_, step_, lr, p.weight_decay, w, g, mp, vp, p.numel, grad_scale,
                      zero_grads ? g : nullptr);
    else
      update_elements(x_, cfg_, step_, lr, p.weight_decay, w, g, mp, vp, p.numel);
  }
  if (zero_grads) std::fill(params.grads() + zeroed, params.grads() + params.size(), T(0));
  return zero_grads;
}

template <typename T>
void update_elements(const ops::Exec& exec, const OptimizerConfig& cfg, int64_t step, double lr,
                     bool decay, T* w, const T* g, T* m, T* v, int64_t n) {
  if (!exec.on_gpu()) return update_elements(cfg, step, lr, decay, w, g, m, v, n);
  if constexpr (std::is_same_v<T, float>) {
    if (is_zoo_optimizer(cfg.kind))  // the zoo steps through its ZooOptimizer (optimizer_zoo.h)
      throw InternalError(std::string("[optimizer] ") + zoo_optimizer_name(cfg.kind) +
                          " has no element update of its own");
    const double wd = decay ? cfg.weight_decay : 0.0;
    if (cfg.kind == OptimizerKind::SGD)
      exec.gpu->sgd_update(w, g, m, size_t(n), lr, cfg.sgd_momentum, wd);
    else
      exec.gpu->adamw_update(w, g, m, v, size_t(n), lr, cfg.adam_beta1, cfg.adam_beta2,
                             cfg.adam_eps, wd, step);
  } else {
    ops::detail::gpu_has_no_double("optimizer update");
  }
}

template double gradient_norm<float>(const ParameterSet<float>&, const ops::Exec&);
template double gradient_norm<double>(const ParameterSet<double>&, const ops::Exec&);
template void scale_gradients<float>(ParameterSet<float>&, double, const ops::Exec&);
template void scale_gradients<double>(ParameterSet<double>&, double, const ops::Exec&);
template void update_elements<float>(const ops::Exec&, const OptimizerConfig&, int64_t, double,
                                     bool, float*, const float*, float*, float*, int64_t);
template void update_elements<double>(const ops::Exec&, const OptimizerConfig&, int64_t, double,
                                      bool, double*, const double*, double*, double*, int64_t);
template void update_elements<float>(const OptimizerConfig&, int64_t, double, bool, float*,
                                     const float*, float*, float*, int64_t, double, float*);
template void update_elements<double>(const OptimizerConfig&, int64_t, double, bool, double*,
                                      const double*, double*, double*, int64_t, double, double*);
template class Optimizer<float>;
template class Optimizer<double>;

}  // namespace omni
