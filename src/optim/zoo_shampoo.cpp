// Shampoo (V. Gupta, T. Koren, Y. Singer, "Shampoo: Preconditioned Stochastic Tensor
// Optimization", arXiv:1802.09568, Algorithm 1 for matrices and 2 for tensors), as Meta's
// DistributedShampoo with Adam grafting (H.-J. M. Shi et al., arXiv:2309.06497), which
// Megatron-DeepSpeed's OPT=shampoo builds: betas (0.9, 0.999), epsilon 1e-12, decoupled weight
// decay, precondition_frequency 100, max_preconditioner_dim 8192, Adam grafting (beta2 0.999,
// epsilon 1e-8). Each tensor is cut into blocks of at most max_preconditioner_dim along each
// side; for a block G (a matrix, or a vector: one factor) at step t (1-based):
//   L = b2 L + (1 - b2) G G^T,  R = b2 R + (1 - b2) G^T G      (the Kronecker factors)
//   V = b2 V + (1 - b2) G * G                                  (Adam grafting's moment)
//   M = b1 M + (1 - b1) G,  M^ = M / (1 - b1^t)                (the filtered gradient)
//   when t is a multiple of update_freq: with c2 = 1 - b2^t, the inverse roots
//     QL = (L / c2 + eps I)^(-1/4), QR = (R / c2 + eps I)^(-1/4)  (float64 eigen-decomposition;
//     a vector's one factor takes the power -1/2: the root is twice the tensor's order)
//   A = M^ / (sqrt(V / c2) + graft_eps)                         (Adam's direction)
//   D = A before step update_freq (start_preconditioning_step), else
//   D = S * ||A|| / (||S|| + 1e-16) with S = QL M^ QR                (grafting: Adam's norm)
//   W -= lr * (D + wd * W)                                       (decoupled weight decay)
// The betas are --adam-beta1/--adam-beta2, the grafting epsilon --adam-eps. Written from the
// paper and DistributedShampoo's documented defaults. An MoE layer's stacked experts
// [experts, rows, cols] are one matrix per expert, each cut into its own blocks, as
// DeepSpeed-MoE's separate expert tensors are preconditioned apart. What Megatron-DeepSpeed's
// call leaves off there (classical momentum, iterate averaging, eigenvalue-corrected Shampoo,
// other grafting methods) is not built, and eigenvalues a rounding error below zero count as
// zero.
//
// States: exp_avg (M) and exp_avg_sq (V), laid out like the parameters, and the blocks'
// factors and inverse roots (L, R, QL, QR of each block in turn), which do not fit the
// parameters' shape: they fill the parameters' elements (not the alignment gaps between
// tensors, which checkpoints skip, nor the word embeddings) of preconditioners.0,
// preconditioners.1, ... as one stream, whose last element is a fingerprint of this rank's blocks.
// A checkpoint therefore resumes Shampoo under the pipeline layout that saved it; another is
// refused by name. Under tensor parallelism each split tensor is assembled and preconditioned
// whole on every rank of its slices group (WholeTensorStates, optimizer_zoo.h), the stream laid
// over the whole tensors as at one rank, each rank's checkpoint view its slices: so it
// resumes across tensor-parallel sizes too, where they pad the vocabulary alike (otherwise the
// embeddings' blocks differ, and the fingerprint refuses it).
//
// Under the distributed optimizer Shampoo shards by whole tensors, as GaLore does
// (zoo_galore.cpp): each rank steps every tensor it holds a piece of whole, from the gathered
// gradient, with that tensor's blocks: the one-rank arithmetic on the same inputs, so the
// ranks holding pieces of one tensor compute the same values and the all-gather of the
// parameters keeps each rank's pieces; the moments and the blocks' factors and roots are kept
// for those tensors only, so their memory falls with the data-parallel size. The stream's elements
// of a tensor's blocks need not lie in the pieces of a rank that steps it: a checkpoint's
// preconditioners are summed over the data-parallel ranks, each contributing the blocks of the
// tensors whose first element it holds (zeros elsewhere), so every rank's pieces of the stream are
// the one-rank model's and any layout resumes them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "optim/optimizer_zoo.h"
#include "optim/zoo_linalg.h"

