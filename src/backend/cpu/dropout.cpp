// Dropout on the CPU: the reference for the GPU kernels, which draw the same masks
// (backend/dropout_mask.h).
#include <algorithm>
#include <cmath>

#include "backend/cpu/dropout_words.h"
#include "backend/cpu/reduce.h"
#include "backend/dropout_mask.h"
#include "backend/ops.h"
#include "base/error.h"

namespace omni::ops {

DropoutKey dropout_key(double p, uint64_t seed, int64_t iteration, int layer, DropoutSite site) {
  OMNI_REQUIRE(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  DropoutKey k;
  k.p = p;
  k.threshold = uint32_t(std::min<int64_t>(std::llround(p * 4294967296.0), 0xFFFFFFFF));
  // One Philox block of (iteration, layer, site) under the seed: distinct sites and
  // iterations get unrelated keys.
  const uint64_t it = uint64_t(iteration);
  const dropout::Block b = dropout::philox(uint32_t(it), uint32_t(it >> 32), uint32_t(layer),
                                           uint32_t(site), uint32_t(seed), uint32_t(seed >> 32));
  k.key[0] = b.w[0], k.key[1] = b.w[1];
  return k;
}

template <typename T>
void dropout(T* x, int rows, int width, int seq, const DropoutKey& k) {
  if (!k.active()) return;
  const T scale = T(k.scale());
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const int64_t n = k.first_row + r;
    const int64_t sample = k.first_sample + n / seq;
    const int64_t pos = dropout::sequence_position(int(n % seq), seq, k.cp, k.cp_rank);
    T* row = x + size_t(r) * width;
    dropout::for_each_word_run(k, sample, uint64_t(pos) * uint64_t(width), width,
                               [&](int64_t at, int64_t count, const uint32_t* w) {
                                 T* y = row + at;
#pragma omp simd
                                 for (int64_t c = 0; c < count; ++c)
                                   y[c] = w[c] >= k.threshold ? y[c] * scale : T(0);
                               });
  }
}

#define INSTANTIATE(T) template void dropout<T>(T*, int, int, int, const DropoutKey&);
OMNI_INSTANTIATE_FLOAT_DOUBLE(INSTANTIATE)

}  // namespace omni::ops
