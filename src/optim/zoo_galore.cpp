// GaLore: Adam on low-rank projections of the gradients of the hidden matrices (J. Zhao,
// Z. Zhang, B. Chen, Z. Wang, A. Anandkumar, Y. Tian, "GaLore: Memory-Efficient LLM Training
// by Gradient Low-Rank Projection", arXiv:2403.03507, Algorithm 2), as galore_torch's
// GaLoreAdamW and GaLoreAdamW8bit (behind Megatron-DeepSpeed's OPT=galoreadamw,
// galoreadamw8bit and galoreadamw8bitperlayer). For a hidden matrix W [m, n] with gradient G,
// at step t (1-based):
//   every update_proj_gap steps (t = 1, 1 + gap, ...): P from the SVD of G, in float64: the
//     first r = min(rank, m, n) left singular vectors [m, r] when the left side is projected
//     (proj_type std: when m < n; reverse_std: when m >= n; left; right), else the first r
//     right ones [r, n];
//   R = P^T G [r, n] (left) or G P^T [m, r] (right);
//   galoreadamw (transformers' AdamW arithmetic, which galore_torch copies): M, V Adam's
//     moments of R, N = M / (sqrt(V) + eps), W -= lr sqrt(1 - b2^t) / (1 - b1^t) * scale * PN
//     (or NP), then W -= lr * wd * W;
//   galoreadamw8bit: bitsandbytes' 8-bit Adam (zoo_adam8bit.h: the same quantisation as
//     adam8bit) steps a zero tensor shaped like R without decay; that step, projected back
//     and times scale, is added to W, then W -= lr * wd * W.
// An MoE layer's stacked experts [experts, rows, cols] are one matrix per expert
// (is_expert_matrices), each with its own P, as DeepSpeed-MoE's separate expert tensors are
// projected apart; their projected moments lie one after another, the 8-bit ones' blocks
// restarting at each expert (as the experts' biases' do: each expert a tensor of its own). The
// moments are not reset when P changes (galore_torch keeps them). The other tensors
// (the embeddings, the output layer, biases, norms) take the same Adam without projection:
// AdamW in transformers' arithmetic, or bitsandbytes' 8-bit Adam. galoreadamw8bitperlayer runs
// GaLoreAdamW8bit from a gradient hook per tensor to save the gradient memory: the same math.
//
// Under tensor parallelism (and an MoE layer's experts split by width over expert tensor
// parallelism) each projected matrix is assembled whole over the ranks holding its slices
// (WholeTensorStates, optimizer_zoo.h), as Muon assembles its: every rank of the group
// computes the whole matrix's SVD, P, projected moments and update, redundantly and
// identically, and keeps its own slice; the 8-bit variants assemble every split tensor (the
// blocks are the whole tensor's). The one-rank arithmetic on the one-rank inputs, and the
// states are the whole matrix's on each rank of the group.
//
// Megatron-DeepSpeed passes only lr and weight decay, so betas and eps are the --adam-* flags
// (galore_torch's own AdamW defaults eps to 1e-6, bitsandbytes' to 1e-8).
//
// States, laid out like the parameters, a matrix's projected quantity from its first element
// (stacked experts': one expert's after another):
// projection (P; zeros for the other tensors), and exp_avg and exp_avg_sq (galoreadamw) or
// adam8bit's state1, state2, absmax1 and absmax2 (the 8-bit variants).
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "optim/optimizer_zoo.h"
#include "optim/zoo_adam8bit.h"
#include "optim/zoo_linalg.h"

