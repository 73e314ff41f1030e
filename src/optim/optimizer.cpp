#include "optim/optimizer.h"

#include <cmath>

#include "backend/ops.h"
#include "base/error.h"

namespace omni {

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "adamw") return OptimizerKind::AdamW;
  if (s == "adam") return OptimizerKind::Adam;
  if (s == "sgd") return OptimizerKind::SGD;
  throw UsageError("--optimizer: '" + s + "' is not one of adamw, adam, sgd");
}

template <typename T>
double gradient_norm(const ParameterSet<T>& params) {
  return std::sqrt(ops::sum_squares(params.grads(), static_cast<size_t>(params.size())));
}

template <typename T>
void scale_gradients(ParameterSet<T>& params, double scale) {
  T* g = params.grads();
  const T s = static_cast<T>(scale);
  const int64_t n = params.size();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] *= s;
}

template <typename T>
Optimizer<T>::Optimizer(const OptimizerConfig& config, const ParameterSet<T>& params)
    : cfg_(config) {
  m_ = Tensor::zeros({params.size()}, dtype_of<T>());
  if (cfg_.kind != OptimizerKind::SGD) v_ = Tensor::zeros({params.size()}, dtype_of<T>());
}

template <typename T>
std::vector<std::string> Optimizer<T>::state_names() const {
  if (cfg_.kind == OptimizerKind::SGD) return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq"};
}

template <typename T>
T* Optimizer<T>::state_buffer(const std::string& name) const {
  if (name == "exp_avg" && cfg_.kind != OptimizerKind::SGD) return m_.template data<T>();
  if (name == "exp_avg_sq" && cfg_.kind != OptimizerKind::SGD) return v_.template data<T>();
  if (name == "momentum_buffer" && cfg_.kind == OptimizerKind::SGD) return m_.template data<T>();
  throw InternalError("[optimizer] no state buffer '" + name + "'");
}

template <typename T>
void Optimizer<T>::step(ParameterSet<T>& params, double lr) {
  ++step_;
  T* m = m_.template data<T>();
  T* v = v_.defined() ? v_.template data<T>() : nullptr;
  const double b1 = cfg_.adam_beta1, b2 = cfg_.adam_beta2;
  const double bc1 = 1.0 - std::pow(b1, double(step_)), bc2 = 1.0 - std::pow(b2, double(step_));
  for (const ParamInfo& p : params.infos()) {
    T* w = params.values() + p.offset;
    const T* g = params.grads() + p.offset;
    T* pm = m + p.offset;
    const double wd = p.weight_decay ? cfg_.weight_decay : 0.0;
    const int64_t n = p.numel;
    switch (cfg_.kind) {
      case OptimizerKind::AdamW:
      case OptimizerKind::Adam: {
        T* pv = v + p.offset;
        const bool decoupled = cfg_.kind == OptimizerKind::AdamW;
        const T tb1 = T(b1), tb2 = T(b2), tlr = T(lr), twd = T(wd), eps = T(cfg_.adam_eps);
        const T step_size = T(lr / bc1), inv_sqrt_bc2 = T(1.0 / std::sqrt(bc2));
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          // Adam (L2 regularisation folded into the gradient) vs AdamW (decay applied to
          // the weights directly: Loshchilov & Hutter, "Decoupled Weight Decay").
          T grad = decoupled ? g[i] : g[i] + twd * w[i];
          if (decoupled) w[i] -= tlr * twd * w[i];
          pm[i] = tb1 * pm[i] + (T(1) - tb1) * grad;
          pv[i] = tb2 * pv[i] + (T(1) - tb2) * grad * grad;
          w[i] -= step_size * pm[i] / (std::sqrt(pv[i]) * inv_sqrt_bc2 + eps);
        }
        break;
      }
      case OptimizerKind::SGD: {
        const T mom = T(cfg_.sgd_momentum), tlr = T(lr), twd = T(wd);
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          T grad = g[i] + twd * w[i];
          pm[i] = mom * pm[i] + grad;
          w[i] -= tlr * pm[i];
        }
        break;
      }
    }
  }
}

template double gradient_norm<float>(const ParameterSet<float>&);
template double gradient_norm<double>(const ParameterSet<double>&);
template void scale_gradients<float>(ParameterSet<float>&, double);
template void scale_gradients<double>(ParameterSet<double>&, double);
template class Optimizer<float>;
template class Optimizer<double>;

}  // namespace omni
