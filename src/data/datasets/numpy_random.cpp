#include "data/datasets/numpy_random.h"

namespace omni {

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  // The smallest 2^b - 1 that covers max.
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffu) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (next_uint64() & mask)) > max) {
    }
  }
  return value;
}

}  // namespace omni