namespace omni {

namespace {

// A tensor's projection: a hidden matrix's, or each of an MoE layer's stacked experts'
// (`matrices` of them, one after another, each with its own P).
struct Projection {
  bool galore = false, left = false;
  int64_t matrices = 1, rows = 0, cols = 0, rank = 0;
  int64_t matrix_low() const { return left ? rank * cols : rows * rank; }
  int64_t low_size(int64_t numel) const { return galore ? matrices * matrix_low() : numel; }
  int64_t p_size() const { return rank * (left ? rows : cols); }  // one matrix's P
};

Projection plan(const ParamInfo& p, const ZooConfig& z) {
  Projection pr;
  const bool experts = is_expert_matrices(p);
  if (!is_hidden_matrix(p) && !experts) return pr;
  pr.galore = true;
  pr.matrices = experts ? p.shape[0] : 1;
  pr.rows = p.shape[p.shape.size() - 2], pr.cols = p.shape.back();
  pr.rank = std::min({z.galore_rank, pr.rows, pr.cols});
  const std::string& type = z.galore_proj_type;
  if (type == "std")
    pr.left = pr.rows < pr.cols;
  else if (type == "reverse_std")
    pr.left = pr.rows >= pr.cols;
  else if (type == "left" || type == "right")
    pr.left = type == "left";
  else
    throw UsageError("--galore-proj-type: '" + type +
                     "' is not one of std, reverse_std, left, right");
  return pr;
}

template <typename T>
class GaLore : public ZooOptimizer<T> {
 public:
  GaLore(const OptimizerConfig& config, const ParameterSet<T>& params, const ZooLayout<T>& layout)
      : cfg_(config),
        shards_(params, layout, whole_tensors(config)),
        eight_bit_(config.kind != OptimizerKind::GaLoreAdamW),
        infos_(shards_.infos()),
        size_(shards_.whole_size()),
        exec_(layout.exec),
        device_(params.values_tensor().device()),
        states_(eight_bit_ ? std::vector<std::string>{"projection"}
                           : std::vector<std::string>{"projection", "exp_avg", "exp_avg_sq"},
                shards_.size(), device_, exec_.memory()) {
    OMNI_REQUIRE(!exec_.on_gpu() || (std::is_same_v<T, float>), "[galore] the GPU steps float");
    projection_ = states_.get("projection");
    if (!eight_bit_) exp_avg_ = states_.get("exp_avg"), exp_avg_sq_ = states_.get("exp_avg_sq");
    // The 8-bit moments of the tensors this rank steps: a segment per tensor, and per expert
    // of a stacked expert tensor (is_stacked_experts), whose blocks thus restart at each
    // expert's first element as separate tensors' do.
    std::vector<int64_t> sizes;
    for (size_t pi = 0; pi < infos_.size(); ++pi) {
      plans_.push_back(plan(infos_[pi], config.zoo));
      segment_.push_back(sizes.size());
      const int64_t each = segment_numel(pi);
      for (int64_t e = 0; e < segments(pi); ++e) sizes.push_back(shards_.held(pi) ? each : 0);
    }
    if (eight_bit_) moments_ = std::make_unique<Adam8bitMoments>(config, sizes, exec_, device_);
  }

