// The mixture-of-experts ops on the GPU (backend/moe_ops.h for their meaning; gpu_ops.h for the
// conventions): the router in moe_router.cu, the permutations, the grouped GEMM and the shared
// expert's gate in moe_dispatch.cu, and the op seam's GpuMoeOps over them in moe_backend.cu.
// Plain C++: callers need no GPU headers.
//
// The router's scores are computed in double, as the CPU's are, so that the experts chosen
// (ties to the lower expert) and the losses are the CPU's. Every reduction has a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/gpu/gpu_ops.h"
#include "backend/gpu_moe_backend.h"

OMNI_GPU_NAMESPACE_BEGIN

template <typename T>
void moe_topk_routing_forward(T* probs, int32_t* indices, const T* logits, const T* expert_bias,
                              const ops::MoERoutingArgs& a, Stream stream = nullptr);
// dlogits [tokens, experts] overwritten.
template <typename T>
void moe_topk_routing_backward(T* dlogits, const T* dprobs, const T* logits, const int32_t* indices,
                               const ops::MoERoutingArgs& a, Stream stream = nullptr);
// Return the loss (wait for the stream); dlogits (may be null) += grad_scale * its gradient.
// a.counts, when given, is device memory.
template <typename T>
double moe_aux_loss(T* dlogits, const T* logits, const ops::MoEAuxLossArgs& a, double grad_scale,
                    Stream stream = nullptr);
// counts [sequences, experts] (device memory, overwritten): moe_aux_loss's token counts.
template <typename T>
void moe_aux_loss_counts(double* counts, const T* logits, const ops::MoEAuxLossArgs& a,
                         Stream stream = nullptr);
template <typename T>
double moe_z_loss(T* dlogits, const T* logits, int tokens, int experts, double coeff,
                  double grad_scale, Stream stream = nullptr);
// tokens_per_expert: host memory.
template <typename T>
void moe_expert_bias_update(T* expert_bias, const double* tokens_per_expert, int experts,
                            double rate, Stream stream = nullptr);

template <typename T>
void moe_permute(T* out, const T* x, const MoEDevicePlan& plan, int C, Stream stream = nullptr);
template <typename T>
void moe_permute_backward(T* dx, const T* dout, const MoEDevicePlan& plan, int C, bool accumulate,
                          Stream stream = nullptr);
template <typename T>
void moe_row_weights(T* row_weight, const T* probs, const MoEDevicePlan& plan,
                     Stream stream = nullptr);
template <typename T>
void moe_row_weights_backward(T* dprobs, const T* drow_weight, const MoEDevicePlan& plan,
                              Stream stream = nullptr);
template <typename T>
void moe_unpermute(T* y, const T* expert_out, const T* row_weight, const MoEDevicePlan& plan, int C,
                   Stream stream = nullptr);
template <typename T>
void moe_unpermute_backward(T* dexpert_out, T* drow_weight, const T* dy, const T* expert_out,
                            const T* row_weight, const MoEDevicePlan& plan, int C,
                            Stream stream = nullptr);
// Every non-empty expert's linear on its rows of one buffer: one grouped GEMM where blas.h's
// grouped_gemm can take the products (moe_dispatch.cu says which), else one linear_forward /
// linear_backward per expert; host_offsets [experts + 1] is host memory.
template <typename T>
void moe_grouped_linear_forward(T* y, const T* x, const T* w, const T* bias,
                                const int32_t* host_offsets, int experts, int K, int N,
                                Stream stream = nullptr);
template <typename T>
void moe_grouped_linear_backward(T* dx, float* dw, float* dbias, const T* dy, const T* x,
                                 const T* w, const int32_t* host_offsets, int experts, int K, int N,
                                 Stream stream = nullptr);
template <typename T>
void moe_shared_gate_forward(T* y, T* gate, const T* h, const T* x, const T* w, int tokens, int C,
                             Stream stream = nullptr);
template <typename T>
void moe_shared_gate_backward(T* dh, T* dx, float* dw, const T* dy, const T* h, const T* gate,
                              const T* x, const T* w, int tokens, int C, Stream stream = nullptr);

// The op seam's MoE ops over these (backend.cu's Backend returns them).
template <typename T>
const ::omni::GpuMoeOps<T>& moe_backend_ops();

OMNI_GPU_NAMESPACE_END
