// cuDNN's fused attention (Megatron's --attention-backend fused): the vendor's
// scaled-dot-product attention kernels, forward and backward, through cuDNN 9's backend graph
// API. Same layout and meaning as flash_attention_forward/backward (gpu_ops.h), so a caller
// swaps one for the other: q [batch*seq, heads*hd], k/v [batch*seq, groups*hd] (grouped-query),
// out like q, lse float [batch, heads, seq] (natural-log log-sum-exp of each row's scaled scores),
// causal, scale 1/sqrt(head_dim).
//
// CUDA builds that found cuDNN (OMNITRON_CUDNN) have the real thing; every other build (HIP,
// the emulator, CUDA without cuDNN) has the same functions, which report "unsupported" and
// throw "[fused_attention] has no cuDNN in this build".
#pragma once

#include <string>

#include "backend/gpu/gpu_ops.h"

OMNI_GPU_NAMESPACE_BEGIN

// True when this build links cuDNN.
bool has_cudnn();
// "cuDNN 9.19.0" (the library loaded at run time), or "" without cuDNN.
std::string cudnn_version_string();

// True when cuDNN's fused attention takes this shape in storage type T (float, bf16, f16) on the
// current device; otherwise false, and `why` (may be null) says what it does not take. Packed
// documents (d.key_start) and ring-attention key blocks (d.q_index) are not taken: cuDNN's masks
// are causal and padding, not per-row key ranges. Does not throw.
template <typename T>
bool fused_attention_supported(const ops::AttentionDims& d, std::string* why);

// Execution plans are built on first use of a shape (a few hundred milliseconds) and cached
// per device, shape and dtype. The backward's dq, dk, dv are overwritten. Errors (an
// unsupported shape, a failing cuDNN call) throw naming the call and cuDNN's status.
template <typename T>
void fused_attention_forward(T* out, float* lse, const T* q, const T* k, const T* v,
                             const ops::AttentionDims& d, Stream stream = nullptr);
template <typename T>
void fused_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse,
                              const T* q, const T* k, const T* v, const ops::AttentionDims& d,
                              Stream stream = nullptr);

OMNI_GPU_NAMESPACE_END
