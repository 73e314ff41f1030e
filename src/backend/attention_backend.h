// Which implementation runs attention, as Megatron's --attention-backend names them:
//   flash    our FlashAttention-2 kernel (backend/gpu/attention_*.cu), CUDA and HIP;
//   fused    cuDNN's fused scaled-dot-product attention (backend/gpu/cudnn_attention.*), the
//            vendor's kernel, NVIDIA only, in builds that found cuDNN;
//   unfused  the plain softmax attention that stores the probabilities (ops::attention_*, the
//            reference every other backend is tested against); Megatron's `local` is the same;
//   auto     fused where the build has cuDNN and cuDNN takes the shape, else flash.
// On the CPU every value runs the CPU's attention (the one implementation there), and the
// start-up line says so. The model asks once per run (choose_attention_backend) and prints
// describe_attention_backend.
#pragma once

#include <string>

#include "backend/ops.h"
#include "base/dtype.h"

namespace omni {

enum class AttentionBackend { Flash, Fused, Unfused };

const char* attention_backend_name(AttentionBackend b);  // "flash", "fused", "unfused"

// The values --attention-backend takes, for its help and its error message.
inline constexpr const char* kAttentionBackendValues = "auto|flash|fused|unfused|local";
// True when `flag` is one of kAttentionBackendValues.
bool is_attention_backend_value(const std::string& flag);

// What a run offers attention: where it runs and what the build has. Filled by
// attention_support() for this build; tests fill it by hand to ask "what would a HIP build do".
struct AttentionSupport {
  bool gpu = false;    // attention runs on a GPU (else on the CPU)
  bool hip = false;    // the GPU build is HIP (AMD), where cuDNN does not exist
  bool cudnn = false;  // the build links cuDNN
  // Empty when cuDNN's fused attention takes this shape and dtype; else why it does not
  // ("head_dim 40 is not a multiple of 8", "packed documents ...").
  std::string fused_unsupported;
};

// This build's answer for attention of shape `d` in `dtype` on the GPU (gpu = true) or the CPU.
// Asks cuDNN (gpu::fused_attention_supported) in a CUDA build that found it.
AttentionSupport attention_support(bool gpu, const ops::AttentionDims& d, DType dtype);

// The backend for --attention-backend `flag` given `support`; `reason` (may be null) receives
// why, in words for the start-up line. Throws UsageError naming the flag and value when the
// value is unknown, or asks for what the run cannot do (fused on AMD, fused without cuDNN or
// for a shape cuDNN refuses, unfused on a GPU, which has no such kernel).
AttentionBackend choose_attention_backend(const std::string& flag, const AttentionSupport& support,
                                          std::string* reason);
// The same for this build (attention_support(gpu, d, dtype)).
AttentionBackend choose_attention_backend(const std::string& flag, bool gpu,
                                          const ops::AttentionDims& d, DType dtype,
                                          std::string* reason);

// The start-up line: "attention: fused (cuDNN 9.19.0 fused attention) -- --attention-backend
// auto: ...".
std::string describe_attention_backend(AttentionBackend b, const std::string& reason);

}  // namespace omni
