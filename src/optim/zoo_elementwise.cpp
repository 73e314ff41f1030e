// The zoo's optimizers whose state is per element: LAMB, Lion, SophiaG, and schedule-free
// AdamW and SGD.
// Each update is written from its reference, cited at its function; weight decay applies only
// to parameters marked weight_decay (Megatron's and Megatron-DeepSpeed's groups).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "base/error.h"
#include "optim/optimizer_zoo.h"

namespace omni {

namespace {

template <typename T>
class ElementwiseZoo : public ZooOptimizer<T> {
 public:
  ElementwiseZoo(const OptimizerConfig& config, const ParameterSet<T>& params,
                 const ZooLayout<T>& layout)
      : cfg_(config),
        layout_(layout),
        states_(names(config.kind), layout.state_size, params.values_tensor().device(),
                layout.exec.memory()) {
    if (config.kind != OptimizerKind::Lamb) return;
    tensors_ = zoo_tensors(params.infos(), layout.pieces);
    if (layout.exec.on_gpu())  // LAMB's u, for its norm
      lamb_u_ = Tensor::zeros({std::max<int64_t>(layout.state_size, 1)}, dtype_of<T>(),
                              params.values_tensor().device(), layout.exec.memory());
  }

  void step(ParameterSet<T>& params, double lr, int64_t step) override {
    if (cfg_.kind == OptimizerKind::AdamWScheduleFree ||
        cfg_.kind == OptimizerKind::SGDScheduleFree)
      begin_schedule_free_step(params, lr, step);
    if (layout_.exec.on_gpu()) return gpu_step(params, lr, step);
    if (cfg_.kind == OptimizerKind::Lamb) return lamb(params, lr, step);
    for (const ZooPiece& piece : layout_.pieces) {
      const ParamInfo& p = params.infos()[piece.param];
      const Run r{params.values() + piece.begin, params.grads() + piece.begin, piece.state,
                  piece.end - piece.begin, p.weight_decay ? cfg_.weight_decay : 0.0};
      switch (cfg_.kind) {
        case OptimizerKind::Lion:
          lion(r, lr);
          break;
        case OptimizerKind::SophiaG:
          sophiag(r, lr);
          break;
        case OptimizerKind::AdamWScheduleFree:
        case OptimizerKind::SGDScheduleFree:
          schedule_free(r, step);
          break;
        default:
          throw InternalError("[optimizer] not an element-wise zoo optimizer");
      }
    }
  }
  std::vector<std::string> state_names() const override { return states_.names(); }
  T* state_buffer(const std::string& name) override { return states_.get(name); }
  std::vector<std::string> scalar_names() const override {
    if (cfg_.kind == OptimizerKind::AdamWScheduleFree ||
        cfg_.kind == OptimizerKind::SGDScheduleFree)
      return {"weight_sum", "lr_max"};
    return {};
  }
  double& scalar(const std::string& name) override {
    if (name == "weight_sum") return weight_sum_;
    if (name == "lr_max") return lr_max_;
    return ZooOptimizer<T>::scalar(name);
  }

 private:
  static std::vector<std::string> names(OptimizerKind kind) {
    switch (kind) {
      case OptimizerKind::Lamb:
        return {"exp_avg", "exp_avg_sq"};
      case OptimizerKind::Lion:
        return {"exp_avg"};
      case OptimizerKind::SophiaG:
        return {"exp_avg", "hessian"};
      case OptimizerKind::AdamWScheduleFree:
        return {"z", "x", "exp_avg_sq"};
      default:
        return {"z", "x"};
    }
  }

