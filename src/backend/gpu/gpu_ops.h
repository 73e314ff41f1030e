// The op surface on the GPU: the ops of backend/ops.h (same names, same meaning, same
// conventions; read the comments there) for device pointers, with one CUDA/HIP source per op
// in backend/gpu/<op>.cu. Plain C++: callers need no GPU headers.
//
// Mixed precision as Megatron runs it: activations, their gradients and the model's copy of
// the weights are stored as T (float, bf16 or f16); arithmetic is float; parameter gradients
// (dw, db, dwte, ...) accumulate into float buffers (Megatron's main_grad); per-row statistics
// (mean, rstd, log-sum-exp) are float. All pointers are device memory unless a comment says
// otherwise; every op is enqueued on `stream` (null: the default stream) and returns without
// waiting, except those that return a value to the host.
//
// Deterministic: every op gives the same bits on every run for the same inputs (no float
// atomics whose order depends on scheduling), which the determinism test relies on.
//
// Built three ways (gpu_runtime.h): CUDA, HIP, and emulated on the CPU for tests, where the
// symbols live in omni::gpu::emulated instead of omni::gpu::device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/gpu/gpu_types.h"
#include "backend/gpu_backend.h"
#include "backend/op_types.h"
#include "backend/zoo_adam8bit_math.h"

OMNI_GPU_NAMESPACE_BEGIN

using Stream = void*;  // cudaStream_t / hipStream_t

// ---- Devices and memory -----------------------------------------------------------------------
int device_count();
void set_device(int index);
void synchronize();  // the whole device
void synchronize(Stream stream);
void* device_alloc(size_t bytes);  // throws OutOfMemory-style error naming the size
void device_free(void* p);
void copy_to_device(void* dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes, Stream stream = nullptr);
// `rows` runs of `width` bytes, src_pitch and dst_pitch bytes apart (one strided copy).
void copy_rows_on_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                         size_t width, size_t rows, Stream stream = nullptr);
void fill_zero(void* p, size_t bytes, Stream stream = nullptr);

// Owns a device allocation of n elements of T.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n), p_(static_cast<T*>(device_alloc(n * sizeof(T)))) {}
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : n_(o.n_), p_(o.p_) { o.n_ = 0, o.p_ = nullptr; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(n_, o.n_), std::swap(p_, o.p_);
    return *this;
  }
  ~DeviceArray() { device_free(p_); }
  T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  size_t n_ = 0;
  T* p_ = nullptr;
};

// Scratch memory an op needs for the length of one call (partial sums of a deterministic
// reduction, a cuBLASLt workspace): grows on demand, never shrinks, one per device and
// purpose. Ops running on one stream may share it.
void* scratch(size_t bytes, int slot = 0);

// ---- Element-wise ------------------------------------------------------------------------------
// dst[i] = T(src[i]) (rounded to nearest even) and back.
template <typename T>
void convert_from_float(T* dst, const float* src, size_t n, Stream stream = nullptr);
template <typename T>
void convert_to_float(float* dst, const T* src, size_t n, Stream stream = nullptr);
template <typename T>
void add(T* out, const T* a, const T* b, size_t n, Stream stream = nullptr);
template <typename T>
void add_bias(T* y, const T* bias, int M, int N, Stream stream = nullptr);
template <typename T>
void gelu_forward(T* out, const T* x, size_t n, GeluForm form, Stream stream = nullptr);
template <typename T>
void gelu_backward(T* dx, const T* dout, const T* x, size_t n, GeluForm form,
                   Stream stream = nullptr);
template <typename T>
void swiglu_forward(T* out, const T* x, int N, int F, Stream stream = nullptr);
template <typename T>
void swiglu_backward(T* dx, const T* dout, const T* x, int N, int F, Stream stream = nullptr);

// ---- Embeddings
// ----------------------------------------------------------------------------------
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int N, int seq,
                       int C, const int32_t* positions = nullptr, int vocab_start = 0,
                       int vocab_end = 1 << 30, Stream stream = nullptr);
