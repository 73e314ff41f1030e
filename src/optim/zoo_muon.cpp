// Muon: momentum orthogonalised by a Newton-Schulz iteration for the 2-D weights, AdamW for
// the rest (K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks",
// 2024; Liu et al., "Muon is Scalable for LLM Training", arXiv:2502.16982). As Megatron's
// TensorParallelMuon (megatron/core/optimizer/emerging_optimizers.py over NVIDIA's
// emerging_optimizers OrthogonalizedOptimizer), for one matrix W with gradient G:
//   W -= lr * wd * W                      (decoupled weight decay)
//   M = lerp(M, G, 1 - momentum)          (the momentum buffer, an EMA of gradients)
//   U = nesterov ? lerp(G, M, momentum) : M
//   W -= lr * scale * extra_scale * NS(U)
// where NS normalises U by its Frobenius norm and runs num_ns_steps quintic iterations
// X = a X + (b A + c A A) X, A = X X^T, on the shorter side; scale is sqrt(max(rows, cols))
// (spectral), sqrt(rows / cols) (unit_rms_norm) or sqrt(max(1, rows / cols)) (shape_scaling).
// Megatron's split: the fused QKV weight's query, key and value rows are orthogonalised as
// three matrices. An MoE layer's stacked experts [experts, rows, cols] are one matrix per
// expert (is_expert_matrices), each orthogonalised and scaled on its own, as Megatron-Core's
// Muon steps TEGroupedMLP's per-expert weights. The word embeddings, the output layer, the
// experts' [experts, width] biases (each expert's vector) and every other tensor that is not
// 2-D take AdamW steps (Megatron's scalar optimizer, adam).
//
// States: exp_avg (Muon's momentum buffer for its matrices, Adam's first moment for the
// rest) and exp_avg_sq (Adam's second moment; zero for the matrices).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "optim/optimizer_zoo.h"