  void step(ParameterSet<T>& params, double lr, int64_t step) override {
    const T* grads = params.grads();
    if (shards_.viewed()) grads = gather_gradients(params);
    if (!views_.empty()) import_views();
    T* values = shards_.values(params);
    for (size_t pi = 0; pi < infos_.size(); ++pi) {
      if (!shards_.held(pi)) continue;
      const ParamInfo& p = infos_[pi];
      const Projection& pr = plans_[pi];
      T* w = values + p.offset;
      const T* g = grads + p.offset;
      const double wd = p.weight_decay ? cfg_.weight_decay : 0.0;
      const int64_t each = segment_numel(pi);
      if (!pr.galore && eight_bit_) {  // bitsandbytes' Adam8bit, its decay included
        for (int64_t e = 0; e < segments(pi); ++e)
          moments_->step(segment_[pi] + size_t(e), w + e * each, g + e * each, lr, wd, step);
        continue;
      }
      const int64_t n = pr.low_size(p.numel);
      T* P = projection_ + shards_.at(pi);
      const T* r = g;
      const int64_t matrix = pr.rows * pr.cols;
      if (pr.galore) {
        T* low = buffer(low_, n);
        for (int64_t e = 0; e < pr.matrices; ++e) {
          const T* ge = g + e * matrix;
          T* Pe = P + e * pr.p_size();
          T* le = low + e * pr.matrix_low();
          if ((step - 1) % cfg_.zoo.galore_update_proj_gap == 0) project_from(pr, ge, Pe);
          if (pr.left)  // R = P^T G
            gemm(true, false, pr.rank, pr.cols, pr.rows, Pe, pr.rank, ge, pr.cols, le, pr.cols);
          else  // R = G P^T
            gemm(false, true, pr.rows, pr.rank, pr.cols, ge, pr.cols, Pe, pr.cols, le, pr.rank);
        }
        r = low;
      }
      T* update = buffer(update_, n);
      ops::zero(exec_, update, size_t(n));
      T step_scale = T(1);
      if (eight_bit_) {
        for (int64_t e = 0; e < segments(pi); ++e)
          moments_->step(segment_[pi] + size_t(e), update + e * each, r + e * each, lr, 0.0, step);
      } else {
        adam_direction(r, exp_avg_ + shards_.at(pi), exp_avg_sq_ + shards_.at(pi), update, n);
        const double b1 = cfg_.adam_beta1, b2 = cfg_.adam_beta2;
        step_scale = T(-lr * std::sqrt(1.0 - std::pow(b2, double(step))) /
                       (1.0 - std::pow(b1, double(step))));
      }
      const T* u = update;
      if (pr.galore) {
        T* back = buffer(back_, p.numel);
        for (int64_t e = 0; e < pr.matrices; ++e) {
          const T* Pe = P + e * pr.p_size();
          const T* ue = u + e * pr.matrix_low();
          T* be = back + e * matrix;
          if (pr.left)  // P N
            gemm(false, false, pr.rows, pr.cols, pr.rank, Pe, pr.rank, ue, pr.cols, be, pr.cols);
          else  // N P
            gemm(false, false, pr.rows, pr.cols, pr.rank, ue, pr.rank, Pe, pr.cols, be, pr.cols);
        }
        const T scale = T(cfg_.zoo.galore_scale);
        if (exec_.on_gpu())
          ops::scale(exec_, back, double(scale), size_t(p.numel));
        else
          for (int64_t i = 0; i < p.numel; ++i) back[i] *= scale;
        u = back;
      }
      const T decay = T(-lr * wd);
      if (exec_.on_gpu()) {
        ops::ZooStep c;
        c.kind = ops::ZooUpdate::GaLoreApply;
        c.scale = float(step_scale), c.wd = float(wd), c.decay = float(decay);
        gpu_update(c, w, u, const_cast<T*>(u), nullptr, nullptr, p.numel);
        continue;
      }
      for (int64_t i = 0; i < p.numel; ++i) {
        w[i] += step_scale * u[i];
        if (wd > 0) w[i] += decay * w[i];
      }
    }
    shards_.keep_values(params);
  }

  int64_t state_bytes() const override {
    return int64_t(states_.names().size()) * shards_.size() * int64_t(sizeof(T)) +
           (moments_ ? moments_->bytes() : 0);
  }

  std::vector<std::string> state_names() const override {
    if (!eight_bit_) return states_.names();
    return {"projection", "state1", "state2", "absmax1", "absmax2"};
  }
  T* state_buffer(const std::string& name) override {
    if (!shards_.viewed()) return whole_state(name);
    const bool held = compact(name);
    return shards_.view(name, held ? states_.get(name) : whole_state(name), held);
  }

 private:
  // Under the distributed optimizer: the whole reduced gradient; a checkpoint's states first
  // (WholeTensorStates says how).
  const T* gather_gradients(const ParameterSet<T>& params) {
    return shards_.gather_gradients(
        params,
        [&](const std::string& name) { return compact(name) ? states_.get(name) : nullptr; },
        [&](const std::string& name, const T* whole) {  // import_views reads it
          ops::copy(exec_, whole_state(name), whole, size_t(size_));
        });
  }

  // The tensors GaLore steps whole when tensor parallelism splits them: the projected
  // matrices, and under the 8-bit variant every tensor (its blocks are the whole tensor's).
  static std::function<bool(const ParamInfo&)> whole_tensors(const OptimizerConfig& config) {
    const bool eight_bit = config.kind != OptimizerKind::GaLoreAdamW;
    const ZooConfig z = config.zoo;
    return [eight_bit, z](const ParamInfo& p) { return eight_bit || plan(p, z).galore; };
  }