namespace omni {

namespace {

struct Block {
  int64_t offset = 0;        // of the parameter in the flat buffer
  int64_t ld = 0;            // the parameter's row length
  int64_t r0 = 0, rows = 1;  // rows [r0, r0 + rows); rows 1 and no left factor for a vector
  int64_t c0 = 0, cols = 0;
  bool matrix = false;
  double decay = 0;
  int64_t pool = 0;   // L, R, QL, QR from here (L and QL only for a matrix)
  size_t param = 0;   // index into params.infos()
  int64_t state = 0;  // the parameter's first element in the states (its offset, or compact)
  int64_t local = 0;  // where this rank's pool holds the block (pool on a whole layout)
  int64_t pool_size() const { return 2 * (cols * cols + (matrix ? rows * rows : 0)); }
};

template <typename T>
class Shampoo : public ZooOptimizer<T> {
 public:
  Shampoo(const OptimizerConfig& config, const ParameterSet<T>& params, const ZooLayout<T>& layout)
      : cfg_(config),
        layout_(layout),
        exec_(layout.exec),
        device_(params.values_tensor().device()),
        shards_(params, layout, [](const ParamInfo&) { return true; }),
        size_(shards_.whole_size()),
        states_({"exp_avg", "exp_avg_sq"}, shards_.size(), device_, exec_.memory()) {
    OMNI_REQUIRE(!exec_.on_gpu() || (std::is_same_v<T, float>), "[shampoo] the GPU steps float");
    exp_avg_ = states_.get("exp_avg"), exp_avg_sq_ = states_.get("exp_avg_sq");
    const int64_t dmax = config.zoo.shampoo_max_preconditioner_dim;
    int64_t pool = 0, local = 0;
    uint64_t hash = 1469598103934665603ull;
    const std::vector<ParamInfo>& infos = shards_.infos();
    for (size_t pi = 0; pi < infos.size(); ++pi) {
      const ParamInfo& p = infos[pi];
      // A later pipeline stage's copy of tied embeddings is not saved (the first stage's is).
      if (p.name != "embedding.word_embeddings.weight" || infos.size() == 1)
        for (int64_t i = 0; i < p.numel; ++i) saved_.push_back(p.offset + i);
      // An MoE layer's stacked experts are one matrix per expert (is_expert_matrices), each
      // with its own blocks.
      const bool experts = is_expert_matrices(p);
      OMNI_REQUIRE(p.shape.size() <= 2 || experts, "[shampoo] ", p.name, " has ", p.shape.size(),
                   " dimensions; omnitron's Shampoo preconditions vectors and matrices");
      const bool matrix = p.shape.size() >= 2;
      const int64_t stacked = experts ? p.shape[0] : 1;
      const int64_t rows = experts ? p.shape[1] : matrix ? p.shape[0] : 1;
      const int64_t cols = matrix ? p.shape.back() : p.numel;
      for (int64_t e = 0; e < stacked; ++e)
        for (int64_t r0 = 0; r0 < rows; r0 += dmax)
          for (int64_t c0 = 0; c0 < cols; c0 += dmax) {
            Block b;
            b.offset = p.offset + e * rows * cols, b.ld = cols, b.matrix = matrix;
            b.r0 = r0, b.rows = std::min(dmax, rows - r0);
            b.c0 = c0, b.cols = std::min(dmax, cols - c0);
            b.decay = p.weight_decay ? config.weight_decay : 0.0;
            b.pool = pool;
            b.param = pi;
            b.state = shards_.at(pi) + e * rows * cols;
            b.local = local;
            pool += b.pool_size();
            if (shards_.held(pi)) local += b.pool_size();
            blocks_.push_back(b);
            for (int64_t x : {b.offset, b.r0, b.rows, b.c0, b.cols})
              hash = (hash ^ uint64_t(x)) * 1099511628211ull;
          }
    }
    fingerprint_ = T(double(hash % (1u << 23)) + 1);  // exact in float
    const int64_t per_buffer = int64_t(saved_.size());
    buffers_ = per_buffer > 0 ? (pool + 1 + per_buffer - 1) / per_buffer : 0;
    pool_size_ = local;
    if (exec_.on_gpu())
      pool_gpu_ =
          Tensor::zeros({std::max<int64_t>(local, 1)}, dtype_of<T>(), device_, exec_.memory());
    else
      pool_.assign(size_t(local), T(0));
  }

