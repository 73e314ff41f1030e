// The GPU half of the mixture-of-experts ops' seam (backend/moe_ops.h's dispatching forms):
// what they call when their Exec names a GPU. Implemented once, backend/gpu/moe_backend.cu,
// built as CUDA, as HIP and on the emulator like backend/gpu_backend.h's ops, whose
// conventions these follow (device pointers, float parameter gradients, enqueued on the
// backend's stream; those returning a value wait for it). Plain C++17, no GPU headers.
#pragma once

#include <cstdint>

#include "backend/moe_types.h"

namespace omni {

// A dispatch plan's arrays (ops::MoEDispatchPlan) in device memory, as the kernels read them.
struct MoEDevicePlan {
  int tokens = 0, topk = 0, rows = 0;
  const int32_t* row_token = nullptr;      // [rows]
  const int32_t* row_slot = nullptr;       // [rows]
  const int32_t* token_offsets = nullptr;  // [tokens + 1]
  const int32_t* token_rows = nullptr;     // [rows]
};

// The MoE ops of one storage type T (float, bf16 or f16), with backend/moe_ops.h's meaning.
// The dispatch plan itself is built on the host (moe_ops.h's dispatching moe_dispatch_plan),
// so that drops and ties choose the CPU's tokens; the grouped GEMM's expert offsets are the
// host plan's.
template <typename T>
class GpuMoeOps {
 public:
  virtual ~GpuMoeOps() = default;
  virtual void topk_routing_forward(T* probs, int32_t* indices, const T* logits,
                                    const T* expert_bias, const ops::MoERoutingArgs& a) const = 0;
  virtual void topk_routing_backward(T* dlogits, const T* dprobs, const T* logits,
                                     const int32_t* indices,
                                     const ops::MoERoutingArgs& a) const = 0;
  // a.counts (when given) and counts are device memory.
  virtual double aux_loss(T* dlogits, const T* logits, const ops::MoEAuxLossArgs& a,
                          double grad_scale) const = 0;
  virtual void aux_loss_counts(double* counts, const T* logits,
                               const ops::MoEAuxLossArgs& a) const = 0;
  virtual double z_loss(T* dlogits, const T* logits, int tokens, int experts, double coeff,
                        double grad_scale) const = 0;
  // tokens_per_expert is host memory.
  virtual void expert_bias_update(T* expert_bias, const double* tokens_per_expert, int experts,
                                  double rate) const = 0;
  virtual void permute(T* out, const T* x, const MoEDevicePlan& plan, int C) const = 0;
  virtual void permute_backward(T* dx, const T* dout, const MoEDevicePlan& plan, int C,
                                bool accumulate) const = 0;
  virtual void row_weights(T* row_weight, const T* probs, const MoEDevicePlan& plan) const = 0;
  virtual void row_weights_backward(T* dprobs, const T* drow_weight,
                                    const MoEDevicePlan& plan) const = 0;
  virtual void unpermute(T* y, const T* expert_out, const T* row_weight, const MoEDevicePlan& plan,
                         int C) const = 0;
  virtual void unpermute_backward(T* dexpert_out, T* drow_weight, const T* dy, const T* expert_out,
                                  const T* row_weight, const MoEDevicePlan& plan, int C) const = 0;
  // host_offsets: [experts + 1] in host memory.
  virtual void grouped_linear_forward(T* y, const T* x, const T* w, const T* bias,
                                      const int32_t* host_offsets, int experts, int K,
                                      int N) const = 0;
  virtual void grouped_linear_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x,
                                       const T* w, const int32_t* host_offsets, int experts, int K,
                                       int N) const = 0;
  virtual void shared_gate_forward(T* y, T* gate, const T* h, const T* x, const T* w, int tokens,
                                   int C) const = 0;
  virtual void shared_gate_backward(T* dh, T* dx, float* dw, const T* dy, const T* h, const T* gate,
                                    const T* x, const T* w, int tokens, int C) const = 0;
};

}  // namespace omni
