// Context parallelism's split of a sequence: 2*cp chunks of seq/(2*cp) tokens, rank r
// holding chunks r and 2*cp-1-r (so every rank has the same share of causal attention
// work), and the slicing of a micro-batch into a rank's part.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/micro_batch.h"

namespace omni {

// The index in the full sequence of row `local` (0 .. local_seq-1) of context-parallel rank
// `rank` of `cp`, where local_seq = seq / cp.
inline int context_parallel_index(int local, int local_seq, int cp, int rank) {
  const int half = local_seq / 2;
  return local < half ? rank * half + local : (2 * cp - 1 - rank) * half + (local - half);
}

// A rank's share of a micro-batch: its rows of tokens, labels, loss mask, positions and
// first keys, with each row's index in the full sequence.
class ContextParallelBatch {
 public:
  // `full` is the whole micro-batch [batch, seq]; seq must divide by 2 * cp.
  void slice(const MicroBatch& full, int cp, int rank);
  const MicroBatch& batch() const { return mb_; }
  void set_loss_divisor(double d) { mb_.loss_divisor = d; }

 private:
  std::vector<int32_t> tokens_, labels_, positions_, key_start_, seq_index_;
  std::vector<float> loss_mask_;
  MicroBatch mb_;
};

}  // namespace omni