namespace omni {

namespace {

struct NSCoefficients {
  double a, b, c;
};

// emerging_optimizers' coefficient sets, cycled through the iterations.
std::vector<NSCoefficients> ns_coefficients(const std::string& type) {
  if (type == "simple") return {{3.4445, -4.7750, 2.0315}};
  if (type == "quintic")
    return {{4.0848, -6.8946, 2.9270},
            {3.9505, -6.3029, 2.6377},
            {3.7418, -5.5913, 2.3037},
            {2.8769, -3.1427, 1.2046},
            {2.8366, -3.0525, 1.2012}};
  throw UsageError("--muon-coefficient-type: '" + type + "' is not one of quintic, simple");
}

bool is_qkv(const ParamInfo& p) {
  const std::string suffix = "linear_qkv.weight";
  return p.name.size() >= suffix.size() &&
         p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <typename T>
class Muon : public ZooOptimizer<T> {
 public:
  Muon(const OptimizerConfig& config, const ParameterSet<T>& params, const ZooLayout<T>& layout)
      : cfg_(config),
        coefficients_(ns_coefficients(config.zoo.muon_coefficient_type)),
        layout_(layout),
        device_(params.values_tensor().device()),
        states_({"exp_avg", "exp_avg_sq"}, layout.state_size, device_, layout.exec.memory()) {
    adam_ = config;
    adam_.kind = OptimizerKind::AdamW;
    scale_factor(1, 1);  // names a bad --muon-scale-mode before the first step
  }

  // The momentum of this rank's pieces goes into a parameter-sized buffer, which the
  // distributed optimizer's all-gather completes; each matrix this rank holds a piece of is
  // then assembled whole (over the tensor-parallel ranks too), orthogonalised, and this rank
  // applies its elements of the result.
  void step(ParameterSet<T>& params, double lr, int64_t step) override {
    const std::vector<ParamInfo>& infos = params.infos();
    T* m = states_.get("exp_avg");
    T* v = states_.get("exp_avg_sq");
    T* update = buffer(update_, params.size());
    for (const ZooPiece& piece : layout_.pieces) {
      const ParamInfo& p = infos[piece.param];
      T* w = params.values() + piece.begin;
      const T* g = params.grads() + piece.begin;
      const int64_t n = piece.end - piece.begin;
      if (!orthogonalized(p))
        update_elements(layout_.exec, adam_, step, lr, p.weight_decay, w, g, m + piece.state,
                        v + piece.state, n);
      else
        momentum(p, w, g, m + piece.state, update + piece.begin, n, lr);
    }
    if (layout_.data_parallel && layout_.data_parallel->size() > 1) layout_.gather_pieces(update);
    size_t done = infos.size();  // the last parameter orthogonalised
    for (const ZooPiece& piece : layout_.pieces) {
      const ParamInfo& p = infos[piece.param];
      if (!orthogonalized(p)) continue;
      if (piece.param != done) {
        if (is_expert_matrices(p))
          orthogonalize_experts(piece.param, p, update + p.offset);
        else
          orthogonalize_whole(p, update + p.offset);
        done = piece.param;
      }
      T* w = params.values() + piece.begin;
      T* u = update + piece.begin;
      if (layout_.exec.on_gpu()) {
        ops::ZooStep c;
        c.kind = ops::ZooUpdate::MuonApply, c.lr = float(lr);
        gpu_update(c, w, u, u, nullptr, piece.end - piece.begin);
        continue;
      }
      const T tlr = T(lr);
      for (int64_t i = 0; i < piece.end - piece.begin; ++i) w[i] -= tlr * u[i];
    }
  }
  std::vector<std::string> state_names() const override { return states_.names(); }
  T* state_buffer(const std::string& name) override { return states_.get(name); }

 private:
  static bool orthogonalized(const ParamInfo& p) {
    return is_hidden_matrix(p) || is_expert_matrices(p);
  }

  // Decoupled weight decay and the momentum of n elements; u: what gets orthogonalised.
  void momentum(const ParamInfo& p, T* w, const T* g, T* m, T* u, int64_t n, double lr) {
    const double wd = p.weight_decay ? cfg_.weight_decay : 0.0;
    if (layout_.exec.on_gpu()) {
      ops::ZooStep c;
      c.kind = ops::ZooUpdate::MuonMomentum, c.decay = float(-wd * lr);
      c.beta1 = float(cfg_.zoo.muon_momentum), c.beta2 = float(1.0 - cfg_.zoo.muon_momentum);
      c.scale = cfg_.zoo.muon_nesterov ? 1.0f : 0.0f;
      return gpu_update(c, w, g, m, u, n);
    }
    const T mu = T(cfg_.zoo.muon_momentum), one_minus_mu = T(1.0 - cfg_.zoo.muon_momentum);
    for (int64_t i = 0; i < n; ++i) {
      if (wd != 0) w[i] += T(-wd * lr) * w[i];
      m[i] += one_minus_mu * (g[i] - m[i]);
      u[i] = cfg_.zoo.muon_nesterov ? g[i] + mu * (m[i] - g[i]) : m[i];
    }
  }

  // local: p's momentum on this rank (its tensor-parallel slice), orthogonalised in place as
  // the whole tensor's slice. Collective over the tensor-parallel group for split tensors.
  void orthogonalize_whole(const ParamInfo& p, T* local) {
    if (!layout_.split(p)) return matrix_update(p, local, p.shape[0], p.shape[1]);
    const ops::Exec& x = layout_.exec;
    T* whole = buffer(whole_, global_numel(p));
    ops::zero(x, whole, size_t(global_numel(p)));
    ParameterSet<T>::for_each_run(
        p, [&](int64_t l, int64_t g, int64_t n) { ops::copy(x, whole + g, local + l, size_t(n)); });
    layout_.tensor_parallel->all_reduce(whole, size_t(global_numel(p)));  // the others add zeros
    matrix_update(p, whole, p.global_shape[0], p.global_shape[1]);
    ParameterSet<T>::for_each_run(
        p, [&](int64_t l, int64_t g, int64_t n) { ops::copy(x, local + l, whole + g, size_t(n)); });
  }

  // local: the momentum of this rank's experts of the stacked expert tensor p (parameter i),
  // each expert's matrix orthogonalised in place as a slice of that expert's whole matrix.
  // Collective over the ranks holding the experts' other slices (slices_group) when they are
  // split by width; the experts themselves are this rank's (expert parallelism splits them
  // whole), so the matrices are assembled for this rank's experts only.
  void orthogonalize_experts(size_t i, const ParamInfo& p, T* local) {
    const Shape& whole_shape = p.global_shape.empty() ? p.shape : p.global_shape;
    const int64_t experts = p.shape[0], rows = whole_shape[1], cols = whole_shape[2];
    const int64_t matrix = rows * cols, n = experts * matrix;
    Communicator* group = layout_.slices_group(i);
    if (p.shard_dim < 1 || !group || group->size() == 1) {
      for (int64_t e = 0; e < experts; ++e) orthogonalize(local + e * matrix, rows, cols);
      return;
    }
    const ops::Exec& x = layout_.exec;
    T* whole = buffer(whole_, n);
    ops::zero(x, whole, size_t(n));
    const int64_t first = p.dim0_start * matrix;  // this rank's first expert in the full tensor
    ParameterSet<T>::for_each_run(p, [&](int64_t l, int64_t g, int64_t k) {
      ops::copy(x, whole + g - first, local + l, size_t(k));
    });
    group->all_reduce(whole, size_t(n));  // the others add zeros
    for (int64_t e = 0; e < experts; ++e) orthogonalize(whole + e * matrix, rows, cols);
    ParameterSet<T>::for_each_run(p, [&](int64_t l, int64_t g, int64_t k) {
      ops::copy(x, local + l, whole + g - first, size_t(k));
    });
  }

  // u [rows, cols], a whole matrix's momentum, := its orthogonalised update.
  void matrix_update(const ParamInfo& p, T* u, int64_t rows, int64_t cols) {
    const std::vector<int64_t>& split = cfg_.zoo.qkv_split_shapes;
    if (is_qkv(p) && !split.empty()) {
      int64_t per_group = 0;
      for (int64_t s : split) per_group += s;
      OMNI_REQUIRE(rows % per_group == 0, "[muon] ", p.name, " has ", rows,
                   " rows, not a multiple of the query group's ", per_group);
      const int64_t groups = rows / per_group;
      int64_t start = 0;
      const ops::Exec& x = layout_.exec;
      for (int64_t s : split) {  // gather this part's rows of every group, orthogonalise, put back
        T* part = buffer(part_, groups * s * cols);
        for (int64_t gi = 0; gi < groups; ++gi)
          ops::copy(x, part + gi * s * cols, u + (gi * per_group + start) * cols, size_t(s * cols));
        orthogonalize(part, groups * s, cols);
        for (int64_t gi = 0; gi < groups; ++gi)
          ops::copy(x, u + (gi * per_group + start) * cols, part + gi * s * cols, size_t(s * cols));
        start += s;
      }
    } else {
      orthogonalize(u, rows, cols);
    }
  }

  double scale_factor(int64_t rows, int64_t cols) const {
    const std::string& mode = cfg_.zoo.muon_scale_mode;
    const double r = double(rows), c = double(cols);
    if (mode == "spectral") return std::sqrt(std::max(r, c));
    if (mode == "unit_rms_norm") return std::sqrt(r / c);
    if (mode == "shape_scaling") return std::sqrt(std::max(1.0, r / c));
    throw UsageError("--muon-scale-mode: '" + mode +
                     "' is not one of spectral, unit_rms_norm, shape_scaling");
  }

  // x [rows, cols] := scale * extra_scale * NS(x), in place.
  void orthogonalize(T* x, int64_t rows, int64_t cols) {
    if (layout_.exec.on_gpu()) return orthogonalize_on_gpu(x, rows, cols);
    const bool transpose = rows > cols;
    const int r = int(transpose ? cols : rows), c = int(transpose ? rows : cols);
    X_.resize(size_t(r) * c);
    if (transpose) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) X_[size_t(j * rows + i)] = x[i * cols + j];
    } else {
      std::copy_n(x, rows * cols, X_.data());
    }
    double norm2 = 0;
    for (T e : X_) norm2 += double(e) * double(e);
    const T inv = T(1.0 / std::max(std::sqrt(norm2), 1e-15));  // torch's normalize, eps 1e-15
    for (T& e : X_) e *= inv;
    Ah_.resize(size_t(r) * r);
    Bh_.resize(size_t(r) * r);
    Yh_.resize(X_.size());
    for (int k = 0; k < cfg_.zoo.muon_num_ns_steps; ++k) {
      const NSCoefficients& k_c = coefficients_[size_t(k) % coefficients_.size()];
      ops::gemm<T>(false, true, r, r, c, T(1), X_.data(), c, X_.data(), c, T(0), Ah_.data(), r);
      Bh_ = Ah_;
      ops::gemm<T>(false, false, r, r, r, T(k_c.c), Ah_.data(), r, Ah_.data(), r, T(k_c.b),
                   Bh_.data(), r);
      Yh_ = X_;
      ops::gemm<T>(false, false, r, c, r, T(1), Bh_.data(), r, X_.data(), c, T(k_c.a), Yh_.data(),
                   c);
      std::swap(X_, Yh_);
    }
    const T scale = T(scale_factor(rows, cols) * cfg_.zoo.muon_extra_scale_factor);
    if (transpose) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) x[i * cols + j] = X_[size_t(j * rows + i)] * scale;
    } else {
      for (int64_t i = 0; i < rows * cols; ++i) x[i] = X_[size_t(i)] * scale;
    }
  }

  // The same iteration on the GPU, on x's own layout: where rows > cols the CPU iterates on
  // X = x^T, and here A = x^T x and Y^T = x B^T + a x are the same products, transposed.
  void orthogonalize_on_gpu(T* x, int64_t rows, int64_t cols) {
    if constexpr (!std::is_same_v<T, float>) {
      ops::detail::gpu_has_no_double("muon");
    } else {
      const ops::Exec& e = layout_.exec;
      const bool transpose = rows > cols;
      const int r = int(transpose ? cols : rows), c = int(transpose ? rows : cols);
      const size_t n = size_t(rows * cols);
      const double norm = std::sqrt(ops::sum_squares(e, x, n));
      ops::scale(e, x, double(T(1.0 / std::max(norm, 1e-15))), n);
      T* A = buffer(A_, int64_t(r) * r);
      T* B = buffer(B_, int64_t(r) * r);
      T* X = x;
      T* Y = buffer(Y_, int64_t(n));
      for (int k = 0; k < cfg_.zoo.muon_num_ns_steps; ++k) {
        const NSCoefficients& k_c = coefficients_[size_t(k) % coefficients_.size()];
        if (transpose)  // A = x^T x
          e.gpu->gemm_f32(true, false, r, r, c, 1.0f, X, r, X, r, 0.0f, A, r);
        else  // A = X X^T
          e.gpu->gemm_f32(false, true, r, r, c, 1.0f, X, c, X, c, 0.0f, A, r);
        ops::copy(e, B, A, size_t(r) * size_t(r));
        e.gpu->gemm_f32(false, false, r, r, r, float(k_c.c), A, r, A, r, float(k_c.b), B, r);
        ops::copy(e, Y, X, n);
        if (transpose)  // Y^T = x B^T + a x
          e.gpu->gemm_f32(false, true, c, r, r, 1.0f, X, r, B, r, float(k_c.a), Y, r);
        else  // Y = B X + a X
          e.gpu->gemm_f32(false, false, r, c, r, 1.0f, B, r, X, c, float(k_c.a), Y, c);
        std::swap(X, Y);
      }
      if (X != x) ops::copy(e, x, X, n);
      ops::scale(e, x, double(T(scale_factor(rows, cols) * cfg_.zoo.muon_extra_scale_factor)), n);
    }
  }

  void gpu_update(const ops::ZooStep& c, T* w, const T* g, T* s0, T* s2, int64_t n) {
    if constexpr (!std::is_same_v<T, float>)
      ops::detail::gpu_has_no_double("muon");
    else
      layout_.exec.gpu->zoo_update(c, w, g, s0, nullptr, s2, size_t(n));
  }

  // A scratch buffer of at least n elements where the parameters live.
  T* buffer(Tensor& t, int64_t n) {
    if (!t.defined() || t.numel() < n)
      t = Tensor::zeros({std::max<int64_t>(n, 1)}, dtype_of<T>(), device_, layout_.exec.memory());
    return t.template data<T>();
  }

  OptimizerConfig cfg_, adam_;
  std::vector<NSCoefficients> coefficients_;
  ZooLayout<T> layout_;
  Device device_;
  ZooStates<T> states_;
  Tensor update_, whole_, part_, A_, B_, Y_;  // scratch where the parameters live
  std::vector<T> X_, Ah_, Bh_, Yh_;           // the CPU's
};

}  // namespace

template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_muon(const OptimizerConfig& config,
                                           const ParameterSet<T>& params,
                                           const ZooLayout<T>& layout) {
  OMNI_REQUIRE(config.zoo.muon_num_ns_steps >= 1, "--muon-num-ns-steps must be at least 1 (got ",
               config.zoo.muon_num_ns_steps, ")");
  return std::make_shared<Muon<T>>(config, params, layout);
}

template std::shared_ptr<ZooOptimizer<float>> make_muon(const OptimizerConfig&,
                                                        const ParameterSet<float>&,
                                                        const ZooLayout<float>&);
template std::shared_ptr<ZooOptimizer<double>> make_muon(const OptimizerConfig&,
                                                         const ParameterSet<double>&,
                                                         const ZooLayout<double>&);

}  // namespace omni