// dwte (rows [vocab_start, vocab_end) of the vocabulary) and dwpe (may be null) +=, in a fixed
// order per row (no atomics).
template <typename T>
void embedding_backward(float* dwte, float* dwpe, const int32_t* tokens, const T* dout, int N,
                        int seq, int C, const int32_t* positions = nullptr, int vocab_start = 0,
                        int vocab_end = 1 << 30, Stream stream = nullptr);
template <typename T>
void position_embedding_add(T* out, const T* wpe, int N, int seq, int C,
                            const int32_t* positions = nullptr, Stream stream = nullptr);

// ---- Norms
// ---------------------------------------------------------------------------------------
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int N,
                       int C, float eps, Stream stream = nullptr);
// dx +=, dw +=, db += (db may be null); dw and db are summed over rows in a fixed order.
template <typename T>
void layernorm_backward(T* dx, float* dw, float* db, const T* dout, const T* x, const T* w,
                        const float* mean, const float* rstd, int N, int C,
                        Stream stream = nullptr);
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int N, int C, float eps,
                     Stream stream = nullptr);
template <typename T>
void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w, const float* rstd,
                      int N, int C, Stream stream = nullptr);

// ---- Attention helpers
// ---------------------------------------------------------------------------
template <typename T>
void qkv_split(T* q, T* k, T* v, const T* qkv, const ops::AttentionDims& d,
               Stream stream = nullptr);
template <typename T>
void qkv_merge(T* qkv, const T* q, const T* k, const T* v, const ops::AttentionDims& d,
               Stream stream = nullptr);
// cos/sin: float [seq, rotary_dim/2] device tables (ops::rope_tables computed on the host, then
// copied); positions and rotary_dim (0: head_dim) as in ops.h.
template <typename T>
void rope_forward(T* x, const float* cos, const float* sin, int N, int seq, int nheads,
                  int head_dim, const int32_t* positions = nullptr, int rotary_dim = 0,
                  Stream stream = nullptr);
template <typename T>
void rope_backward(T* dx, const float* cos, const float* sin, int N, int seq, int nheads,
                   int head_dim, const int32_t* positions = nullptr, int rotary_dim = 0,
                   Stream stream = nullptr);

// ---- Flash attention
// ----------------------------------------------------------------------------- Causal softmax
// attention without the probability matrix: q [batch*seq, heads*hd], k/v [batch*seq, groups*hd]
// (grouped-query), out [batch*seq, heads*hd], lse float [batch, heads, seq] (natural-log
// log-sum-exp of each row's scaled scores; -inf for a row with no keys, whose output is 0). Scale
// 1/sqrt(head_dim). d.key_start / d.q_index, when set, are device arrays with ops.h's meaning. The
// backward recomputes probabilities from lse (FlashAttention-2).
template <typename T>
void flash_attention_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                             const ops::AttentionDims& d, Stream stream = nullptr);
// dq, dk, dv are overwritten.
template <typename T>
void flash_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                              const T* q, const T* k, const T* v, const ops::AttentionDims& d,
                              Stream stream = nullptr);

// x *= s (float arithmetic).
template <typename T>
void scale(T* x, float s, size_t n, Stream stream = nullptr);
// ops::dropout: hidden dropout in place, the CPU's masks (backend/dropout_mask.h); kept values
// are multiplied by 1/(1-p) in float.
template <typename T>
void dropout(T* x, int rows, int width, int seq, const ops::DropoutKey& k, Stream stream = nullptr);

// ops::attention_merge: out (T) and lse (float) hold attention over earlier blocks of keys and
// receive the merge with this block's block_out and block_lse.
template <typename T>
void attention_merge(T* out, float* lse, const T* block_out, const float* block_lse,
                     const ops::AttentionDims& d, Stream stream = nullptr);

