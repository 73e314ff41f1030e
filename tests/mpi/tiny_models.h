// The tiny models the multi-rank tests train: GPT-2 (learned positions, LayerNorm, GELU,
// tied embeddings, which two pipeline stages then both hold) and Llama (rope, RMSNorm,
// SwiGLU, grouped-query attention, untied), on mock data with 8 layers so that every
// layout of up to 8 ranks fits.
#pragma once

#include <stdexcept>
#include <string>

inline std::string tiny_model_flags(const std::string& model, int train_iters) {
  const std::string common =
      "--mock-data --vocab-size 64 --num-layers 8 --hidden-size 32 --seq-length 16 "
      "--micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --log-interval 1 "
      "--eval-interval 0 --eval-iters 0 --make-vocab-size-divisible-by 8 --seed 5 "
      "--max-new-tokens 0 --no-progress --train-iters " +
      std::to_string(train_iters) + " ";
  if (model == "gpt2") return common + "--num-attention-heads 4";
  if (model == "llama")
    return common +
           "--num-attention-heads 8 --group-query-attention --num-query-groups 4 "
           "--normalization RMSNorm --swiglu --ffn-hidden-size 48 "
           "--position-embedding-type rope --disable-bias-linear "
           "--untie-embeddings-and-output-weights";
  // Llama layers, every other one (from layer 1) an MoE layer: four sigmoid-scored experts,
  // top-2, the aux-loss-free expert bias (its counts summed over data-parallel ranks), both
  // balancing losses and a shared expert.
  if (model == "moe")
    return common +
           "--num-attention-heads 8 --group-query-attention --num-query-groups 4 "
           "--normalization RMSNorm --swiglu --ffn-hidden-size 48 "
           "--position-embedding-type rope --disable-bias-linear "
           "--untie-embeddings-and-output-weights --num-experts 4 --moe-ffn-hidden-size 24 "
           "--moe-layer-freq [0,1,0,1,0,1,0,1] --moe-router-score-function sigmoid "
           "--moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01 "
           "--moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001 "
           "--moe-shared-expert-intermediate-size 16";
  // GPT-2 layers (linear biases, GELU), every other one an MoE layer of four sigmoid-scored
  // top-2 experts without a shared expert: the experts' biases. (With softmax scores a token's
  // near-tie of experts flips at TP 2 + SP in step 5, after which the loss drifts to 2e-5
  // relative; with sigmoid scores no step meets one: 1.2e-8.)
  if (model == "moe_gpt2")
    return common +
           "--num-attention-heads 4 --num-experts 4 --moe-ffn-hidden-size 24 "
           "--moe-layer-freq [0,1,0,1,0,1,0,1] --moe-router-score-function sigmoid "
           "--moe-aux-loss-coeff 0.01";
  // The MoE model with a multi-token prediction depth (an MoE layer, as its last layer is).
  // Its 20 steps meet near-ties of a token's top-2 experts that rounding flips, after which a
  // layout drifts from one rank (loss 4e-6 relative, parameters 2e-3): not a layout bug. Which
  // steps meet one depends on the loss weight and on the GEMM kernel's summation order (TP2+SP
  // flips at 0.3 and 0.15 under both OpenBLAS's and oneDNN's sgemm, at 0.2 under oneDNN's);
  // at 0.1 no layout does under either kernel (loss 2e-8, parameters 8e-6 of the largest).
  if (model == "moe_mtp")
    return tiny_model_flags("moe", train_iters) +
           " --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1";
  // A vocabulary each layout pads differently (to 72 rows on one rank, 80 at TP2, 96 at
  // TP4): the checkpoint holds the 72 rows whatever the layout.
  if (model == "gpt2_vocab70") return common + "--num-attention-heads 4 --vocab-size 70";
  throw std::invalid_argument("no tiny model " + model);
}
