#include "parallel/context_parallel.h"

#include "base/error.h"

namespace omni {

void ContextParallelBatch::slice(const MicroBatch& full, int cp, int rank) {
  OMNI_REQUIRE(full.seq % (2 * cp) == 0, "--seq-length (", full.seq,
               ") must be divisible by twice --context-parallel-size (", cp, ")");
  const int B = full.batch, S = full.seq, Sl = S / cp;
  const size_t n = size_t(B) * Sl;
  tokens_.resize(n);
  labels_.resize(full.labels ? n : 0);
  loss_mask_.resize(full.loss_mask ? n : 0);
  positions_.resize(n);
  key_start_.resize(full.key_start ? n : 0);
  seq_index_.resize(n);
  for (int b = 0; b < B; ++b)
    for (int l = 0; l < Sl; ++l) {
      const int s = context_parallel_index(l, Sl, cp, rank);
      const size_t i = size_t(b) * Sl + l, f = size_t(b) * S + s;
      tokens_[i] = full.tokens[f];
      if (full.labels) labels_[i] = full.labels[f];
      if (full.loss_mask) loss_mask_[i] = full.loss_mask[f];
      positions_[i] = full.position_ids ? full.position_ids[f] : s;
      if (full.key_start) key_start_[i] = full.key_start[f];
      seq_index_[i] = s;
    }
  mb_ = MicroBatch{tokens_.data(),
                   full.labels ? labels_.data() : nullptr,
                   full.loss_mask ? loss_mask_.data() : nullptr,
                   B,
                   Sl,
                   positions_.data(),
                   full.key_start ? key_start_.data() : nullptr,
                   seq_index_.data()};
  mb_.loss_divisor = full.loss_divisor;
  mb_.first_sample = full.first_sample, mb_.iteration = full.iteration;
}

}  // namespace omni