  // The 8-bit moments' segments of tensor pi (one per expert of a stacked expert tensor) and
  // the elements of each (the projected ones' for a projected tensor).
  int64_t segments(size_t pi) const {
    return is_stacked_experts(infos_[pi]) ? infos_[pi].shape[0] : 1;
  }
  int64_t segment_numel(size_t pi) const {
    return plans_[pi].low_size(infos_[pi].numel) / segments(pi);
  }

  // Whether state `name` lives in states_ (compact under the distributed optimizer), not in
  // the 8-bit moments.
  bool compact(const std::string& name) const { return !eight_bit_ || name == "projection"; }

  // The state laid out like the whole flat buffer (on a whole layout; under the distributed
  // optimizer, the 8-bit moments' views only).
  T* whole_state(const std::string& name) {
    if (!eight_bit_ || name == "projection") return states_.get(name);
    if (views_.empty()) export_views();
    const auto names = state_names();
    for (size_t i = 1; i < names.size(); ++i)
      if (names[i] == name)
        return exec_.on_gpu() ? gpu_views_[i - 1].template data<T>() : views_[i - 1].data();
    throw InternalError("[galore] no state buffer '" + name + "'");
  }

  // transformers' AdamW: M, V updated in place; u = M / (sqrt(V) + eps).
  void adam_direction(const T* g, T* m, T* v, T* u, int64_t n) {
    const T b1 = T(cfg_.adam_beta1), b2 = T(cfg_.adam_beta2), eps = T(cfg_.adam_eps);
    const T c1 = T(1.0 - cfg_.adam_beta1), c2 = T(1.0 - cfg_.adam_beta2);
    if (exec_.on_gpu()) {
      ops::ZooStep c;
      c.kind = ops::ZooUpdate::GaLoreAdam;
      c.beta1 = float(b1), c.beta2 = float(b2), c.eps = float(eps);
      c.ckp1 = float(c1), c.rho_bs = float(c2);
      return gpu_update(c, u, g, m, v, u, n);
    }
    for (int64_t i = 0; i < n; ++i) {
      m[i] = m[i] * b1 + c1 * g[i];
      v[i] = v[i] * b2 + c2 * g[i] * g[i];
      u[i] = m[i] / (std::sqrt(v[i]) + eps);
    }
  }

  void gpu_update(const ops::ZooStep& c, T* w, const T* g, T* s0, T* s1, T* s2, int64_t n) {
    if constexpr (std::is_same_v<T, float>)
      exec_.gpu->zoo_update(c, w, g, s0, s1, s2, size_t(n));
    else
      ops::detail::gpu_has_no_double("galore");
  }

  // C = op(A) op(B), row-major (ops::gemm's convention), where the parameters live.
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
            int64_t ldb, T* C, int64_t ldc) {
    if constexpr (std::is_same_v<T, float>)
      if (exec_.on_gpu())
        return exec_.gpu->gemm_f32(ta, tb, int(M), int(N), int(K), 1.0f, A, int(lda), B, int(ldb),
                                   0.0f, C, int(ldc));
    ops::gemm<T>(ta, tb, int(M), int(N), int(K), T(1), A, int(lda), B, int(ldb), T(0), C, int(ldc));
  }

  // A scratch buffer of at least n elements where the parameters live.
  T* buffer(Tensor& t, int64_t n) {
    if (!t.defined() || t.numel() < n)
      t = Tensor::zeros({std::max<int64_t>(n, 1)}, dtype_of<T>(), device_, exec_.memory());
    return t.template data<T>();
  }