  void step(ParameterSet<T>& params, double lr, int64_t step) override {
    const T* grads = params.grads();
    if (shards_.viewed()) grads = gather_gradients(params);
    if (!views_.empty()) import_views();
    T* values = shards_.values(params);
    const double b1 = cfg_.adam_beta1, b2 = cfg_.adam_beta2;
    const double c1 = 1.0 - std::pow(b1, double(step)), c2 = 1.0 - std::pow(b2, double(step));
    const int64_t freq = cfg_.zoo.shampoo_update_freq;
    const bool roots = step % freq == 0, precondition = step >= freq;
    if (exec_.on_gpu()) {
      for (const Block& b : blocks_)
        if (shards_.held(b.param)) gpu_step(b, grads, values, lr, c1, c2, roots, precondition);
      return shards_.keep_values(params);
    }
    for (const Block& b : blocks_) {
      if (!shards_.held(b.param)) continue;
      load_block(b, grads, b.offset, g_);
      const int64_t n = b.rows * b.cols;
      T* L = pool_.data() + b.local;
      T* R = b.matrix ? L + b.rows * b.rows : L;
      T* QL = R + b.cols * b.cols;
      T* QR = b.matrix ? QL + b.rows * b.rows : QL;
      T* factor_l = b.matrix ? L : nullptr;
      accumulate(g_.data(), b, factor_l, R);
      // The moments, in the block's order.
      load_block(b, exp_avg_, b.state, m_);
      load_block(b, exp_avg_sq_, b.state, v_);
      const T tb1 = T(b1), tb2 = T(b2), ob1 = T(1.0 - b1), ob2 = T(1.0 - b2);
      adam_.resize(size_t(n));
      mhat_.resize(size_t(n));
      const T inv_c1 = T(1.0 / c1), inv_c2 = T(1.0 / c2), eps = T(cfg_.adam_eps);
      for (int64_t i = 0; i < n; ++i) {
        const T g = g_[size_t(i)];
        m_[size_t(i)] = tb1 * m_[size_t(i)] + ob1 * g;
        v_[size_t(i)] = tb2 * v_[size_t(i)] + ob2 * g * g;
        mhat_[size_t(i)] = m_[size_t(i)] * inv_c1;
        adam_[size_t(i)] = mhat_[size_t(i)] / (std::sqrt(v_[size_t(i)] * inv_c2) + eps);
      }
      store_block(b, m_, exp_avg_, b.state);
      store_block(b, v_, exp_avg_sq_, b.state);
      if (roots) {
        if (b.matrix) inverse_root(L, QL, b.rows, 4.0, c2);
        inverse_root(R, QR, b.cols, b.matrix ? 4.0 : 2.0, c2);
      }
      const std::vector<T>* direction = &adam_;
      if (precondition) {
        // S = QL M^ QR (a vector: M^ QR, QR being symmetric)
        tmp_.resize(size_t(n));
        s_.resize(size_t(n));
        ops::gemm<T>(false, false, int(b.rows), int(b.cols), int(b.cols), T(1), mhat_.data(),
                     int(b.cols), QR, int(b.cols), T(0), tmp_.data(), int(b.cols));
        if (b.matrix)
          ops::gemm<T>(false, false, int(b.rows), int(b.cols), int(b.rows), T(1), QL, int(b.rows),
                       tmp_.data(), int(b.cols), T(0), s_.data(), int(b.cols));
        else
          s_ = tmp_;
        double adam_norm = 0, s_norm = 0;
        for (int64_t i = 0; i < n; ++i) {
          adam_norm += double(adam_[size_t(i)]) * double(adam_[size_t(i)]);
          s_norm += double(s_[size_t(i)]) * double(s_[size_t(i)]);
        }
        const T graft = T(std::sqrt(adam_norm) / (std::sqrt(s_norm) + 1e-16));
        for (T& x : s_) x *= graft;
        direction = &s_;
      }
      apply(b, *direction, values, lr);
    }
    shards_.keep_values(params);
  }

