// The op seam's GPU half (backend/gpu_backend.h): each op of ops.h's dispatching form, for
// float, bf16 and f16 storage, through this folder's kernels on the default stream. Built as CUDA, as HIP
// and on the emulator, like every source here.
#include <atomic>
#include <cmath>
#include <string>
#include <type_traits>

#include "backend/gpu/cudnn_attention.h"
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/moe_kernels.h"
#include "base/error.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

// Each op of one storage type through this folder's kernels.
template <typename T>
class Ops final : public GpuOps<T> {
 public:
  explicit Ops(const std::atomic<bool>& fused) : fused_(fused) {}
  void linear_forward(T* y, const T* x, const T* w, const T* bias, int M, int K,
                      int N) const override {
    gpu::linear_forward(y, x, w, bias, M, K, N);
  }
  void linear_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x, const T* w, int M, int K, int N, bool accumulate_dx) const override {
    gpu::linear_backward(dx, dw, dbias, dy, x, w, M, K, N, accumulate_dx);
  }
  void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                         int N, int seq, int C, const int32_t* positions, int vocab_start,
                         int vocab_end) const override {
    gpu::embedding_forward(out, tokens, wte, wpe, N, seq, C, positions, vocab_start, vocab_end);
  }
  void embedding_backward(float* dwte, float* dwpe, const int32_t* tokens, const T* dout, int N,
                          int seq, int C, const int32_t* positions, int vocab_start,
                          int vocab_end) const override {
    gpu::embedding_backward(dwte, dwpe, tokens, dout, N, seq, C, positions, vocab_start, vocab_end);
  }
  void position_embedding_add(T* out, const T* wpe, int N, int seq, int C,
                              const int32_t* positions) const override {
    gpu::position_embedding_add(out, wpe, N, seq, C, positions);
  }
  void layernorm_forward(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int N, int C, double eps) const override {
    gpu::layernorm_forward(out, mean, rstd, x, w, b, N, C, static_cast<float>(eps));
  }
  void layernorm_backward(T* dx, float* dw, float* db, const T* dout, const T* x, const T* w, const float* mean, const float* rstd, int N,
                          int C) const override {
    gpu::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
  }
  void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int N, int C,
                       double eps) const override {
    gpu::rmsnorm_forward(out, rstd, x, w, N, C, static_cast<float>(eps));
  }
  void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w,
                        const float* rstd, int N, int C) const override {
    gpu::rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
  }
  void gelu_forward(T* out, const T* x, size_t n, GeluForm form) const override {
    gpu::gelu_forward(out, x, n, form);
  }
  void gelu_backward(T* dx, const T* dout, const T* x, size_t n,
                     GeluForm form) const override {
    gpu::gelu_backward(dx, dout, x, n, form);
  }
  void swiglu_forward(T* out, const T* x, int N, int F) const override {
    gpu::swiglu_forward(out, x, N, F);
  }
  void swiglu_backward(T* dx, const T* dout, const T* x, int N, int F) const override {
    gpu::swiglu_backward(dx, dout, x, N, F);
  }
  void add(T* out, const T* a, const T* b, size_t n) const override {
    gpu::add(out, a, b, n);
  }
  void add_bias(T* y, const T* bias, int M, int N) const override {
    gpu::add_bias(y, bias, M, N);
  }
  void qkv_split(T* q, T* k, T* v, const T* qkv,
                 const ops::AttentionDims& d) const override {
    gpu::qkv_split(q, k, v, qkv, d);
  }
  void qkv_merge(T* qkv, const T* q, const T* k, const T* v,
                 const ops::AttentionDims& d) const override {
    gpu::qkv_merge(qkv, q, k, v, d);
  }
  void rope_forward(T* x, const float* cos, const float* sin, int N, int seq, int nheads,
                    int head_dim, const int32_t* positions, int rotary_dim) const override {
    gpu::rope_forward(x, cos, sin, N, seq, nheads, head_dim, positions, rotary_dim);
  }
  void rope_backward(T* dx, const float* cos, const float* sin, int N, int seq, int nheads,
                     int head_dim, const int32_t* positions, int rotary_dim) const override {
    gpu::rope_backward(dx, cos, sin, N, seq, nheads, head_dim, positions, rotary_dim);
  }
  void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                         const ops::AttentionDims& d) const override {
    if (!d.plain_shape())
      padded_attention_forward(out, lse, q, k, v, d);
    else if (fused(d))
      fused_attention_forward(out, lse, q, k, v, d);
    else
      gpu::flash_attention_forward(out, lse, q, k, v, d);
  }
  void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                          const T* q, const T* k, const T* v,
                          const ops::AttentionDims& d) const override {
    if (!d.plain_shape())
      padded_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, d);
    else if (fused(d))
      fused_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, d);
    else
      gpu::flash_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, d);
  }
  void attention_merge(T* out, float* lse, const T* block_out, const float* block_lse,
                       const ops::AttentionDims& d) const override {
    gpu::attention_merge(out, lse, block_out, block_lse, d);
  }
  double classifier_cross_entropy(float* losses, T* dh, float* dw, const T* h, const T* w, const int32_t* targets, const float* mask,
                                  const ops::ClassifierLossArgs& a) const override {
    return gpu::classifier_cross_entropy(losses, dh, dw, h, w, targets, mask, a);
  }
  void scale(T* x, double s, size_t n) const override {
    gpu::scale(x, static_cast<float>(s), n);
  }
  void dropout(T* x, int rows, int width, int seq, const ops::DropoutKey& k) const override {
    gpu::dropout(x, rows, width, seq, k);
  }
  void from_float(T* dst, const float* src, size_t n) const override {
    if constexpr (std::is_same_v<T, float>)
      copy_on_device(dst, src, n * sizeof(float));
    else
      convert_from_float(dst, src, n);
  }
  void to_float(float* dst, const T* src, size_t n) const override {
    if constexpr (std::is_same_v<T, float>)
      copy_on_device(dst, src, n * sizeof(float));
    else
      convert_to_float(dst, src, n);
  }

 private:
  // Multi-latent attention's shapes (value heads narrower than the query heads, a softmax scale
  // of its own) through the flash kernels' plain shape: values (and the output and its
  // gradient) zero-padded to the query head dim, whose extra output channels are then zero,
  // and queries pre-multiplied by scale * sqrt(head_dim), so that the kernels' 1/sqrt(head_dim)
  // gives the asked scale (dq is multiplied by the same factor). Scratch per call.
  static ops::AttentionDims plain(const ops::AttentionDims& d) {
    if (d.v_dim() > d.head_dim)
      throw std::invalid_argument("[attention] value head dim " + std::to_string(d.v_dim()) +
                                  " above the query head dim " + std::to_string(d.head_dim) +
                                  " is not built on the GPU");
    ops::AttentionDims p = d;
    p.v_head_dim = 0, p.softmax_scale = 0;
    return p;
  }
  static float query_factor(const ops::AttentionDims& d) {
    return d.softmax_scale > 0 ? float(d.softmax_scale * std::sqrt(double(d.head_dim))) : 1.0f;
  }
  // Rows of width w into rows of width hd, the rest zero; and back.
  static void pad(T* dst, const T* src, size_t rows, size_t w, size_t hd) {
    fill_zero(dst, rows * hd * sizeof(T));
    copy_rows_on_device(dst, hd * sizeof(T), src, w * sizeof(T), w * sizeof(T), rows);
  }
  static void unpad(T* dst, const T* src, size_t rows, size_t w, size_t hd) {
    copy_rows_on_device(dst, w * sizeof(T), src, hd * sizeof(T), w * sizeof(T), rows);
  }
  void padded_attention_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                                const ops::AttentionDims& d) const {
    const ops::AttentionDims p = plain(d);
    const size_t N = size_t(d.batch) * d.seq, hd = d.head_dim, vd = d.v_dim();
    DeviceArray<T> qs(N * d.heads * hd), vp(N * d.groups * hd), op(N * d.heads * hd);
    copy_on_device(qs.data(), q, qs.size() * sizeof(T));
    gpu::scale(qs.data(), query_factor(d), qs.size());
    pad(vp.data(), v, N * d.groups, vd, hd);
    gpu::flash_attention_forward(op.data(), lse, qs.data(), k, vp.data(), p);
    unpad(out, op.data(), N * d.heads, vd, hd);
  }
  void padded_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                                 const T* q, const T* k, const T* v,
                                 const ops::AttentionDims& d) const {
    const ops::AttentionDims p = plain(d);
    const size_t N = size_t(d.batch) * d.seq, hd = d.head_dim, vd = d.v_dim();
    const float f = query_factor(d);
    DeviceArray<T> qs(N * d.heads * hd), vp(N * d.groups * hd), op(N * d.heads * hd),
        dop(N * d.heads * hd), dvp(N * d.groups * hd);
    copy_on_device(qs.data(), q, qs.size() * sizeof(T));
    gpu::scale(qs.data(), f, qs.size());
    pad(vp.data(), v, N * d.groups, vd, hd);
    pad(op.data(), out, N * d.heads, vd, hd);
    pad(dop.data(), dout, N * d.heads, vd, hd);
    gpu::flash_attention_backward(dq, dk, dvp.data(), dop.data(), op.data(), lse, qs.data(), k,
                                  vp.data(), p);
    gpu::scale(dq, f, N * d.heads * hd);  // d(f q) / dq
    unpad(dv, dvp.data(), N * d.groups, vd, hd);
  }

  bool fused(const ops::AttentionDims& d) const {
    // cuDNN's dropout has its own RNG: with attention dropout our kernel draws the masks.
    return fused_.load(std::memory_order_relaxed) && !d.key_start && !d.q_index &&
           !d.dropout.active();
  }
  const std::atomic<bool>& fused_;
};

