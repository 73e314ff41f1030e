// TransformerConfig: the model's shape and features, with Megatron's field names. GPT-2
// and the Llama family are options of one decoder-only transformer, not two models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/moe_types.h"

namespace omni {

enum class Normalization { LayerNorm, RMSNorm };
enum class PositionEmbedding { LearnedAbsolute, Rope, None };

const char* to_string(Normalization n);
const char* to_string(PositionEmbedding p);

struct TransformerConfig {
  int num_layers = 12;
  int hidden_size = 768;
  int ffn_hidden_size = 0;  // 0: Megatron's default (ffn_size())
  int num_attention_heads = 12;
  bool group_query_attention = false;
  // Megatron's default: --group-query-attention alone is one key/value head (multi-query
  // attention); without --group-query-attention every query head has its own.
  int num_query_groups = 1;
  int kv_channels = 0;  // head dim; 0: hidden_size / num_attention_heads
  int seq_length = 1024;
  int max_position_embeddings = 0;  // 0: seq_length
  int vocab_size = 0;
  int make_vocab_size_divisible_by = 128;
  Normalization normalization = Normalization::LayerNorm;
  double norm_epsilon = 1e-5;
  bool swiglu = false;
  // Megatron's --openai-gelu: the GELU MLP uses the tanh approximation (GPT-2's gelu_new)
  // instead of Megatron's default, the exact erf GELU.
  bool openai_gelu = false;
  PositionEmbedding position_embedding_type = PositionEmbedding::LearnedAbsolute;
  double rotary_base = 10000.0;
  // Megatron's --rotary-percent: rope rotates the first int(head_dim x percent) channels of
  // each head (rounded up to even), the rest pass through.
  double rotary_percent = 1.0;
  // Llama 3.1's frequency scaling (Megatron's --use-rope-scaling, --rope-scaling-factor):
  // wavelengths above 8192 positions are divided by the factor, those below 2048 kept, and
  // those between interpolated (low/high frequency factors 1 and 4, as Megatron fixes them).
  bool use_rope_scaling = false;
  double rope_scaling_factor = 8.0;
  // Megatron's --apply-layernorm-1p (layernorm_zero_centered_gamma): every norm's weight is
  // stored as gamma - 1 (initialised to 0) and applied as weight + 1.
  bool layernorm_zero_centered_gamma = false;
  bool add_bias_linear = true;
  bool add_qkv_bias = false;
  bool qk_layernorm = false;
  bool untie_embeddings_and_output_weights = false;
  double init_method_std = 0.02;
  // Megatron's dropout probabilities (its defaults are 0.1; a config made in code starts at 0):
  // hidden_dropout after the embedding and after each attention block's and MLP's output
  // (before the residual add), attention_dropout on the attention probabilities. Training
  // only; masks are keyed as backend/dropout_mask.h says.
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;

  // Mixture of experts, with Megatron's fields (num_moe_experts 0: dense MLPs). 0 stands for
  // Megatron's None. model/moe_layer.h checks them (validate_moe_config).
  int num_moe_experts = 0;
  // Megatron's --moe-layer-freq: which layers' MLPs are MoE layers. An integer N: every N-th
  // layer (layer i when i % N == 0); or a per-layer list of 0/1, written "[1,0,1]" or in
  // Primus's Python form "([0]*3+[1]*58)". Read with moe_layer_pattern().
  std::string moe_layer_freq = "1";
  int moe_ffn_hidden_size = 0;  // 0: ffn_size()
  int moe_router_topk = 2;
  MoEScoreFunction moe_router_score_function = MoEScoreFunction::Softmax;
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = 0;
  int moe_router_num_groups = 0;
  int moe_router_group_topk = 0;
  MoELoadBalancing moe_router_load_balancing_type = MoELoadBalancing::AuxLoss;
  double moe_aux_loss_coeff = 0;
  double moe_z_loss_coeff = 0;
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  double moe_expert_capacity_factor = 0;  // 0: dropless
  MoETokenDropPolicy moe_token_drop_policy = MoETokenDropPolicy::Probs;
  bool moe_pad_expert_input_to_capacity = false;
  bool moe_grouped_gemm = false;
  std::string moe_token_dispatcher_type = "allgather";  // allgather|alltoall: one rank, the same
  int moe_shared_expert_intermediate_size = 0;          // 0: no shared expert
  bool moe_shared_expert_gate = false;