  // The same steps on the GPU (backend/gpu/zoo_optimizer.cu), the constants rounded to
  // float as the loops below round them.
  void gpu_step(ParameterSet<T>& params, double lr, int64_t step) {
    if constexpr (!std::is_same_v<T, float>) {
      ops::detail::gpu_has_no_double("optimizer zoo update");
    } else {
      if (cfg_.kind == OptimizerKind::Lamb) return gpu_lamb(params, lr, step);
      const std::vector<ParamInfo>& infos = params.infos();
      for (const ZooPiece& piece : layout_.pieces) {
        const double wd = infos[piece.param].weight_decay ? cfg_.weight_decay : 0.0;
        ops::ZooStep c;
        c.lr = float(lr), c.wd = float(wd), c.decay = float(1.0 - lr * wd);
        switch (cfg_.kind) {
          case OptimizerKind::Lion:
            c.kind = ops::ZooUpdate::Lion;
            c.beta1 = float(cfg_.zoo.lion_beta1), c.beta2 = float(cfg_.zoo.lion_beta2);
            break;
          case OptimizerKind::SophiaG:
            c.kind = ops::ZooUpdate::SophiaG;
            c.beta1 = float(cfg_.zoo.sophiag_beta1);
            c.rho_bs = float(cfg_.zoo.sophiag_rho * cfg_.zoo.sophiag_bs);
            break;
          case OptimizerKind::SGDScheduleFree:
            c.kind = ops::ZooUpdate::SGDScheduleFree;
            c.lr = float(sf_lr_), c.ckp1 = float(ckp1_), c.beta1 = float(cfg_.sgd_momentum);
            break;
          case OptimizerKind::AdamWScheduleFree:
            c.kind = ops::ZooUpdate::AdamWScheduleFree;
            c.lr = float(sf_lr_), c.ckp1 = float(ckp1_);
            c.beta1 = float(cfg_.adam_beta1), c.beta2 = float(cfg_.adam_beta2);
            c.eps = float(cfg_.adam_eps);
            c.bc2 = float(1.0 - std::pow(cfg_.adam_beta2, double(step)));
            break;
          default:
            throw InternalError("[optimizer] not an element-wise zoo optimizer");
        }
        gpu_run(c, params, piece, state(2, piece));
      }
    }
  }

  // State k's elements of `piece` (null: the kind has no state k).
  T* state(size_t k, const ZooPiece& piece) {
    const std::vector<std::string>& names = states_.names();
    return k < names.size() ? states_.get(names[k]) + piece.state : nullptr;
  }
  void gpu_run(const ops::ZooStep& c, ParameterSet<T>& params, const ZooPiece& piece, T* s2) {
    layout_.exec.gpu->zoo_update(c, params.values() + piece.begin, params.grads() + piece.begin,
                                 state(0, piece), state(1, piece), s2,
                                 size_t(piece.end - piece.begin));
  }

  // lamb() below on the GPU: the moments and u (into lamb_u_), the norms of w and u per
  // tensor, then the scaled step.
  void gpu_lamb(ParameterSet<T>& params, double lr, int64_t step) {
    const std::vector<ParamInfo>& infos = params.infos();
    std::vector<double> norms(2 * tensors_.first.back(), 0.0);
    for (const ZooTensorPiece& tp : tensors_.pieces) {
      const ZooPiece& piece = tp.piece;
      const double wd = infos[piece.param].weight_decay ? cfg_.weight_decay : 0.0;
      ops::ZooStep c;
      c.lr = float(lr), c.wd = float(wd), c.decay = float(1.0 - lr * wd);
      c.kind = ops::ZooUpdate::LambMoments;
      c.beta1 = float(cfg_.adam_beta1), c.beta2 = float(cfg_.adam_beta2);
      c.eps = float(cfg_.adam_eps);
      T* u = lamb_u_.template data<T>() + piece.state;
      gpu_run(c, params, piece, u);
      const size_t n = size_t(piece.end - piece.begin);
      norms[2 * tp.tensor] += ops::sum_squares(layout_.exec, params.values() + piece.begin, n);
      norms[2 * tp.tensor + 1] += ops::sum_squares(layout_.exec, u, n);
    }
    layout_.sum_over_parts(norms, infos, tensors_, 2);
    const double step_size = lamb_step_size(lr, step);
    for (const ZooTensorPiece& tp : tensors_.pieces) {
      ops::ZooStep c;
      c.kind = ops::ZooUpdate::LambApply;
      c.wd = float(infos[tp.piece.param].weight_decay ? cfg_.weight_decay : 0.0);
      c.eps = float(cfg_.adam_eps);
      c.scale = float(step_size * lamb_ratio(norms[2 * tp.tensor], norms[2 * tp.tensor + 1]));
      gpu_run(c, params, tp.piece, nullptr);
    }
  }

