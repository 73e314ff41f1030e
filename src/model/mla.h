// Multi-latent attention (DeepSeek-V2/V3, Megatron-Core's MultiLatentAttention): the config's
// checks, parameter count, rope frequencies and softmax scale. The layer itself is
// GPTModel's (model/gpt_mla.cpp):
//   q   = W_uq norm(W_dq h)            (q_lora_rank > 0)   or   W_q h      (q_lora_rank 0)
//   ckv = W_dkv h = [c (kv_lora_rank), k_pe (qk_pos_emb_head_dim)]
//   [k_nope, v] per head = W_ukv norm(c);   k = [k_nope, rope(k_pe)] (k_pe shared by the heads)
//   q per head = [q_nope, rope(q_pe)];      out = softmax(scale q k^T) v;   W_proj out
// norm: the model's norm (RMSNorm for DeepSeek) with --qk-layernorm, else none (Megatron's
// IdentityOp). Parameters (Megatron's names, under "self_attention."): linear_q_down_proj,
// q_layernorm, linear_q_up_proj (or linear_q_proj), linear_kv_down_proj, kv_layernorm,
// linear_kv_up_proj, linear_proj.
// Rope: Megatron (mla_rotary_interleaved) and Hugging Face DeepSeek rotate the rope channels as
// interleaved pairs (2i, 2i+1); omnitron rotates halves (i, i + d/2). The two are the same
// function of the weights once the rope rows of linear_q_up_proj (per head) and
// linear_kv_down_proj are permuted: omnitron holds them de-interleaved (even channels, then odd;
// mla_deinterleaved_rope_rows maps them).
// Tensor parallel: the up-projections are split by heads, the down-projections and latent
// norms replicated (each rank's gradient is its heads' part, summed over the group).
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer_config.h"

namespace omni {

// Throws UsageError naming the flags (--multi-latent-attention without rope, a missing
// --kv-lora-rank, biases, ...).
void validate_mla_config(const TransformerConfig& c);
// The attention block's parameters without the input norm: projections, latent norms and the
// output projection.
int64_t mla_attention_parameter_count(const TransformerConfig& c);
// The rope part's inverse frequencies: YaRN's blend (Megatron's YarnRotaryEmbedding) or plain.
std::vector<double> mla_rotary_inv_freq(const TransformerConfig& c);
// Megatron's softmax scale: mscale^2 / sqrt(qk_head_dim + qk_pos_emb_head_dim), mscale = YaRN's
// 0.1 mscale_all_dim ln(factor) + 1 (1 when --rotary-scaling-factor <= 1).
double mla_softmax_scale(const TransformerConfig& c);
// For `rows` rows in blocks of `block` whose `rope` rows from `first` in each block are in
// Megatron's and Hugging Face's interleaved pair order: the row omnitron holds each in (those
// rows de-interleaved: even channels, then odd; the others where they are).
std::vector<int64_t> mla_deinterleaved_rope_rows(int64_t rows, int64_t block, int64_t first,
                                                 int64_t rope);

}  // namespace omni
