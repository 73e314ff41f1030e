#include "model/mla.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/dtype.h"
#include "base/error.h"

namespace omni {

namespace {

// YaRN's attention factor for a scaling factor and an mscale (Megatron's _yarn_get_mscale).
double yarn_mscale(double factor, double mscale) {
  return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

}  // namespace

void validate_mla_config(const TransformerConfig& c) {
  const char* flag = "--multi-latent-attention";
  OMNI_REQUIRE(c.position_embedding_type == PositionEmbedding::Rope, flag,
               " needs --position-embedding-type rope (its decoupled rope key; got ",
               to_string(c.position_embedding_type), ")");
  OMNI_REQUIRE(c.kv_lora_rank > 0, flag, " needs a positive --kv-lora-rank (got ", c.kv_lora_rank,
               ")");
  OMNI_REQUIRE(c.q_lora_rank >= 0, "--q-lora-rank must be positive, or unset for none (got ",
               c.q_lora_rank, ")");
  OMNI_REQUIRE(c.qk_head_dim > 0 && c.v_head_dim > 0, flag,
               " needs positive --qk-head-dim and --v-head-dim (got ", c.qk_head_dim, " and ",
               c.v_head_dim, ")");
  OMNI_REQUIRE(c.qk_pos_emb_head_dim > 0 && c.qk_pos_emb_head_dim % 2 == 0, flag,
               " needs an even, positive --qk-pos-emb-head-dim (the rope part; got ",
               c.qk_pos_emb_head_dim, ")");
  OMNI_REQUIRE(!c.add_bias_linear && !c.add_qkv_bias, flag,
               " with linear biases is not built yet: pass --disable-bias-linear (DeepSeek has "
               "none)");
  OMNI_REQUIRE(c.rotary_percent == 1.0, flag, " rotates its whole rope part: --rotary-percent ",
               c.rotary_percent, " is not built for it");
  OMNI_REQUIRE(!c.use_rope_scaling, flag,
               " with --use-rope-scaling (Llama 3.1's): MLA's rope scaling is YaRN "
               "(--rope-type yarn, --rotary-scaling-factor)");
  OMNI_REQUIRE(!c.layernorm_zero_centered_gamma, flag,
               " with --apply-layernorm-1p is not built yet");
  OMNI_REQUIRE(c.rotary_scaling_factor > 0, "--rotary-scaling-factor must be positive (got ",
               c.rotary_scaling_factor, ")");
  if (c.yarn) {
    const double f = c.rotary_scaling_factor;
    const double concentration = yarn_mscale(f, c.mscale) / yarn_mscale(f, c.mscale_all_dim);
    OMNI_REQUIRE(std::abs(concentration - 1.0) < 1e-12, "--rope-type yarn with --mscale ", c.mscale,
                 " and --mscale-all-dim ", c.mscale_all_dim, " scales rope's cos and sin by ",
                 concentration, ", which is not built yet (DeepSeek's configs set the two equal)");
    OMNI_REQUIRE(c.original_max_position_embeddings > 0 && c.beta_fast > 0 && c.beta_slow > 0,
                 "--yarn-original-max-position-embeddings, --yarn-beta-fast and --yarn-beta-slow "
                 "must be positive");
  }
}

int64_t mla_attention_parameter_count(const TransformerConfig& c) {
  const int64_t C = c.hidden_size, H = c.num_attention_heads, qk = c.qk_head_dim;
  const int64_t pe = c.qk_pos_emb_head_dim, vd = c.v_head_dim, ql = c.q_lora_rank;
  const int64_t kvl = c.kv_lora_rank, norm = c.norm_has_bias() ? 2 : 1;
  const int64_t qd = H * (qk + pe);
  int64_t n = ql > 0 ? C * ql + ql * qd + (c.qk_layernorm ? norm * ql : 0) : C * qd;
  n += C * (kvl + pe) + kvl * H * (qk + vd) + (c.qk_layernorm ? norm * kvl : 0);
  return n + H * vd * C;
}

std::vector<double> mla_rotary_inv_freq(const TransformerConfig& c) {
  const int dim = c.qk_pos_emb_head_dim;
  const double base = c.rotary_base, factor = c.rotary_scaling_factor;
  std::vector<double> inv_freq;
  for (int i = 0; i < dim; i += 2) inv_freq.push_back(std::pow(base, -double(i) / dim));
  if (!c.yarn) return inv_freq;
  // The channel index where a wavelength makes `rotations` turns over the original context.
  auto correction_dim = [&](double rotations) {
    return dim * std::log(c.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(c.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(c.beta_slow)), double(dim - 1));
  if (low == high) high += 0.001;
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolate = 1.0 - ramp;  // 1: the original frequency, 0: interpolated
    inv_freq[i] = inv_freq[i] / factor * (1 - extrapolate) + inv_freq[i] * extrapolate;
  }
  return inv_freq;
}

double mla_softmax_scale(const TransformerConfig& c) {
  const double m = yarn_mscale(c.rotary_scaling_factor, c.mscale_all_dim);
  return m * m / std::sqrt(double(c.qk_head_dim + c.qk_pos_emb_head_dim));
}

std::vector<int64_t> mla_deinterleaved_rope_rows(int64_t rows, int64_t block, int64_t first,
                                                 int64_t rope) {
  std::vector<int64_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r % block, j = b - first;  // j: the channel in the interleaved order
    const bool moves = j >= 0 && j < rope;
    out[size_t(r)] = !moves ? r : r - b + first + (j % 2 ? rope / 2 + j / 2 : j / 2);
  }
  return out;
}

}  // namespace omni
