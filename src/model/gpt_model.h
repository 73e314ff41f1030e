// GPTModel: a decoder-only transformer with an explicit forward and backward for every
// layer. Embedding -> num_layers x [norm, self-attention, residual, norm, MLP, residual]
// -> final norm -> output layer fused with cross-entropy. Which norm, MLP, position
// embedding, biases and attention grouping are used comes from TransformerConfig.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "model/parameters.h"
#include "model/transformer_config.h"

namespace omni {

// One micro-batch: tokens and labels are [batch, seq]; loss_mask may be null (all ones).
// For documents packed into one sample (Megatron's --reset-position-ids and
// --reset-attention-mask), position_ids [batch, seq] restart at each document and row i
// attends only keys key_start[i] .. i of its sample; null means 0..seq-1 and 0 .. i.
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* labels = nullptr;
  const float* loss_mask = nullptr;
  int batch = 0, seq = 0;
  const int32_t* position_ids = nullptr;
  const int32_t* key_start = nullptr;
};

template <typename T>
class GPTModel {
 public:
  // Allocates parameters and activation memory for micro-batches of up to
  // max_batch x config.seq_length tokens, and initialises the parameters from `seed`.
  GPTModel(const TransformerConfig& config, int max_batch, uint64_t seed);

  const TransformerConfig& config() const { return cfg_; }
  ParameterSet<T>& params() { return params_; }
  const ParameterSet<T>& params() const { return params_; }

  // Forward and backward of one micro-batch. Gradients of (grad_scale * mean masked loss)
  // are added to params().grads(). Returns the mean masked loss.
  double forward_backward(const MicroBatch& mb, double grad_scale);
  // Forward only; returns the mean masked loss.
  double forward_loss(const MicroBatch& mb);
  // Logits [batch * seq, vocab_size] of every position (for tests and tools; training
  // never materialises them).
  std::vector<T> forward_logits(const int32_t* tokens, int batch, int seq);
  // Logits [vocab_size] of the last position of a single sequence (batch 1).
  std::vector<float> next_token_logits(const int32_t* tokens, int seq);

 private:
  struct LayerActivations {
    Tensor ln1, ln1_mean, ln1_rstd;
    Tensor q, k, v;                                           // after qk-layernorm and rope
    Tensor q_raw, k_raw, qn_mean, qn_rstd, kn_mean, kn_rstd;  // qk-layernorm only
    Tensor probs, attn;
    Tensor mid;  // residual stream after attention
    Tensor ln2, ln2_mean, ln2_rstd;
    Tensor fc1, act;
  };
  struct LayerParams {
    T *ln1_w, *ln1_b, *qkv_w, *qkv_b, *qln_w, *qln_b, *kln_w, *kln_b;
    T *proj_w, *proj_b, *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
  };

  std::vector<ParamInfo> parameter_layout() const;
  LayerParams layer_params(int layer, bool grads) const;
  T* classifier_weight(bool grads) const;
  ops::AttentionDims attention_dims(const MicroBatch& mb) const;
  void check_batch(const MicroBatch& mb) const;
  void forward(const MicroBatch& mb);
  void backward(const MicroBatch& mb);
  // Norm over rows of width `width`: LayerNorm or RMSNorm per config.
  void norm_forward(T* out, T* mean, T* rstd, const T* x, const T* w, const T* b, int rows,
                    int width) const;
  void norm_backward(T* dx, T* dw, T* db, const T* dout, const T* x, const T* w, const T* mean,
                     const T* rstd, int rows, int width) const;

  TransformerConfig cfg_;
  int max_batch_;
  ParameterSet<T> params_;
  std::vector<double> rope_cos_, rope_sin_;
  std::vector<Tensor> residual_;  // num_layers + 1 residual streams [N, C]
  std::vector<LayerActivations> acts_;
  Tensor final_norm_, final_mean_, final_rstd_;
  // Scratch reused by every layer.
  Tensor qkv_, d_resid_, d_hidden_, d_ffn_, d_fc1_, d_attn_, dq_, dk_, dv_, dq_raw_, dk_raw_;
};

}  // namespace omni