  double lamb_step_size(double lr, int64_t step) const {
    const double t = double(step);
    return lr * std::sqrt(1.0 - std::pow(cfg_.adam_beta2, t)) /
           (1.0 - std::pow(cfg_.adam_beta1, t));
  }

  double lamb_ratio(double w2, double u2) const {
    if (w2 > 0 && u2 > 0)
      return std::clamp(std::sqrt(w2) / std::sqrt(u2), cfg_.zoo.lamb_min_coeff,
                        cfg_.zoo.lamb_max_coeff);
    return 1.0;
  }

  // One piece's elements: weights, gradients, where its states start, and its weight decay.
  struct Run {
    T* w;
    const T* g;
    int64_t state, n;
    double wd;
  };

  // LAMB as DeepSpeed's FusedLamb computes it (csrc/lamb/fused_lamb_cuda_kernel.cu, the
  // kernel behind Megatron-DeepSpeed's ds.fusedlamb): Adam's moments, the update
  // u = m / (sqrt(v) + eps) + wd * w from the moments without bias correction, the trust
  // ratio ||w|| / ||u|| per tensor (1 where either is 0) clamped to [min_coeff, max_coeff],
  // and w -= lr * sqrt(1 - b2^t) / (1 - b1^t) * ratio * u. A stacked expert tensor's experts
  // are tensors of their own (zoo_tensors), as DeepSpeed-MoE's: a ratio per expert. The
  // squared norms are summed over the tensor's pieces on every rank that holds one
  // (ZooLayout::sum_over_parts).
  void lamb(ParameterSet<T>& params, double lr, int64_t step) {
    const std::vector<ParamInfo>& infos = params.infos();
    T* ms = states_.get("exp_avg");
    T* vs = states_.get("exp_avg_sq");
    const T b1 = T(cfg_.adam_beta1), b2 = T(cfg_.adam_beta2), eps = T(cfg_.adam_eps);
    std::vector<double> norms(2 * tensors_.first.back(), 0.0);  // ||w||^2, ||u||^2 per tensor
    for (const ZooTensorPiece& tp : tensors_.pieces) {
      const ZooPiece& piece = tp.piece;
      const ParamInfo& p = infos[piece.param];
      const T* w = params.values() + piece.begin;
      const T* g = params.grads() + piece.begin;
      T* m = ms + piece.state;
      T* v = vs + piece.state;
      const T twd = T(p.weight_decay ? cfg_.weight_decay : 0.0);
      double w2 = 0, u2 = 0;
      for (int64_t i = 0; i < piece.end - piece.begin; ++i) {
        m[i] = b1 * m[i] + (T(1) - b1) * g[i];
        v[i] = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
        const T u = m[i] / (std::sqrt(v[i]) + eps) + twd * w[i];
        w2 += double(w[i]) * double(w[i]);
        u2 += double(u) * double(u);
      }
      norms[2 * tp.tensor] += w2;
      norms[2 * tp.tensor + 1] += u2;
    }
    layout_.sum_over_parts(norms, infos, tensors_, 2);
    const double step_size = lamb_step_size(lr, step);
    for (const ZooTensorPiece& tp : tensors_.pieces) {
      const ZooPiece& piece = tp.piece;
      const ParamInfo& p = infos[piece.param];
      const double ratio = lamb_ratio(norms[2 * tp.tensor], norms[2 * tp.tensor + 1]);
      T* w = params.values() + piece.begin;
      const T* m = ms + piece.state;
      const T* v = vs + piece.state;
      const T scale = T(step_size * ratio), twd = T(p.weight_decay ? cfg_.weight_decay : 0.0);
      for (int64_t i = 0; i < piece.end - piece.begin; ++i)
        w[i] -= scale * (m[i] / (std::sqrt(v[i]) + eps) + twd * w[i]);
    }
  }

  // Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", Algorithm 2):
  // w *= 1 - lr * wd; w -= lr * sign(b1 * m + (1 - b1) * g); m = b2 * m + (1 - b2) * g.
  void lion(const Run& r, double lr) {
    T* m = states_.get("exp_avg") + r.state;
    T* w = r.w;
    const T* g = r.g;
    const T b1 = T(cfg_.zoo.lion_beta1), b2 = T(cfg_.zoo.lion_beta2), tlr = T(lr);
    const T decay = T(1.0 - lr * r.wd);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < r.n; ++i) {
      const T c = b1 * m[i] + (T(1) - b1) * g[i];
      const T sign = T((c > T(0)) - (c < T(0)));
      w[i] = w[i] * decay - tlr * sign;
      m[i] = b2 * m[i] + (T(1) - b2) * g[i];
    }
  }

  // SophiaG (Liu et al., "Sophia: A Scalable Stochastic Second-order Optimizer", Algorithm
  // 3), as the reference sophia.py that Megatron-DeepSpeed copies: w *= 1 - lr * wd;
  // m = b1 * m + (1 - b1) * g; w -= lr * sign(m) * min(|m| / (rho * bs * h + 1e-15), 1).
  // h is the Hessian estimate update_hessian() keeps. Megatron-DeepSpeed never calls its
  // update_hessian, so h stays 0 there and the step is lr * sign(m); so it is here, as the
  // trainer computes no sampled-label gradients (see --optimizer's help).
  void sophiag(const Run& r, double lr) {
    T* m = states_.get("exp_avg") + r.state;
    const T* h = states_.get("hessian") + r.state;
    T* w = r.w;
    const T* g = r.g;
    const T b1 = T(cfg_.zoo.sophiag_beta1), tlr = T(lr), decay = T(1.0 - lr * r.wd);
    const T rho_bs = T(cfg_.zoo.sophiag_rho * cfg_.zoo.sophiag_bs);
    for (int64_t i = 0; i < r.n; ++i) {
      w[i] *= decay;
      m[i] = m[i] * b1 + (T(1) - b1) * g[i];
      const T ratio = std::min(std::fabs(m[i]) / (rho_bs * h[i] + T(1e-15)), T(1));
      const T sign = T((m[i] > T(0)) - (m[i] < T(0)));
      w[i] -= tlr * sign * ratio;
    }
  }

 public:
  void update_hessian(const ParameterSet<T>& params) override {
    OMNI_REQUIRE(cfg_.kind == OptimizerKind::SophiaG, "[optimizer] only sophiag keeps a Hessian");
    OMNI_REQUIRE(!layout_.exec.on_gpu(), "[optimizer] sophiag's Hessian estimate is on the CPU");
    const T b2 = T(cfg_.zoo.sophiag_beta2);
    for (const ZooPiece& piece : layout_.pieces) {
      T* h = states_.get("hessian") + piece.state;
      const T* g = params.grads() + piece.begin;
      for (int64_t i = 0; i < piece.end - piece.begin; ++i)
        h[i] = h[i] * b2 + (T(1) - b2) * g[i] * g[i];
    }
  }

