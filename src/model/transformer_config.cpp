#include "model/transformer_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numbers>

#include "base/error.h"
#include "model/mla.h"
#include "model/moe_layer.h"

namespace omni {

const char* to_string(Normalization n) {
  return n == Normalization::LayerNorm ? "LayerNorm" : "RMSNorm";
}
const char* to_string(PositionEmbedding p) {
  switch (p) {
    case PositionEmbedding::LearnedAbsolute:
      return "learned_absolute";
    case PositionEmbedding::Rope:
      return "rope";
    case PositionEmbedding::None:
      return "none";
  }
  return "?";
}

// Megatron's RotaryEmbedding: dim = int(kv_channels * rotary_percent) when the percent is
// below 1, inverse frequencies base^(-i/dim) for i = 0, 2, ... < dim (so an odd dim rotates
// dim + 1 channels).
int TransformerConfig::rotary_dim() const {
  if (multi_latent_attention) return qk_pos_emb_head_dim;
  const int dim = rotary_percent < 1.0 ? static_cast<int>(head_dim() * rotary_percent) : head_dim();
  return 2 * ((dim + 1) / 2);
}

std::vector<double> TransformerConfig::rotary_inv_freq() const {
  if (multi_latent_attention) return mla_rotary_inv_freq(*this);
  const int dim = rotary_percent < 1.0 ? static_cast<int>(head_dim() * rotary_percent) : head_dim();
  std::vector<double> inv_freq;
  for (int i = 0; i < dim; i += 2) inv_freq.push_back(std::pow(rotary_base, -double(i) / dim));
  if (!use_rope_scaling) return inv_freq;
  // Llama 3.1 (Megatron's RotaryEmbedding._apply_scaling, fixed low/high frequency factors
  // 1 and 4 over an original context of 8192 positions).
  const double factor = rope_scaling_factor, low = 1.0, high = 4.0, context = 8192.0;
  for (double& f : inv_freq) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > context / low) {
      f /= factor;
    } else if (wavelen >= context / high) {
      const double smooth = (context / wavelen - low) / (high - low);
      f = (1 - smooth) * f / factor + smooth * f;
    }
  }
  return inv_freq;
}

int TransformerConfig::padded_vocab_size() const {
  const int m = make_vocab_size_divisible_by;
  return (vocab_size + m - 1) / m * m;
}

namespace {

// Megatron's moe_freq_type: an integer, or a Python list expression of 0/1, e.g. "[1,0,1]" or
// "([0]*3+[1]*58)": sums of bracketed lists, each optionally repeated by "*N".
class MoEFreqParser {
 public:
  explicit MoEFreqParser(const std::string& s) : s_(s) {}
  std::vector<int> parse() {
    std::vector<int> v = sum();
    skip_space();
    if (i_ != s_.size()) fail();
    return v;
  }