// ---- Matmuls (cuBLASLt / hipBLASLt; the emulated build multiplies on the CPU) -------------------
// y[M,N] = x[M,K] w[N,K]^T (+ bias[N]); with gelu_out non-null also gelu_out = gelu(y) in
// gelu_form (the bias-GELU epilogue: y is the pre-activation the backward needs; only the tanh
// form is cuBLASLt's epilogue, the erf form is a kernel after the GEMM's bias epilogue).
template <typename T>
void linear_forward(T* y, const T* x, const T* w, const T* bias, int M, int K, int N,
                    Stream stream = nullptr, T* gelu_out = nullptr,
                    GeluForm gelu_form = GeluForm::Erf);
// dx = dy w (or += when accumulate_dx); dw += dy^T x (float); dbias += colsum(dy) (float).
// dx and dbias may be null.
template <typename T>
void linear_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x, const T* w, int M,
                     int K, int N, bool accumulate_dx = false, Stream stream = nullptr);

// ---- Output layer and loss
// -----------------------------------------------------------------------
// ops::classifier_cross_entropy on the device: logits = h w[:vocab]^T a chunk of rows at a time,
// softmax and cross-entropy fused, probabilities never stored whole. losses (float, may be null)
// per row; dh (may be null) overwritten, dw += (float). Returns sum mask*loss (waits for the
// stream). Vocabulary-parallel: a.vocab_start and a.reduce as in ops.h; reduce is called with
// device pointers to float64 values, after the stream has finished writing them, and must have
// combined them in place when it returns.
template <typename T>
double classifier_cross_entropy(float* losses, T* dh, float* dw, const T* h, const T* w,
                                const int32_t* targets, const float* mask,
                                const ops::ClassifierLossArgs& a, Stream stream = nullptr);

// ---- Optimizer
// ----------------------------------------------------------------------------------- Sum of
// squares of every element of several float arrays (gradient buffers), in a fixed order, in double;
// `arrays` (of device pointers) and `sizes` are host arrays. Waits for the stream.
double sum_squares(const float* const* arrays, const size_t* sizes, int count,
                   Stream stream = nullptr);
// How many elements of x[0..n) are exactly zero, in a fixed order (--log-num-zeros-in-grad).
double count_zeros(const float* x, size_t n, Stream stream = nullptr);
// True when any element of x[0..n) is inf or NaN (the loss scaler's overflow check).
bool has_nonfinite(const float* x, size_t n, Stream stream = nullptr);

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1, bias_correction2;  // 1 - beta^t
  float grad_scale;                          // gradients are multiplied by this first (1/loss
                                             // scale times the clipping factor)
};
// One AdamW step over one contiguous range (decay applies to the whole range; call once per
// range of equal decay): master fp32 params, fp32 grads and moments updated in place; when
// model_copy is non-null it receives the new parameters as T (the bf16/f16 weights the
// forward reads).
template <typename T>
void adamw_update(float* params, T* model_copy, const float* grads, float* exp_avg,
                  float* exp_avg_sq, size_t n, const AdamWStep& s, Stream stream = nullptr);

// One SGD step over a contiguous range (optim/optimizer.cpp's update_elements): momentum and
// weight decay folded into the gradient, fp32 throughout.
void sgd_update(float* params, const float* grads, float* momentum_buf, size_t n, float lr,
                float momentum, float weight_decay, Stream stream = nullptr);

// One element-wise step of the optimizer zoo (backend/op_types.h's ZooStep), fp32.
void zoo_update(const ops::ZooStep& step, float* w, const float* g, float* s0, float* s1, float* s2,
                size_t n, Stream stream = nullptr);
// One pass of adam8bit's step (backend/zoo_adam8bit_math.h's Step), fp32 weights.
void adam8bit_update(const adam8bit::Step& step, Stream stream = nullptr);
// C[M,N] = alpha op(A) op(B) + beta C in float, row-major (ops::gemm's convention), through
// blas::gemm (Muon's Newton-Schulz iteration).
void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc, Stream stream = nullptr);

// The op seam's GPU half (backend/gpu_backend.h) over these ops, on the default stream.
const ::omni::GpuBackend& backend();

OMNI_GPU_NAMESPACE_END