  std::vector<std::string> state_names() const override {
    std::vector<std::string> names = states_.names();
    for (int64_t k = 0; k < buffers_; ++k) names.push_back("preconditioners." + std::to_string(k));
    return names;
  }
  T* state_buffer(const std::string& name) override {
    if (!shards_.viewed()) return whole_state(name);
    const bool held = compact(name);
    return shards_.view(name, held ? states_.get(name) : whole_state(name), held);
  }

 private:
  // exp_avg and exp_avg_sq: held for the tensors this rank steps only, under the distributed
  // optimizer.
  static bool compact(const std::string& name) { return name.rfind("preconditioners.", 0) != 0; }

  // The state laid out like the whole flat buffer (a checkpoint's preconditioners.k: made
  // from the pool on first use, collectively under the distributed optimizer).
  T* whole_state(const std::string& name) {
    const std::string prefix = "preconditioners.";
    if (name.rfind(prefix, 0) != 0) return states_.get(name);
    if (views_.empty()) export_views();
    const size_t k = size_t(std::stoll(name.substr(prefix.size())));
    return exec_.on_gpu() ? gpu_views_.at(k).template data<T>() : views_.at(k).data();
  }

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

  // One block's step on the GPU: the same operations, the element-wise ones in the zoo's
  // kernels (backend/gpu/zoo_optimizer.cu), the products through the GPU's GEMM. The inverse
  // roots copy the factor to the host, decompose it there in float64 (zoo_linalg.cpp) and copy
  // the root back, every update_freq steps.
  void gpu_step(const Block& b, const T* grads, T* values, double lr, double c1,
                double c2, bool roots, bool precondition) {
    if constexpr (!std::is_same_v<T, float>) {
      ops::detail::gpu_has_no_double("shampoo");
    } else {
      const ops::Exec& e = exec_;
      const int64_t n = b.rows * b.cols;
      const int rows = int(b.rows), cols = int(b.cols);
      auto block_of = [&](const T* flat, Tensor& t, int64_t at) {  // the block, contiguous
        T* out = buffer(t, n);
        ops::copy_rows(e, out, size_t(b.cols), flat + at + b.r0 * b.ld + b.c0, size_t(b.ld),
                       size_t(b.cols), size_t(b.rows));
        return out;
      };
      auto store = [&](const T* in, T* flat, int64_t at) {
        ops::copy_rows(e, flat + at + b.r0 * b.ld + b.c0, size_t(b.ld), in, size_t(b.cols),
                       size_t(b.cols), size_t(b.rows));
      };
      T* L = pool_gpu_.template data<T>() + b.local;
      T* R = b.matrix ? L + b.rows * b.rows : L;
      T* QL = R + b.cols * b.cols;
      T* QR = b.matrix ? QL + b.rows * b.rows : QL;
      const T* g = block_of(grads, gb_, b.offset);
      ops::ZooStep ema;
      ema.kind = ops::ZooUpdate::Ema;
      ema.beta2 = float(T(cfg_.adam_beta2)), ema.scale = float(T(1.0 - cfg_.adam_beta2));
      T* outer = buffer(outerb_, std::max(b.rows * b.rows, b.cols * b.cols));
      if (b.matrix) {
        e.gpu->gemm_f32(false, true, rows, rows, cols, 1.0f, g, cols, g, cols, 0.0f, outer, rows);
        e.gpu->zoo_update(ema, nullptr, outer, L, nullptr, nullptr, size_t(b.rows * b.rows));
      }
      e.gpu->gemm_f32(true, false, cols, cols, rows, 1.0f, g, cols, g, cols, 0.0f, outer, cols);
      e.gpu->zoo_update(ema, nullptr, outer, R, nullptr, nullptr, size_t(b.cols * b.cols));
      T* m = block_of(exp_avg_, mb_, b.state);
      T* v = block_of(exp_avg_sq_, vb_, b.state);
      T* mhat = buffer(mhatb_, n);
      T* adam = buffer(adamb_, n);
      ops::ZooStep mom;
      mom.kind = ops::ZooUpdate::ShampooMoments;
      mom.beta1 = float(T(cfg_.adam_beta1)), mom.beta2 = float(T(cfg_.adam_beta2));
      mom.ckp1 = float(T(1.0 - cfg_.adam_beta1)), mom.rho_bs = float(T(1.0 - cfg_.adam_beta2));
      mom.bc1 = float(T(1.0 / c1)), mom.bc2 = float(T(1.0 / c2)), mom.eps = float(T(cfg_.adam_eps));
      e.gpu->zoo_update(mom, adam, g, m, v, mhat, size_t(n));
      store(m, exp_avg_, b.state);
      store(v, exp_avg_sq_, b.state);
      if (roots) {
        if (b.matrix) gpu_inverse_root(L, QL, b.rows, 4.0, c2);
        gpu_inverse_root(R, QR, b.cols, b.matrix ? 4.0 : 2.0, c2);
      }
      T* direction = adam;
      double graft = 1.0;
      if (precondition) {
        T* tmp = buffer(tmpb_, n);
        e.gpu->gemm_f32(false, false, rows, cols, cols, 1.0f, mhat, cols, QR, cols, 0.0f, tmp,
                        cols);
        T* s = tmp;
        if (b.matrix) {
          s = buffer(sb_, n);
          e.gpu->gemm_f32(false, false, rows, cols, rows, 1.0f, QL, rows, tmp, cols, 0.0f, s, cols);
        }
        const double adam_norm = ops::sum_squares(e, adam, size_t(n));
        const double s_norm = ops::sum_squares(e, s, size_t(n));
        graft = double(T(std::sqrt(adam_norm) / (std::sqrt(s_norm) + 1e-16)));
        direction = s;
      }
      T* w = block_of(values, wb_, b.offset);
      ops::ZooStep apply;
      apply.kind = ops::ZooUpdate::ShampooApply;
      apply.lr = float(T(lr)), apply.wd = float(T(b.decay)), apply.scale = float(graft);
      e.gpu->zoo_update(apply, w, direction, direction, nullptr, nullptr, size_t(n));
      store(w, values, b.offset);
    }
  }

