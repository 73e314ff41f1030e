// One micro-batch as the model and the parallel code see it: host arrays of tokens, labels
// and the masks of packed documents, with what context parallelism adds.
#pragma once

#include <cstdint>

namespace omni {

// One micro-batch: tokens and labels are [batch, seq]; loss_mask may be null (all ones).
// For documents packed into one sample (Megatron's --reset-position-ids and
// --reset-attention-mask), position_ids [batch, seq] restart at each document and row i
// attends only keys key_start[i] .. i of its sample; null means 0..seq-1 and 0 .. i.
// Under context parallelism seq is this rank's share of the sequence, seq_index [batch,
// seq] gives each row's index in the full sequence (keys are indexed the same way), and
// position_ids must be given.
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* labels = nullptr;
  const float* loss_mask = nullptr;
  int batch = 0, seq = 0;
  const int32_t* position_ids = nullptr;
  const int32_t* key_start = nullptr;
  const int32_t* seq_index = nullptr;
  // What the loss's token sum is divided by: 0, the micro-batch's own (unmasked) token
  // count, i.e. its mean loss; under --calculate-per-token-loss, the tokens of the whole
  // global batch, so the micro-batches' losses add up to Megatron's per-token loss.
  double loss_divisor = 0;
  // Output, optional: each token's loss (-log p(label)) [batch, seq], 0 where the mask is 0
  // (downstream tasks' log-likelihoods). Filled by the stage that computes the loss.
  float* token_losses = nullptr;
  // Dropout's key (backend/dropout_mask.h): the global index of the first sequence (so that
  // data-parallel ranks and micro-batches draw different masks) and the training iteration.
  int64_t first_sample = 0;
  int64_t iteration = 0;
};

}  // namespace omni
