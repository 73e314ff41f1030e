// Deterministic reductions over rows: the rows are cut into fixed blocks, each block
// sums into its own accumulator, and the blocks are added in order. The result is the
// same for any thread count, which keeps runs bit-reproducible.
#pragma once

#include <algorithm>
#include <vector>

namespace omni::cpu {

constexpr int kReduceBlockRows = 32;

// body(row_begin, row_end, acc) adds its rows' contributions into acc[0..width).
// The blocks' sums are then added into out[0..width).
template <typename T, typename Body>
void blocked_row_reduce(T* out, int rows, int width, Body&& body) {
  const int nblocks = (rows + kReduceBlockRows - 1) / kReduceBlockRows;
  std::vector<double> partial(static_cast<size_t>(nblocks) * width, 0.0);
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    int r0 = blk * kReduceBlockRows, r1 = std::min(rows, r0 + kReduceBlockRows);
    body(r0, r1, partial.data() + static_cast<size_t>(blk) * width);
  }
#pragma omp parallel for schedule(static)
  for (int c = 0; c < width; ++c) {
    double s = 0.0;
    for (int blk = 0; blk < nblocks; ++blk) s += partial[static_cast<size_t>(blk) * width + c];
    out[c] += static_cast<T>(s);
  }
}

}  // namespace omni::cpu

#define OMNI_INSTANTIATE_FLOAT_DOUBLE(MACRO) \
  MACRO(float)                               \
  MACRO(double)
