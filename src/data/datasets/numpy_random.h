// numpy's legacy RandomState (np.random.RandomState(seed)), the generator Megatron-Core uses
// to order documents and samples. Reproducing its stream bit for bit is what makes our sample
// order identical to Megatron's for the same --seed.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace omni {

class NumpyRandomState {
 public:
  // numpy's legacy seeding of a 32-bit integer is MT19937's init_genrand, as std::mt19937 does.
  explicit NumpyRandomState(uint32_t seed) : engine_(seed) {}

  uint32_t next_uint32() { return static_cast<uint32_t>(engine_()); }
  // numpy's mt19937 next_uint64: two 32-bit draws, the first one high.
  uint64_t next_uint64() {
    const uint64_t high = next_uint32();
    return (high << 32) | next_uint32();
  }

  // A uniform draw in [0, max] by masked rejection (numpy's random_interval; also what legacy
  // randint(0, max + 1) draws for int64).
  uint64_t random_interval(uint64_t max);

  // RandomState.shuffle of a 1-d array: Fisher-Yates from the end.
  template <typename T>
  void shuffle(std::span<T> values) {
    for (size_t i = values.size(); i-- > 1;) {
      const size_t j = static_cast<size_t>(random_interval(i));
      std::swap(values[i], values[j]);
    }
  }

 private:
  std::mt19937 engine_;
};

}  // namespace omni
