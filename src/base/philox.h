// Counter-based random numbers. A parameter's initial values are a pure function of
// (seed, parameter name, element index), so they do not change with the number of ranks or
// threads, with how a tensor is sharded, or with the order in which tensors are created.
//
// Layout of every Philox call here: key = the 64-bit seed; counter words 0-1 = the position
// (a block index), words 2-3 = the domain (the name's hash, or a PhiloxStream's stream id).
// Distinct (seed, domain, position) triples are thus distinct Philox inputs, never a lossy mix.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace omni {

// Philox4x32 with 10 rounds: Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as
// 1, 2, 3", SC'11. Matches the Random123 library's philox4x32_10 bit for bit.
constexpr std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                                std::array<uint32_t, 2> key) {
  constexpr uint64_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    const uint64_t p0 = kMul0 * counter[0];
    const uint64_t p1 = kMul1 * counter[2];
    counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(p0)};
  }
  return counter;
}

// FNV-1a, 64-bit: a fixed, documented function of the bytes, stable across platforms and
// releases (unlike std::hash), so checkpoints and reruns agree on every parameter's stream.
constexpr uint64_t name_hash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// out[i] = mean + stddev * N(0,1) for the element with global index first_index + i of tensor
// `name`. Box-Muller on the four words of one Philox block gives the pair of elements
// 2k and 2k+1 (cos and sin); uniforms have 53 random bits and log() never sees 0.
// Instantiated for float and double. Uses OpenMP for large n; results never depend on it.
template <typename T>
void fill_normal(T* out, size_t n, uint64_t seed, std::string_view name, uint64_t first_index,
                 double mean, double stddev);

// out[i] uniform in [lo, hi) for global index first_index + i (53-bit uniforms, two per block).
// For float, values within half a float ulp of hi may round to hi.
template <typename T>
void fill_uniform(T* out, size_t n, uint64_t seed, std::string_view name, uint64_t first_index,
                  double lo, double hi);

// A sequential generator for data sampling and shuffling. Its whole position is four integers
// (State), so a checkpoint can store it and a resumed run continues the exact sequence.
class PhiloxStream {
 public:
  struct State {
    uint64_t seed = 0;
    uint64_t stream = 0;
    uint64_t counter = 0;   // index of the current Philox block
    uint32_t position = 0;  // words of that block already used, 0..4
    bool operator==(const State&) const = default;
  };

  PhiloxStream(uint64_t seed, uint64_t stream);
  explicit PhiloxStream(const State& state);  // throws UsageError if position > 4

  State state() const { return {seed_, stream_, counter_, position_}; }

  uint32_t next_u32();
  uint64_t next_u64();              // two words, low word first
  double next_double();             // [0, 1), 53 random bits
  uint64_t next_below(uint64_t n);  // uniform in [0, n) without modulo bias; n > 0
  // N(0,1) by Box-Muller from two next_u64 draws; the sine half is dropped so that the state
  // stays four integers.
  double next_normal();

 private:
  void load_block();

  uint64_t seed_;
  uint64_t stream_;
  uint64_t counter_;
  uint32_t position_;
  std::array<uint32_t, 4> block_{};
};

}  // namespace omni