  // Multi-token prediction (DeepSeek-V3, model/mtp.cpp): depths after the main model, and the
  // weight of their mean loss in the objective (Megatron's --mtp-loss-scaling-factor).
  int mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;

  // Multi-latent attention (DeepSeek-V2/V3; Megatron's --multi-latent-attention and its flags;
  // model/mla.h). Queries from a q_lora_rank latent (0: Megatron's None, from the hidden
  // state), keys and values from a kv_lora_rank latent; each head's query and key are
  // qk_head_dim channels without rope and qk_pos_emb_head_dim with it (one rope key per token,
  // shared by the heads); values are v_head_dim wide. With qk_layernorm the latents are normed.
  bool multi_latent_attention = false;
  int q_lora_rank = 0;
  int kv_lora_rank = 32;
  int qk_head_dim = 128;
  int qk_pos_emb_head_dim = 64;
  int v_head_dim = 128;
  // Its rope (Megatron's --rope-type: yarn, MLA's default, or rope) and YaRN's parameters.
  bool yarn = true;
  double rotary_scaling_factor = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;
  int original_max_position_embeddings = 4096;
  double beta_fast = 32.0, beta_slow = 1.0;

  // Derived values; valid after validate().
  // The queries' and keys' head dim (MLA: qk_head_dim + qk_pos_emb_head_dim), and the values'.
  int head_dim() const {
    if (multi_latent_attention) return qk_head_dim + qk_pos_emb_head_dim;
    return kv_channels ? kv_channels : hidden_size / num_attention_heads;
  }
  int value_head_dim() const { return multi_latent_attention ? v_head_dim : head_dim(); }
  int query_groups() const {  // MLA: every head has its own key and value
    return group_query_attention && !multi_latent_attention ? num_query_groups
                                                            : num_attention_heads;
  }
  // Megatron's default MLP width: 4h, or with SwiGLU's two projections 8h/3 rounded down to a
  // multiple of 64 (its int((4 * h * 2 / 3) / 64) * 64).
  int ffn_size() const {
    return ffn_hidden_size ? ffn_hidden_size
           : swiglu        ? 8 * hidden_size / 192 * 64
                           : 4 * hidden_size;
  }
  int moe_ffn_size() const { return moe_ffn_hidden_size ? moe_ffn_hidden_size : ffn_size(); }
  int max_positions() const {
    return max_position_embeddings ? max_position_embeddings : seq_length;
  }
  int padded_vocab_size() const;
  // Per layer: 1 where the MLP is an MoE layer (all 0 without --num-experts). Throws
  // UsageError naming --moe-layer-freq when it does not parse or has the wrong length.
  std::vector<int> moe_layer_pattern() const;
  bool is_moe_layer(int layer) const;
  // Rope: the channels of each head it rotates, and their inverse frequencies (one per
  // pair: rotary_dim() / 2), after Llama 3.1 scaling when on.
  int rotary_dim() const;
  std::vector<double> rotary_inv_freq() const;
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  bool norm_has_bias() const { return normalization == Normalization::LayerNorm; }

  // Throws UsageError naming the offending flag, e.g. "--num-query-groups (3) must divide
  // --num-attention-heads (8)".
  void validate() const;
  // Parameter count (unpadded vocabulary rows included once; MoE layers with every expert;
  // multi-token prediction's depths included).
  int64_t num_parameters() const;
  // The parameters one token meets: MoE layers count their router, shared expert and
  // --moe-router-topk of their experts (the "active" figure published for MoE models).
  int64_t num_active_parameters() const;
};

// Whether the MoE layers build experts split over `etp` ranks beside `tp` tensor-parallel
// ones: etp dividing tp (blocks of tp ranks) or a multiple of it (whole tp groups).
inline bool expert_tensor_parallel_built(int tp, int etp) {
  return etp > 0 && tp > 0 && (tp % etp == 0 || etp % tp == 0);
}

}  // namespace omni
