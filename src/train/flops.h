// Model FLOPs per iteration, two ways:
//
// megatron_flops_per_iteration: what Megatron-LM logs as throughput today (training.py,
// num_floating_point_operations, transformer_flops, at the commit our flag list is taken
// from): forward + backward (x3) multiply-adds (x2) of every matrix product; attention's
// score and value products counted for the causal half; multi-latent attention's projections
// as they are; MoE layers the top-k experts' widths and the shared expert's (the router left
// out); each multi-token prediction depth its layer (of the last decoder layer's kind), its
// eh_proj and norms, and its own logits. A user's Megatron log and ours give the same
// TFLOP/s for the same step time.
//
// narayanan_flops_per_iteration: the 2021 formula (Narayanan et al., "Efficient Large-Scale
// Language Model Training on GPU Clusters", and Megatron's logs until January 2026), which
// counts attention in full and knows no MLA or MTP. `omnitron plan` builds its compute time
// on it and compares with the paper's published TFLOP/s.
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer_config.h"

namespace omni {

namespace flops_detail {

// The summed MLP widths over the layers (MTP depths included), each times its expansion
// (3 with SwiGLU: the gate and up products and the down product; 2 without).
inline double mlp_width_sum(const TransformerConfig& c, int mtp_depths) {
  const std::vector<int> pattern = c.moe_layer_pattern();
  const bool last_moe = !pattern.empty() && pattern.back() != 0;
  const double moe = double(c.moe_ffn_size()) * c.moe_router_topk +
                     double(c.moe_shared_expert_intermediate_size);
  double sum = 0;
  for (int is_moe : pattern) sum += is_moe ? moe : double(c.ffn_size());
  sum += mtp_depths * (last_moe ? moe : double(c.ffn_size()));
  return sum * (c.swiglu ? 3.0 : 2.0);
}

}  // namespace flops_detail

inline double megatron_flops_per_iteration(const TransformerConfig& c, int64_t global_batch) {
  const double h = c.hidden_size, s = c.seq_length, tokens = double(global_batch) * s;
  const double heads = c.num_attention_heads, V = c.padded_vocab_size();
  const int mtp = c.mtp_num_layers;
  const double layers = double(c.num_layers) + mtp;
  // Per token and layer: attention's projections (multiply-adds), and the score and value
  // products' widths, halved for the causal mask.
  double projections = 0, core = 0;
  if (c.multi_latent_attention) {
    const double qk = c.qk_head_dim, pe = c.qk_pos_emb_head_dim, v = c.v_head_dim;
    const double q = c.q_lora_rank == 0 ? h * heads * (qk + pe)
                                        : c.q_lora_rank * (h + heads * (qk + pe) + 1);
    projections = q + c.kv_lora_rank * (h + heads * (qk + v) + 1) + h * pe + heads * v * h;
    core = heads * (qk + pe) / 2 + heads * v / 2;
  } else {
    const double q = double(c.head_dim()) * heads, kv = double(c.head_dim()) * c.query_groups();
    projections = h * (q + 2 * kv) + q * h;
    core = q;
  }
  const double per_token = h * flops_detail::mlp_width_sum(c, mtp) + layers * projections +
                           mtp * (3 * h + 2 * h * h) + h * V * (mtp + 1);
  return 6.0 * (tokens * per_token + tokens * s * layers * core);
}

inline double narayanan_flops_per_iteration(const TransformerConfig& c, int64_t global_batch) {
  const double h = c.hidden_size, s = c.seq_length, L = c.num_layers;
  const double heads = c.num_attention_heads, groups = c.query_groups();
  const double q_ratio = double(c.head_dim()) * heads / h;
  // The layers' mean MLP width times 1.5 with SwiGLU (its three products against two).
  const double ffn = flops_detail::mlp_width_sum(c, 0) / 2.0 / L;
  return 12.0 * double(global_batch) * s * L * h * h *
         ((1.0 + groups / heads + s / h) * q_ratio + ffn / h +
          double(c.padded_vocab_size()) / (2.0 * L * h));
}

}  // namespace omni
