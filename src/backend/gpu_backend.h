// The GPU half of the op seam: what ops.h's dispatching functions call when their Exec names a
// GPU. One implementation, backend/gpu/backend.cu, is built three ways: CUDA, HIP, and on the
// GPU emulator (tests); a build without a GPU backend has none, and gpu_backend() throws.
//
// The ops have ops.h's meaning and conventions (read the comments there), for float, bf16 and
// f16 storage on the device. Every pointer is device memory; ops are enqueued on the backend's
// stream and return without waiting, except those that return a value to the host. Plain C++17 with
// no GPU headers, so the GPU sources include it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/op_types.h"
#include "base/device_memory.h"
#include "base/dtype.h"

namespace omni::adam8bit {
struct Step;  // backend/zoo_adam8bit_math.h
}  // namespace omni::adam8bit

namespace omni {

template <typename T>
class GpuMoeOps;  // backend/gpu_moe_backend.h

// The ops of one storage type T (float, bf16 or f16): activations and weights are T;
// parameter gradients and per-row statistics (mean, rstd, log-sum-exp, per-row losses) are
// float, as ops.h's contract says.
template <typename T>
class GpuOps {
 public:
  virtual ~GpuOps() = default;
  virtual void linear_forward(T* y, const T* x, const T* w, const T* bias, int M, int K,
                              int N) const = 0;
  virtual void linear_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x, const T* w,
                               int M, int K, int N, bool accumulate_dx) const = 0;
  virtual void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int N,
                                 int seq, int C, const int32_t* positions, int vocab_start,
                                 int vocab_end) const = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const int32_t* tokens, const T* dout,
                                  int N, int seq, int C, const int32_t* positions, int vocab_start,
                                  int vocab_end) const = 0;
  virtual void position_embedding_add(T* out, const T* wpe, int N, int seq, int C,
                                      const int32_t* positions) const = 0;
  virtual void layernorm_forward(T* out, float* mean, float* rstd, const T* x, const T* w,
                                 const T* b, int N, int C, double eps) const = 0;
  virtual void layernorm_backward(T* dx, float* dw, float* db, const T* dout, const T* x,
                                  const T* w, const float* mean, const float* rstd, int N,
                                  int C) const = 0;
  virtual void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int N, int C,
                               double eps) const = 0;
  virtual void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w,
                                const float* rstd, int N, int C) const = 0;
  virtual void gelu_forward(T* out, const T* x, size_t n, GeluForm form) const = 0;
  virtual void gelu_backward(T* dx, const T* dout, const T* x, size_t n, GeluForm form) const = 0;
  virtual void swiglu_forward(T* out, const T* x, int N, int F) const = 0;
  virtual void swiglu_backward(T* dx, const T* dout, const T* x, int N, int F) const = 0;
  virtual void add(T* out, const T* a, const T* b, size_t n) const = 0;
  virtual void add_bias(T* y, const T* bias, int M, int N) const = 0;
  virtual void qkv_split(T* q, T* k, T* v, const T* qkv, const ops::AttentionDims& d) const = 0;
  virtual void qkv_merge(T* qkv, const T* q, const T* k, const T* v,
                         const ops::AttentionDims& d) const = 0;
  // cos/sin: float [seq, rotary_dim/2] device tables.
  virtual void rope_forward(T* x, const float* cos, const float* sin, int N, int seq, int nheads,
                            int head_dim, const int32_t* positions, int rotary_dim) const = 0;
  virtual void rope_backward(T* dx, const float* cos, const float* sin, int N, int seq, int nheads,
                             int head_dim, const int32_t* positions, int rotary_dim) const = 0;
  virtual void attention_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                                 const ops::AttentionDims& d) const = 0;
  virtual void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out,
                                  const float* lse, const T* q, const T* k, const T* v,
                                  const ops::AttentionDims& d) const = 0;
  virtual void attention_merge(T* out, float* lse, const T* block_out, const float* block_lse,
                               const ops::AttentionDims& d) const = 0;
  virtual double classifier_cross_entropy(float* losses, T* dh, float* dw, const T* h, const T* w,
                                          const int32_t* targets, const float* mask,
                                          const ops::ClassifierLossArgs& a) const = 0;
  virtual void scale(T* x, double s, size_t n) const = 0;
  virtual void dropout(T* x, int rows, int width, int seq, const ops::DropoutKey& k) const = 0;
  // dst = src rounded to T (nearest, ties to even), and back to float (exact).
  virtual void from_float(T* dst, const float* src, size_t n) const = 0;
  virtual void to_float(float* dst, const T* src, size_t n) const = 0;
};

