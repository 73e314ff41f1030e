// Small statistics the benchmarks print: the median of repeated measurements.
#pragma once

#include <algorithm>
#include <vector>

namespace omni::bench {

// The middle value; of an even count, the mean of the two middle ones.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace omni::bench