  void gpu_inverse_root(const T* F, T* Q, int64_t n, double root, double c2) {
    std::vector<T> f(size_t(n * n)), q(size_t(n * n));
    ops::download(exec_, f.data(), F, f.size());
    inverse_root(f.data(), q.data(), n, root, c2);
    ops::upload(exec_, Q, q.data(), q.size());
  }

  // A scratch buffer of at least n elements where the parameters live.
  T* buffer(Tensor& t, int64_t n) {
    if (!t.defined() || t.numel() < n)
      t = Tensor::zeros({std::max<int64_t>(n, 1)}, dtype_of<T>(), device_, exec_.memory());
    return t.template data<T>();
  }

  // The block of the tensor whose first element is flat[at], and back.
  void load_block(const Block& b, const T* flat, int64_t at, std::vector<T>& out) const {
    out.resize(size_t(b.rows * b.cols));
    for (int64_t i = 0; i < b.rows; ++i)
      std::copy_n(flat + at + (b.r0 + i) * b.ld + b.c0, b.cols, out.data() + i * b.cols);
  }
  void store_block(const Block& b, const std::vector<T>& in, T* flat, int64_t at) const {
    for (int64_t i = 0; i < b.rows; ++i)
      std::copy_n(in.data() + i * b.cols, b.cols, flat + at + (b.r0 + i) * b.ld + b.c0);
  }

