// The Hugging Face architectures omnitron converts (checkpoint/hf_interchange.h), shared by
// the config.json reader and writer (hf_config.cpp) and the tensor map (hf_interchange.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "model/transformer_config.h"

namespace omni::hf {

enum class Family { GPT2, Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen2Moe, Qwen3Moe, DeepseekV3 };

struct FamilyInfo {
  Family family;
  const char* model_type;
  const char* architecture;
  const char* prefix;  // of the backbone's tensors in the *ForCausalLM model
};

const FamilyInfo& family_info(Family f);
// The model_type values read_config accepts, for messages: "gpt2, llama, ...".
std::string model_types();

// Biases on q_proj, k_proj and v_proj (only there).
inline bool has_qkv_bias(Family f) {
  return f == Family::Qwen2 || f == Family::Qwen2Moe;
}
// RMSNorm of each query and key head (q_norm, k_norm) before rope: Megatron's --qk-layernorm.
inline bool has_qk_norm(Family f) {
  return f == Family::Qwen3 || f == Family::Qwen3Moe;
}
inline bool is_moe(Family f) {
  return f == Family::Mixtral || f == Family::Qwen2Moe || f == Family::Qwen3Moe;
}

struct Config {
  Family family;
  std::vector<std::string> args;  // omnitron's flags, Megatron's spelling
  // DeepSeek-V3: the rope rows of q_b_proj (q_proj) and kv_a_proj_with_mqa are in interleaved
  // pair order (rope_interleave, true unless config.json says false); omnitron's are not.
  bool rope_interleave = false;
  int mtp_layers = 0;  // DeepSeek-V3's num_nextn_predict_layers: not imported
};

// DIR/config.json as flags; fields omnitron cannot represent are a UsageError naming the
// file and the field.
Config read_config(const std::string& dir);
TransformerConfig config_from_args(const std::vector<std::string>& args);

// The architecture a model of ours exports as, or a UsageError naming what has no
// Hugging Face equivalent.
Family family_of(const TransformerConfig& c);
// config.json for `c` exported as `family`, its weights stored as `dtype`.
std::string config_json(Family family, const TransformerConfig& c, DType dtype);

std::string format_number(double v);
std::string read_text(const std::string& path);

}  // namespace omni::hf