class GpuBackend : public DeviceMemory {
 public:
  // "CUDA", "HIP" or "emulated".
  virtual std::string name() const = 0;
  // Device memory is host memory (the emulator), so ranks that are threads of one process can
  // exchange it through the in-process communicator; a real GPU's needs NCCL/RCCL.
  virtual bool memory_is_host_memory() const = 0;

  // The ops for storage type T.
  template <typename T>
  const GpuOps<T>& ops() const {
    if constexpr (std::is_same_v<T, bf16>)
      return ops_bf16();
    else if constexpr (std::is_same_v<T, f16>)
      return ops_f16();
    else
      return ops_f32();
  }
  // Whether attention_forward/backward run cuDNN's fused attention (--attention-backend
  // fused, or auto where cuDNN takes the run's shape) instead of our flash kernel; calls with
  // per-row key ranges (packed documents, ring blocks) run ours either way. Set once per run,
  // before its first step.
  virtual void use_fused_attention(bool fused) const = 0;
  virtual const GpuOps<float>& ops_f32() const = 0;
  virtual const GpuOps<bf16>& ops_bf16() const = 0;
  virtual const GpuOps<f16>& ops_f16() const = 0;
  // The mixture-of-experts ops for T (backend/gpu_moe_backend.h).
  template <typename T>
  const GpuMoeOps<T>& moe_ops() const {
    if constexpr (std::is_same_v<T, bf16>)
      return moe_ops_bf16();
    else if constexpr (std::is_same_v<T, f16>)
      return moe_ops_f16();
    else
      return moe_ops_f32();
  }
  virtual const GpuMoeOps<float>& moe_ops_f32() const = 0;
  virtual const GpuMoeOps<bf16>& moe_ops_bf16() const = 0;
  virtual const GpuMoeOps<f16>& moe_ops_f16() const = 0;

  // One AdamW step of n elements at step `step` (1-based), as optim/optimizer.cpp's
  // update_elements does it.
  virtual void adamw_update(float* w, const float* g, float* m, float* v, size_t n, double lr,
                            double beta1, double beta2, double eps, double weight_decay,
                            int64_t step) const = 0;
  // One SGD step (momentum, weight decay added to the gradient), as update_elements does it.
  virtual void sgd_update(float* w, const float* g, float* m, size_t n, double lr, double momentum,
                          double weight_decay) const = 0;
  // One element-wise step of the optimizer zoo (ops::ZooStep says which states s0..s2 are).
  virtual void zoo_update(const ops::ZooStep& step, float* w, const float* g, float* s0, float* s1,
                          float* s2, size_t n) const = 0;
  // One pass of adam8bit's step (backend/zoo_adam8bit_math.h).
  virtual void adam8bit_update(const adam8bit::Step& step) const = 0;
  // C[M,N] = alpha op(A) op(B) + beta C in float (ops::gemm's convention): Muon's iteration.
  virtual void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const float* A, int lda, const float* B, int ldb, float beta, float* C,
                        int ldc) const = 0;
  virtual double sum_squares(const float* x, size_t n) const = 0;
  virtual double count_zeros(const float* x, size_t n) const = 0;
};

// The GPU backend --device cuda / hip trains on: the build's own (CUDA or HIP), or one a test
// installed (the emulator's); null when there is none.
const GpuBackend* gpu_backend();
void set_gpu_backend(const GpuBackend* backend);

}  // namespace omni