  // L = b2 L + (1 - b2) G G^T (matrices), R = b2 R + (1 - b2) G^T G.
  void accumulate(const T* g, const Block& b, T* L, T* R) {
    const T b2 = T(cfg_.adam_beta2), w = T(1.0 - cfg_.adam_beta2);
    const int rows = int(b.rows), cols = int(b.cols);
    if (L) {
      outer_.resize(size_t(rows) * rows);
      ops::gemm<T>(false, true, rows, rows, cols, T(1), g, cols, g, cols, T(0), outer_.data(),
                   rows);
      for (size_t i = 0; i < outer_.size(); ++i) L[i] = b2 * L[i] + w * outer_[i];
    }
    outer_.resize(size_t(cols) * cols);
    ops::gemm<T>(true, false, cols, cols, rows, T(1), g, cols, g, cols, T(0), outer_.data(), cols);
    for (size_t i = 0; i < outer_.size(); ++i) R[i] = b2 * R[i] + w * outer_[i];
  }

  // The pool as the checkpoint's buffers: element j of the stream at saved_[j % n] of
  // buffer j / n; the fingerprint last.
  // On the GPU the pool and the views pass through the host while a checkpoint is saved or
  // loaded.
  void export_views() {
    const size_t n = saved_.size();
    if (exec_.on_gpu()) {
      pool_.resize(size_t(pool_size_));
      ops::download(exec_, pool_.data(), pool_gpu_.template data<T>(), pool_.size());
    }
    views_.assign(size_t(buffers_), std::vector<T>(size_t(size_), T(0)));
    // Sharded: the blocks of the tensors this rank owns (zeros elsewhere), summed below.
    for (const Block& b : blocks_)
      if (shards_.owned(b.param))
        for (int64_t j = 0; j < b.pool_size(); ++j) {
          const size_t at = size_t(b.pool + j);
          views_[at / n][size_t(saved_[at % n])] = pool_[size_t(b.local + j)];
        }
    Communicator* dp = layout_.data_parallel;
    if (!shards_.sharded() || dp->rank() == 0) views_.back()[size_t(saved_.back())] = fingerprint_;
    const bool reduce_on_device = shards_.sharded() && exec_.on_gpu() && dp->device_memory();
    if (shards_.sharded() && !reduce_on_device)
      for (std::vector<T>& v : views_) dp->all_reduce(v.data(), v.size());
    if (!exec_.on_gpu()) return;
    std::vector<T>().swap(pool_);
    gpu_views_.clear();
    for (const std::vector<T>& v : views_) {
      gpu_views_.push_back(
          Tensor::zeros({std::max<int64_t>(size_, 1)}, dtype_of<T>(), device_, exec_.memory()));
      ops::upload(exec_, gpu_views_.back().template data<T>(), v.data(), v.size());
      if (reduce_on_device) dp->all_reduce(gpu_views_.back().template data<T>(), v.size());
    }
  }
  void import_views() {
    const size_t n = saved_.size();
    for (size_t i = 0; i < gpu_views_.size(); ++i)
      ops::download(exec_, views_[i].data(), gpu_views_[i].template data<T>(), views_[i].size());
    gpu_views_.clear();
    if (exec_.on_gpu()) pool_.resize(size_t(pool_size_));
    OMNI_REQUIRE(views_.back()[size_t(saved_.back())] == fingerprint_,
                 "--optimizer shampoo: the checkpoint's preconditioners were laid out for other "
                 "tensors (another model, pipeline layout, or padded vocabulary: tensor "
                 "parallelism pads it to a multiple of --make-vocab-size-divisible-by times "
                 "--tensor-model-parallel-size); resume with the layout that saved them, or with "
                 "--no-load-optim");
    for (const Block& b : blocks_)
      if (shards_.held(b.param))
        for (int64_t j = 0; j < b.pool_size(); ++j) {
          const size_t at = size_t(b.pool + j);
          pool_[size_t(b.local + j)] = views_[at / n][size_t(saved_[at % n])];
        }
    views_.clear();
    if (!exec_.on_gpu()) return;
    ops::upload(exec_, pool_gpu_.template data<T>(), pool_.data(), pool_.size());
    std::vector<T>().swap(pool_);
  }