  // P from the float64 SVD of G. On the GPU, G is copied to the host and P back: the SVD runs
  // on the host's LAPACK every update_proj_gap steps (as galore_torch's torch.linalg.svd
  // does on many builds); the projections and Adam's steps stay on the device.
  void project_from(const Projection& pr, const T* g, T* P) {
    std::vector<T> host(size_t(pr.rows * pr.cols));
    ops::download(exec_, host.data(), g, host.size());
    std::vector<double> a(host.begin(), host.end());
    std::vector<double> out(size_t(pr.left ? pr.rows : pr.cols) * size_t(pr.rank));
    linalg::top_singular_vectors(a.data(), pr.rows, pr.cols, pr.rank, pr.left, out.data());
    std::vector<T> p(out.begin(), out.end());
    ops::upload(exec_, P, p.data(), p.size());
  }

  // The 8-bit moments' checkpoint views, made on the host (and uploaded, on the GPU).
  void export_views() {
    moments_->download();
    views_.assign(4, std::vector<T>(size_t(size_), T(0)));
    for (size_t pi = 0; pi < infos_.size(); ++pi)
      for (int64_t e = 0; e < segments(pi); ++e) {
        const int64_t o = infos_[pi].offset + e * segment_numel(pi);
        moments_->save<T>(segment_[pi] + size_t(e), {views_[0].data() + o, views_[1].data() + o,
                                                     views_[2].data() + o, views_[3].data() + o});
      }
    if (!exec_.on_gpu()) return;
    gpu_views_.clear();
    for (const std::vector<T>& v : views_) {
      gpu_views_.push_back(
          Tensor::zeros({std::max<int64_t>(size_, 1)}, dtype_of<T>(), device_, exec_.memory()));
      ops::upload(exec_, gpu_views_.back().template data<T>(), v.data(), v.size());
    }
  }
  void import_views() {
    for (size_t i = 0; i < gpu_views_.size(); ++i)
      ops::download(exec_, views_[i].data(), gpu_views_[i].template data<T>(), views_[i].size());
    gpu_views_.clear();
    for (size_t pi = 0; pi < infos_.size(); ++pi)
      for (int64_t e = 0; e < segments(pi); ++e) {
        const int64_t o = infos_[pi].offset + e * segment_numel(pi);
        moments_->load<T>(segment_[pi] + size_t(e),
                          {views_[0].data() + o, views_[1].data() + o, views_[2].data() + o,
                           views_[3].data() + o},
                          infos_[pi].name);
      }
    views_.clear();
    moments_->upload();
  }

  OptimizerConfig cfg_;
  // Which tensors this rank steps and where their float states lie (the 8-bit moments: an
  // empty segment for a tensor not held).
  WholeTensorStates<T> shards_;
  bool eight_bit_;
  std::vector<ParamInfo> infos_;
  int64_t size_;
  ops::Exec exec_;
  Device device_;
  std::vector<Projection> plans_;
  std::vector<size_t> segment_;  // per tensor, its first 8-bit segment
  ZooStates<T> states_;
  T *projection_ = nullptr, *exp_avg_ = nullptr, *exp_avg_sq_ = nullptr;  // looked up once
  std::unique_ptr<Adam8bitMoments> moments_;
  std::vector<std::vector<T>> views_;  // 8-bit: the checkpoint's state1, state2, absmax1, absmax2
  std::vector<Tensor> gpu_views_;      // on the GPU, views_ uploaded
  Tensor low_, update_, back_;         // scratch where the parameters live
};

}  // namespace

template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_galore(const OptimizerConfig& config,
                                             const ParameterSet<T>& params,
                                             const ZooLayout<T>& layout) {
  const ZooConfig& z = config.zoo;
  OMNI_REQUIRE(z.galore_rank >= 1, "--galore-rank must be at least 1 (got ", z.galore_rank, ")");
  OMNI_REQUIRE(z.galore_update_proj_gap >= 1, "--galore-update-proj-gap must be at least 1 (got ",
               z.galore_update_proj_gap, ")");
  return std::make_shared<GaLore<T>>(config, params, layout);
}

template std::shared_ptr<ZooOptimizer<float>> make_galore(const OptimizerConfig&,
                                                          const ParameterSet<float>&,
                                                          const ZooLayout<float>&);
template std::shared_ptr<ZooOptimizer<double>> make_galore(const OptimizerConfig&,
                                                           const ParameterSet<double>&,
                                                           const ZooLayout<double>&);

}  // namespace omni
