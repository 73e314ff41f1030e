// Model FLOPs per iteration by Megatron-LM's formula (training.py,
// num_floating_point_operations): forward + backward (x3), multiply-adds (x2), and the
// logits layer; attention counted as full (not causal) as Megatron counts it; MoE layers
// count the experts a token is routed to.
#pragma once

#include <cstdint>

#include "model/transformer_config.h"

namespace omni {

inline double megatron_flops_per_iteration(const TransformerConfig& c, int64_t global_batch) {
  const double h = c.hidden_size, s = c.seq_length, L = c.num_layers;
  const double heads = c.num_attention_heads, groups = c.query_groups();
  const double q_ratio = double(c.head_dim()) * heads / h;
  const double gated = c.swiglu ? 1.5 : 1.0;
  // Megatron's MoE terms: an MoE layer's MLP counts the top-k experts' widths and the shared
  // expert's (the router is left out), a dense layer its own width.
  double ffn = 0;
  for (int moe : c.moe_layer_pattern())
    ffn += moe ? double(c.moe_ffn_size()) * c.moe_router_topk +
                     double(c.moe_shared_expert_intermediate_size)
               : double(c.ffn_size());
  ffn /= L;
  return 12.0 * double(global_batch) * s * L * h * h *
         ((1.0 + groups / heads + s / h) * q_ratio + (ffn / h) * gated +
          double(c.padded_vocab_size()) / (2.0 * L * h));
}

}  // namespace omni