  // Q = (F / c2 + eps I)^(-1/root), in float64.
  void inverse_root(const T* F, T* Q, int64_t n, double root, double c2) {
    std::vector<double> a(size_t(n * n)), out(size_t(n * n));
    for (int64_t i = 0; i < n * n; ++i) a[size_t(i)] = double(F[i]) / c2;
    linalg::symmetric_inverse_root(a.data(), n, root, cfg_.zoo.shampoo_eps, out.data());
    for (int64_t i = 0; i < n * n; ++i) Q[i] = T(out[size_t(i)]);
  }

  // W -= lr * (D + wd * W) on the block.
  void apply(const Block& b, const std::vector<T>& d, T* values, double lr) const {
    const T tlr = T(lr), wd = T(b.decay);
    for (int64_t i = 0; i < b.rows; ++i) {
      T* w = values + b.offset + (b.r0 + i) * b.ld + b.c0;
      const T* di = d.data() + i * b.cols;
      for (int64_t j = 0; j < b.cols; ++j) w[j] -= tlr * (di[j] + wd * w[j]);
    }
  }

  OptimizerConfig cfg_;
  ZooLayout<T> layout_;
  ops::Exec exec_;
  Device device_;
  WholeTensorStates<T> shards_;  // which tensors this rank steps, where their moments lie
  int64_t size_;                 // the flat buffer's elements, as shards_.infos() lay it out
  ZooStates<T> states_;
  T *exp_avg_ = nullptr, *exp_avg_sq_ = nullptr;  // states_'s, looked up once
  std::vector<Block> blocks_;
  std::vector<T> pool_;  // on the GPU only while a checkpoint is saved or loaded
  int64_t pool_size_ = 0;
  Tensor pool_gpu_;
  std::vector<Tensor> gpu_views_;
  Tensor gb_, mb_, vb_, mhatb_, adamb_, sb_, tmpb_, outerb_, wb_;  // the GPU's scratch
  std::vector<int64_t> saved_;  // the flat buffer's positions that hold parameters
  int64_t buffers_ = 0;
  T fingerprint_ = T(0);
  std::vector<std::vector<T>> views_;  // the checkpoint's preconditioners.k, while asked for
  std::vector<T> g_, m_, v_, mhat_, adam_, s_, tmp_, outer_;  // scratch
};

}  // namespace

template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_shampoo(const OptimizerConfig& config,
                                              const ParameterSet<T>& params,
                                              const ZooLayout<T>& layout) {
  const ZooConfig& z = config.zoo;
  OMNI_REQUIRE(z.shampoo_update_freq >= 1, "--shampoo-update-freq must be at least 1 (got ",
               z.shampoo_update_freq, ")");
  OMNI_REQUIRE(z.shampoo_max_preconditioner_dim >= 1,
               "--shampoo-max-preconditioner-dim must be at least 1 (got ",
               z.shampoo_max_preconditioner_dim, ")");
  OMNI_REQUIRE(z.shampoo_eps >= 0, "--shampoo-eps must be 0 or more (got ", z.shampoo_eps, ")");
  return std::make_shared<Shampoo<T>>(config, params, layout);
}

template std::shared_ptr<ZooOptimizer<float>> make_shampoo(const OptimizerConfig&,
                                                           const ParameterSet<float>&,
                                                           const ZooLayout<float>&);
template std::shared_ptr<ZooOptimizer<double>> make_shampoo(const OptimizerConfig&,
                                                            const ParameterSet<double>&,
                                                            const ZooLayout<double>&);

}  // namespace omni