 private:
  [[noreturn]] void fail() const {
    throw UsageError("--moe-layer-freq: '" + s_ +
                     "' is neither an integer nor a list of 0/1 such as [1,0,1] or "
                     "([0]*3+[1]*29)");
  }
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool take(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  long integer() {
    skip_space();
    size_t start = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (start == i_ || i_ - start > 6) fail();
    return std::stol(s_.substr(start, i_ - start));
  }
  std::vector<int> sum() {
    std::vector<int> v = term();
    while (take('+')) {
      std::vector<int> t = term();
      v.insert(v.end(), t.begin(), t.end());
    }
    return v;
  }
  std::vector<int> term() {
    std::vector<int> v;
    if (take('(')) {
      v = sum();
      if (!take(')')) fail();
    } else if (take('[')) {
      if (!take(']')) {
        do {
          const long x = integer();
          if (x > 1) fail();
          v.push_back(int(x));
        } while (take(','));
        if (!take(']')) fail();
      }
    } else {
      fail();
    }
    if (take('*')) {
      const long n = integer();
      std::vector<int> r;
      for (long k = 0; k < n; ++k) r.insert(r.end(), v.begin(), v.end());
      v = std::move(r);
    }
    return v;
  }

  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace

std::vector<int> TransformerConfig::moe_layer_pattern() const {
  std::vector<int> pattern(size_t(std::max(num_layers, 0)), 0);
  if (num_moe_experts == 0) return pattern;
  const std::string& f = moe_layer_freq;
  const bool integer = !f.empty() && std::all_of(f.begin(), f.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
  if (integer) {
    const long n = f.size() > 6 ? 0 : std::stol(f);
    OMNI_REQUIRE(n > 0, "--moe-layer-freq must be positive (got ", f, ")");
    for (int i = 0; i < num_layers; ++i) pattern[i] = i % n == 0;
    return pattern;
  }
  pattern = MoEFreqParser(f).parse();
  OMNI_REQUIRE(int(pattern.size()) == num_layers, "--moe-layer-freq: '", f, "' names ",
               pattern.size(), " layers, but --num-layers is ", num_layers);
  return pattern;
}

bool TransformerConfig::is_moe_layer(int layer) const {
  if (num_moe_experts == 0) return false;
  const std::vector<int> p = moe_layer_pattern();
  // Multi-token prediction's layers (num_layers + k) take the last decoder layer's spec, as
  // Megatron's gpt_builders does.
  if (layer >= int(p.size()) && layer < int(p.size()) + mtp_num_layers) layer = int(p.size()) - 1;
  return layer >= 0 && layer < int(p.size()) && p[layer] != 0;
}

void TransformerConfig::validate() const {
  OMNI_REQUIRE(num_layers > 0, "--num-layers must be at least 1 (got ", num_layers, ")");
  OMNI_REQUIRE(hidden_size > 0, "--hidden-size must be positive (got ", hidden_size, ")");
  OMNI_REQUIRE(num_attention_heads > 0, "--num-attention-heads must be positive (got ",
               num_attention_heads, ")");
  OMNI_REQUIRE(kv_channels > 0 || hidden_size % num_attention_heads == 0, "--num-attention-heads (",
               num_attention_heads, ") must divide --hidden-size (", hidden_size,
               "), or set --kv-channels");
  OMNI_REQUIRE(kv_channels >= 0, "--kv-channels must be positive (got ", kv_channels, ")");
  if (group_query_attention) {
    OMNI_REQUIRE(num_query_groups > 0,
                 "--num-query-groups must be positive with "
                 "--group-query-attention (got ",
                 num_query_groups, ")");
    OMNI_REQUIRE(num_attention_heads % num_query_groups == 0, "--num-query-groups (",
                 num_query_groups, ") must divide --num-attention-heads (", num_attention_heads,
                 ")");
  }
  OMNI_REQUIRE(ffn_hidden_size >= 0, "--ffn-hidden-size must be positive (got ", ffn_hidden_size,
               ")");
  OMNI_REQUIRE(ffn_size() > 0,
               "--swiglu without --ffn-hidden-size: Megatron's default, 8h/3 "
               "rounded down to a multiple of 64, is 0 for --hidden-size ",
               hidden_size, "; set --ffn-hidden-size");
  OMNI_REQUIRE(seq_length > 0, "--seq-length must be positive (got ", seq_length, ")");
  OMNI_REQUIRE(max_positions() >= seq_length, "--max-position-embeddings (", max_positions(),
               ") must be at least --seq-length (", seq_length, ")");
  OMNI_REQUIRE(vocab_size > 0, "the vocabulary size must be positive (got ", vocab_size,
               "): set --vocab-size or a tokenizer");
  OMNI_REQUIRE(make_vocab_size_divisible_by > 0,
               "--make-vocab-size-divisible-by must be "
               "positive (got ",
               make_vocab_size_divisible_by, ")");
  OMNI_REQUIRE(hidden_dropout >= 0 && hidden_dropout < 1,
               "--hidden-dropout must be in [0, 1) (got ", hidden_dropout, ")");
  OMNI_REQUIRE(attention_dropout >= 0 && attention_dropout < 1,
               "--attention-dropout must be in [0, 1) (got ", attention_dropout, ")");
  OMNI_REQUIRE(norm_epsilon > 0, "--norm-epsilon must be positive (got ", norm_epsilon, ")");
  OMNI_REQUIRE(init_method_std > 0, "--init-method-std must be positive (got ", init_method_std,
               ")");
  if (multi_latent_attention) validate_mla_config(*this);  // before rope's checks of head_dim()
  if (position_embedding_type == PositionEmbedding::Rope) {
    OMNI_REQUIRE(head_dim() % 2 == 0, "rope needs an even head dimension (got ", head_dim(),
                 " = --hidden-size / --num-attention-heads)");
    OMNI_REQUIRE(rotary_base > 0, "--rotary-base must be positive (got ", rotary_base, ")");
    OMNI_REQUIRE(rotary_percent > 0 && rotary_percent <= 1 && rotary_dim() >= 2,
                 "--rotary-percent (", rotary_percent,
                 ") must be in (0, 1] and leave at least 2 of the head's ", head_dim(),
                 " channels to rotate");
    OMNI_REQUIRE(!use_rope_scaling || rope_scaling_factor > 0,
                 "--rope-scaling-factor must be positive (got ", rope_scaling_factor, ")");
  }
  OMNI_REQUIRE(num_moe_experts >= 0, "--num-experts must be positive (got ", num_moe_experts, ")");
  if (num_moe_experts > 0) {
    validate_moe_config(*this);
    (void)moe_layer_pattern();  // throws naming --moe-layer-freq
  }
}

int64_t TransformerConfig::num_parameters() const {
  const int64_t C = hidden_size, hd = head_dim(), H = num_attention_heads, G = query_groups();
  const int64_t F = ffn_size(), V = vocab_size;
  const int64_t norm = norm_has_bias() ? 2 * C : C;
  int64_t layer = norm * 2 + C * (H + 2 * G) * hd + (qkv_bias() ? (H + 2 * G) * hd : 0) +
                  H * hd * C + (swiglu ? 3 : 2) * C * F;
  if (add_bias_linear) layer += C + (swiglu ? 2 * F : F) + C;
  if (qk_layernorm) layer += 2 * (norm_has_bias() ? 2 * hd : hd);
  if (multi_latent_attention)  // MLA's projections in place of QKV's and the q/k norms
    layer += mla_attention_parameter_count(*this) -
             (C * (H + 2 * G) * hd + (qkv_bias() ? (H + 2 * G) * hd : 0) + H * hd * C +
              (qk_layernorm ? 2 * (norm_has_bias() ? 2 * hd : hd) : 0));
  int64_t total = num_layers * layer + norm + V * C;
  if (position_embedding_type == PositionEmbedding::LearnedAbsolute) total += max_positions() * C;
  if (untie_embeddings_and_output_weights) total += V * C;
  // An MoE layer has the MoE layer's parameters in place of the dense MLP's.
  const int64_t dense_mlp =
      (swiglu ? 3 : 2) * C * F + (add_bias_linear ? (swiglu ? 2 * F : F) + C : 0);
  for (int m : moe_layer_pattern())
    if (m) total += moe_parameter_count(*this) - dense_mlp;
  // Multi-token prediction's depths: enorm, hnorm, eh_proj, a layer of the last decoder
  // layer's kind and final_layernorm (the word embedding and output layer are shared).
  for (int k = 0; k < mtp_num_layers; ++k)
    total += 3 * norm + 2 * C * C + layer +
             (is_moe_layer(num_layers + k) ? moe_parameter_count(*this) - dense_mlp : 0);
  return total;
}

int64_t TransformerConfig::num_active_parameters() const {
  // One expert's fc1 and fc2 (weights and biases): the routed experts a token skips.
  const int64_t C = hidden_size, F = moe_ffn_size(), F1 = swiglu ? 2 * F : F;
  const int64_t expert = F1 * C + C * F + (add_bias_linear ? F1 + C : 0);
  int64_t active = num_parameters();
  for (int m : moe_layer_pattern())
    if (m) active -= int64_t(num_moe_experts - moe_router_topk) * expert;
  for (int k = 0; k < mtp_num_layers; ++k)
    if (is_moe_layer(num_layers + k)) active -= int64_t(num_moe_experts - moe_router_topk) * expert;
  return active;
}

}  // namespace omni
