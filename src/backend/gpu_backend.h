// The GPU half of the op seam: what ops.h's dispatching functions call when their Exec names a
// GPU. One implementation, backend/gpu/backend.cu, is built three ways: CUDA, HIP, and on the
// GPU emulator (tests); a build without a GPU backend has none, and gpu_backend() throws.
//
// The ops have ops.h's meaning and conventions (read the comments there), with float storage
// on the device. Every pointer is device memory; ops are enqueued on the backend's stream and
// return without waiting, except those that return a value to the host. Plain C++17 with no
// GPU headers, so the GPU sources include it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/op_types.h"
#include "base/device_memory.h"

namespace omni {

class GpuBackend : public DeviceMemory {
 public:
  // "CUDA", "HIP" or "emulated".
  virtual std::string name() const = 0;
  // Device memory is host memory (the emulator), so ranks that are threads of one process can
  // exchange it through the in-process communicator; a real GPU's needs NCCL/RCCL.
  virtual bool memory_is_host_memory() const = 0;

  virtual void linear_forward(float* y, const float* x, const float* w, const float* bias, int M,
                              int K, int N) const = 0;
  virtual void linear_backward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                               const float* w, int M, int K, int N, bool accumulate_dx) const = 0;
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int N, int seq, int C, const int32_t* positions,
                                 int vocab_start, int vocab_end) const = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const int32_t* tokens,
                                  const float* dout, int N, int seq, int C,
                                  const int32_t* positions, int vocab_start,
                                  int vocab_end) const = 0;
  virtual void position_embedding_add(float* out, const float* wpe, int N, int seq, int C,
                                      const int32_t* positions) const = 0;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* x,
                                 const float* w, const float* b, int N, int C,
                                 double eps) const = 0;
  virtual void layernorm_backward(float* dx, float* dw, float* db, const float* dout,
                                  const float* x, const float* w, const float* mean,
                                  const float* rstd, int N, int C) const = 0;
  virtual void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int N,
                               int C, double eps) const = 0;
  virtual void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x,
                                const float* w, const float* rstd, int N, int C) const = 0;
  virtual void gelu_forward(float* out, const float* x, size_t n, GeluForm form) const = 0;
  virtual void gelu_backward(float* dx, const float* dout, const float* x, size_t n,
                             GeluForm form) const = 0;
  virtual void swiglu_forward(float* out, const float* x, int N, int F) const = 0;
  virtual void swiglu_backward(float* dx, const float* dout, const float* x, int N,
                               int F) const = 0;
  virtual void add(float* out, const float* a, const float* b, size_t n) const = 0;
  virtual void add_bias(float* y, const float* bias, int M, int N) const = 0;
  virtual void qkv_split(float* q, float* k, float* v, const float* qkv,
                         const ops::AttentionDims& d) const = 0;
  virtual void qkv_merge(float* qkv, const float* q, const float* k, const float* v,
                         const ops::AttentionDims& d) const = 0;
  // cos/sin: float [seq, rotary_dim/2] device tables.
  virtual void rope_forward(float* x, const float* cos, const float* sin, int N, int seq,
                            int nheads, int head_dim, const int32_t* positions,
                            int rotary_dim) const = 0;
  virtual void rope_backward(float* dx, const float* cos, const float* sin, int N, int seq,
                             int nheads, int head_dim, const int32_t* positions,
                             int rotary_dim) const = 0;
  virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const ops::AttentionDims& d) const = 0;
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const float* lse, const float* q,
                                  const float* k, const float* v,
                                  const ops::AttentionDims& d) const = 0;
  virtual void attention_merge(float* out, float* lse, const float* block_out,
                               const float* block_lse, const ops::AttentionDims& d) const = 0;
  virtual double classifier_cross_entropy(float* losses, float* dh, float* dw, const float* h,
                                          const float* w, const int32_t* targets, const float* mask,
                                          const ops::ClassifierLossArgs& a) const = 0;
  virtual void scale(float* x, double s, size_t n) const = 0;
  // One AdamW step of n elements at step `step` (1-based), as optim/optimizer.cpp's
  // update_elements does it.
  virtual void adamw_update(float* w, const float* g, float* m, float* v, size_t n, double lr,
                            double beta1, double beta2, double eps, double weight_decay,
                            int64_t step) const = 0;
  virtual double sum_squares(const float* x, size_t n) const = 0;
};

// The GPU backend --device cuda / hip trains on: the build's own (CUDA or HIP), or one a test
// installed (the emulator's); null when there is none.
const GpuBackend* gpu_backend();
void set_gpu_backend(const GpuBackend* backend);

}  // namespace omni
