#include "backend/attention_backend.h"

#include "base/error.h"

#if defined(OMNITRON_GPU)
#include "backend/gpu/cudnn_attention.h"
#endif

namespace omni {

const char* attention_backend_name(AttentionBackend b) {
  switch (b) {
    case AttentionBackend::Flash:
      return "flash";
    case AttentionBackend::Fused:
      return "fused";
    case AttentionBackend::Unfused:
      break;
  }
  return "unfused";
}

bool is_attention_backend_value(const std::string& flag) {
  return flag == "auto" || flag == "flash" || flag == "fused" || flag == "unfused" ||
         flag == "local";
}

AttentionSupport attention_support(bool gpu, const ops::AttentionDims& d, DType dtype) {
  AttentionSupport s;
  s.gpu = gpu;
#if defined(OMNITRON_HIP)
  s.hip = true;
#endif
#if defined(OMNITRON_GPU)
  if (gpu) {
    s.cudnn = gpu::has_cudnn();
    if (s.cudnn) {
      if (dtype == DType::BF16)
        gpu::fused_attention_supported<gpu::bf16>(d, &s.fused_unsupported);
      else if (dtype == DType::F16)
        gpu::fused_attention_supported<gpu::f16>(d, &s.fused_unsupported);
      else
        gpu::fused_attention_supported<float>(d, &s.fused_unsupported);
    }
  }
#endif
  if (!gpu)
    s.fused_unsupported = "attention runs on the CPU";
  else if (d.dropout.active())
    s.fused_unsupported =
        "attention dropout draws omnitron's Philox masks (cuDNN's dropout has its own RNG)";
  else if (!s.cudnn)
    s.fused_unsupported = "this build has no cuDNN";
  return s;
}

AttentionBackend choose_attention_backend(const std::string& flag, const AttentionSupport& s,
                                          std::string* reason) {
  if (!is_attention_backend_value(flag))
    throw UsageError("--attention-backend: '" + flag + "' is not one of auto, flash, fused, " +
                     "unfused, local");
  const std::string asked = "--attention-backend " + flag;
  auto say = [&](AttentionBackend b, const std::string& why) {
    if (reason) *reason = asked + ": " + why;
    return b;
  };
  if (!s.gpu)
    return say(AttentionBackend::Unfused,
               flag == "auto" || flag == "unfused" || flag == "local"
                   ? "the CPU's softmax attention"
                   : "the CPU has one attention, the softmax reference; " + flag +
                         " attention is a GPU kernel");
  if (flag == "unfused" || flag == "local")
    throw UsageError(asked +
                     ": the GPU has no unfused attention kernel (the softmax reference runs on "
                     "the CPU: --device cpu); use flash, fused or auto");
  if (flag == "flash") return say(AttentionBackend::Flash, "omnitron's FlashAttention-2 kernel");
  if (s.hip) {
    if (flag == "fused")
      throw UsageError(asked + ": cuDNN's fused attention is NVIDIA's; this is a HIP (AMD) " +
                       "build, use flash or auto");
    return say(AttentionBackend::Flash, "omnitron's FlashAttention-2 kernel (no cuDNN on AMD)");
  }
  if (flag == "fused") {
    if (!s.fused_unsupported.empty())
      throw UsageError(asked + ": cuDNN's fused attention cannot run here: " + s.fused_unsupported);
    return say(AttentionBackend::Fused, "cuDNN's fused attention");
  }
  // auto
  if (s.fused_unsupported.empty())
    return say(AttentionBackend::Fused, "cuDNN's fused attention (cuDNN takes this shape)");
  return say(AttentionBackend::Flash,
             "omnitron's FlashAttention-2 kernel (cuDNN not used: " + s.fused_unsupported + ")");
}

AttentionBackend choose_attention_backend(const std::string& flag, bool gpu,
                                          const ops::AttentionDims& d, DType dtype,
                                          std::string* reason) {
  return choose_attention_backend(flag, attention_support(gpu, d, dtype), reason);
}

std::string describe_attention_backend(AttentionBackend b, const std::string& reason) {
  std::string line = std::string("attention: ") + attention_backend_name(b);
#if defined(OMNITRON_GPU)
  if (b == AttentionBackend::Fused) line += " (" + gpu::cudnn_version_string() + ")";
#endif
  if (!reason.empty()) line += " -- " + reason;
  return line;
}

}  // namespace omni
