// Model FLOPs per iteration by Megatron-LM's formula (training.py,
// num_floating_point_operations): forward + backward (x3), multiply-adds (x2), and the
// logits layer; attention counted as full (not causal) as Megatron counts it.
#pragma once

#include <cstdint>

#include "model/transformer_config.h"

namespace omni {

inline double megatron_flops_per_iteration(const TransformerConfig& c, int64_t global_batch) {
  const double h = c.hidden_size, s = c.seq_length, L = c.num_layers;
  const double heads = c.num_attention_heads, groups = c.query_groups();
  const double q_ratio = double(c.head_dim()) * heads / h;
  const double gated = c.swiglu ? 1.5 : 1.0;
  return 12.0 * double(global_batch) * s * L * h * h *
         ((1.0 + groups / heads + s / h) * q_ratio + (double(c.ffn_size()) / h) * gated +
          double(c.padded_vocab_size()) / (2.0 * L * h));
}

}  // namespace omni
