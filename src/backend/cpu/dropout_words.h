// Dropout's Philox words on the CPU, many blocks at a time: the words of a run of consecutive
// elements (backend/dropout_mask.h's rule) computed 16 Philox blocks per pass in a loop the
// compiler runs in vector lanes, then handed to the caller's loop over the run, which it can
// vectorise too. One block per four elements, one at a time, cost the CPU several times more
// (dropout was about a tenth of a GPT-2 step).
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/dropout_mask.h"

namespace omni::dropout {

// Calls f(offset, count, words) over [first, first + n) of sample `sample`'s elements in
// order: words[m] is the Philox word of element first + offset + m.
template <typename F>
inline void for_each_word_run(const ops::DropoutKey& k, int64_t sample, uint64_t first, int64_t n,
                              F&& f) {
  constexpr int kBlocks = 16;
  const uint32_t s0 = uint32_t(uint64_t(sample)), s1 = uint32_t(uint64_t(sample) >> 32);
  const uint32_t k0 = k.key[0], k1 = k.key[1];
  alignas(64) uint32_t w[4 * kBlocks];
  const uint64_t end = first + uint64_t(n);
  for (uint64_t e = first; e < end;) {
    const uint64_t b0 = e >> 2;
#pragma omp simd
    for (int l = 0; l < kBlocks; ++l) {
      const uint64_t b = b0 + uint64_t(l);
      const Block blk = philox(uint32_t(b), uint32_t(b >> 32), s0, s1, k0, k1);
      w[4 * l] = blk.w[0], w[4 * l + 1] = blk.w[1], w[4 * l + 2] = blk.w[2],
            w[4 * l + 3] = blk.w[3];
    }
    const uint64_t stop = std::min(end, (b0 + kBlocks) * 4);
    f(int64_t(e - first), int64_t(stop - e), w + (e - 4 * b0));
    e = stop;
  }
}

}  // namespace omni::dropout