class Backend final : public GpuBackend {
 public:
  std::string name() const override {
#if defined(OMNITRON_GPU_EMULATE)
    return "emulated";
#elif defined(OMNITRON_HIP) || defined(__HIPCC__)
    return "HIP";
#else
    return "CUDA";
#endif
  }
  bool memory_is_host_memory() const override {
#if defined(OMNITRON_GPU_EMULATE)
    return true;
#else
    return false;
#endif
  }
  void* allocate(size_t bytes) const override {
    void* p = device_alloc(bytes);
    fill_zero(p, bytes);
    return p;
  }
  void deallocate(void* p) const override {
    device_free(p);
  }
  void zero(void* p, size_t bytes) const override {
    fill_zero(p, bytes);
  }
  void upload(void* dst, const void* src, size_t bytes) const override {
    copy_to_device(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) const override {
    copy_to_host(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    copy_on_device(dst, src, bytes);
  }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                 size_t rows) const override {
    copy_rows_on_device(dst, dst_pitch, src, src_pitch, width, rows);
  }
  void synchronize() const override {
    gpu::synchronize();
  }

  void use_fused_attention(bool fused) const override {
    fused_.store(fused, std::memory_order_relaxed);
  }
  const GpuOps<float>& ops_f32() const override {
    return f32_;
  }
  const GpuOps<bf16>& ops_bf16() const override {
    return bf16_;
  }
  const GpuOps<f16>& ops_f16() const override {
    return f16_;
  }
  const GpuMoeOps<float>& moe_ops_f32() const override { return moe_backend_ops<float>(); }
  const GpuMoeOps<bf16>& moe_ops_bf16() const override { return moe_backend_ops<bf16>(); }
  const GpuMoeOps<f16>& moe_ops_f16() const override { return moe_backend_ops<f16>(); }

  void adamw_update(float* w, const float* g, float* m, float* v, size_t n, double lr, double beta1,
                    double beta2, double eps, double weight_decay, int64_t step) const override {
    AdamWStep s;
    s.lr = static_cast<float>(lr), s.beta1 = static_cast<float>(beta1);
    s.beta2 = static_cast<float>(beta2), s.eps = static_cast<float>(eps);
    s.weight_decay = static_cast<float>(weight_decay);
    s.bias_correction1 = static_cast<float>(1.0 - std::pow(beta1, double(step)));
    s.bias_correction2 = static_cast<float>(1.0 - std::pow(beta2, double(step)));
    s.grad_scale = 1.0f;
    gpu::adamw_update(w, static_cast<float*>(nullptr), g, m, v, n, s);
  }
  void sgd_update(float* w, const float* g, float* m, size_t n, double lr, double momentum,
                  double weight_decay) const override {
    gpu::sgd_update(w, g, m, n, static_cast<float>(lr), static_cast<float>(momentum),
                    static_cast<float>(weight_decay));
  }
  void zoo_update(const ops::ZooStep& step, float* w, const float* g, float* s0, float* s1,
                  float* s2, size_t n) const override {
    gpu::zoo_update(step, w, g, s0, s1, s2, n);
  }
  void adam8bit_update(const adam8bit::Step& step) const override {
    gpu::adam8bit_update(step);
  }
  void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                int lda, const float* B, int ldb, float beta, float* C, int ldc) const override {
    gpu::gemm_f32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  double count_zeros(const float* x, size_t n) const override { return gpu::count_zeros(x, n); }
  double sum_squares(const float* x, size_t n) const override {
    return gpu::sum_squares(&x, &n, 1);
  }

 private:
  mutable std::atomic<bool> fused_{false};
  Ops<float> f32_{fused_};
  Ops<bf16> bf16_{fused_};
  Ops<f16> f16_{fused_};
};

}  // namespace

void register_releasable(const DeviceMemory& device);  // releasable.cu

const GpuBackend& backend() {
  static const Backend instance;
  static const bool releasable = (register_releasable(instance), true);
  (void)releasable;
  return instance;
}

OMNI_GPU_NAMESPACE_END