 private:
  // Schedule-free (Defazio et al., "The Road Less Scheduled", arXiv:2405.15682), as
  // facebookresearch/schedule_free's reference implementations: the model's weights are
  // y = b * x + (1 - b) * z, where z takes plain (Adam- or SGD-) steps and x is the
  // weighted average of the z's with weights (k+1)^r * lr_max^weight_lr_power. The
  // learning rate of step k is lr times the optimizer's own linear warmup.
  void begin_schedule_free_step(ParameterSet<T>& params, double lr, int64_t step) {
    const int64_t k = step - 1, warmup = cfg_.zoo.schedulefree_warmup_steps;
    sf_lr_ = lr * (k < warmup ? double(k + 1) / double(warmup) : 1.0);
    lr_max_ = std::max(sf_lr_, lr_max_);
    const double weight = std::pow(double(k + 1), cfg_.zoo.schedulefree_r) *
                          std::pow(lr_max_, cfg_.zoo.schedulefree_weight_lr_power);
    weight_sum_ += weight;
    ckp1_ = weight_sum_ != 0 ? weight / weight_sum_ : 0.0;
    if (step == 1)  // x and z start at the initial weights
      for (const ZooPiece& piece : layout_.pieces)
        for (const char* name : {"z", "x"})
          ops::copy(layout_.exec, states_.get(name) + piece.state, params.values() + piece.begin,
                    size_t(piece.end - piece.begin));
  }

  void schedule_free(const Run& r, int64_t step) {
    T* z = states_.get("z") + r.state;
    T* x = states_.get("x") + r.state;
    T* y = r.w;
    const T* g = r.g;
    const T tlr = T(sf_lr_), twd = T(r.wd), c = T(ckp1_);
    if (cfg_.kind == OptimizerKind::SGDScheduleFree) {
      // SGDScheduleFreeReference: L2 weight decay at y, z -= lr * g.
      const T b = T(cfg_.sgd_momentum);
      for (int64_t i = 0; i < r.n; ++i) {
        z[i] -= tlr * (g[i] + twd * y[i]);
        x[i] = x[i] * (T(1) - c) + z[i] * c;
        y[i] = x[i] * b + z[i] * (T(1) - b);
      }
      return;
    }
    // AdamWScheduleFreeReference: decoupled decay of z at y, then an Adam step (second
    // moment only, bias-corrected) on z.
    T* v = states_.get("exp_avg_sq") + r.state;
    const T b1 = T(cfg_.adam_beta1), b2 = T(cfg_.adam_beta2), eps = T(cfg_.adam_eps);
    const T bc2 = T(1.0 - std::pow(cfg_.adam_beta2, double(step)));
    for (int64_t i = 0; i < r.n; ++i) {
      z[i] -= tlr * twd * y[i];
      v[i] = v[i] * b2 + (T(1) - b2) * g[i] * g[i];
      z[i] -= tlr * (g[i] / (std::sqrt(v[i] / bc2) + eps));
      x[i] = x[i] * (T(1) - c) + z[i] * c;
      y[i] = x[i] * b1 + z[i] * (T(1) - b1);
    }
  }

  OptimizerConfig cfg_;
  ZooLayout<T> layout_;
  ZooStates<T> states_;
  ZooTensors tensors_;                       // LAMB's
  Tensor lamb_u_;                            // on the GPU
  double weight_sum_ = 0.0, lr_max_ = -1.0;  // the reference's initial values
  double sf_lr_ = 0.0, ckp1_ = 0.0;          // of the current step
};

}  // namespace

template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_elementwise_zoo_optimizer(const OptimizerConfig& config,
                                                                const ParameterSet<T>& params,
                                                                const ZooLayout<T>& layout) {
  return std::make_shared<ElementwiseZoo<T>>(config, params, layout);
}

template std::shared_ptr<ZooOptimizer<float>> make_elementwise_zoo_optimizer(
    const OptimizerConfig&, const ParameterSet<float>&, const ZooLayout<float>&);
template std::shared_ptr<ZooOptimizer<double>> make_elementwise_zoo_optimizer(
    const OptimizerConfig&, const ParameterSet<double>&, const ZooLayout<double>&);

}  // namespace omni
