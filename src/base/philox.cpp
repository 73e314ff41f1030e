#include "base/philox.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace omni {

namespace {

constexpr double kTwoPow53Inv = 1.0 / 9007199254740992.0;  // 2^-53

constexpr uint32_t lo32(uint64_t x) {
  return static_cast<uint32_t>(x);
}
constexpr uint32_t hi32(uint64_t x) {
  return static_cast<uint32_t>(x >> 32);
}

std::array<uint32_t, 4> block_at(uint64_t seed, uint64_t domain, uint64_t index) {
  return philox4x32_10({lo32(index), hi32(index), lo32(domain), hi32(domain)},
                       {lo32(seed), hi32(seed)});
}

constexpr uint64_t join64(uint32_t lo, uint32_t hi) {
  return uint64_t{hi} << 32 | lo;
}

// [0, 1) on the 2^53 grid: every value exact, 1.0 never reached.
constexpr double uniform_closed_open(uint64_t x) {
  return static_cast<double>(x >> 11) * kTwoPow53Inv;
}
// (0, 1] on the same grid: the argument of log() in Box-Muller, so log(0) cannot happen.
// (An open (0,1) grid of 2^53 points would need 54-bit values, which doubles cannot hold.)
constexpr double uniform_open_closed(uint64_t x) {
  return static_cast<double>((x >> 11) + 1) * kTwoPow53Inv;
}

struct Pair {
  double first, second;
};

Pair box_muller(uint64_t a, uint64_t b) {
  const double radius = std::sqrt(-2.0 * std::log(uniform_open_closed(a)));
  const double angle = 2.0 * std::numbers::pi * uniform_closed_open(b);
  return {radius * std::cos(angle), radius * std::sin(angle)};
}

// Elements 2k and 2k+1 share Philox block k. Each chunk handles a ragged start or end by
// computing the whole pair and keeping one half, so any split of [first, first + n) into calls
// or threads produces the same values.
template <typename T, typename PairAt>
void fill_by_pairs(T* out, size_t n, uint64_t first_index, const PairAt& pair_at) {
  auto fill_range = [&](size_t begin, size_t end) {
    size_t i = begin;
    if (i < end && ((first_index + i) & 1u)) {
      out[i] = static_cast<T>(pair_at((first_index + i) >> 1).second);
      ++i;
    }
    for (; i + 1 < end; i += 2) {
      const Pair p = pair_at((first_index + i) >> 1);
      out[i] = static_cast<T>(p.first);
      out[i + 1] = static_cast<T>(p.second);
    }
    if (i < end) out[i] = static_cast<T>(pair_at((first_index + i) >> 1).first);
  };

  // Below this a parallel region costs more than it saves.
  constexpr size_t kChunk = size_t{1} << 14;
  if (n <= kChunk) {
    fill_range(0, n);
    return;
  }
  const auto chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunk;
    fill_range(begin, std::min(n, begin + kChunk));
  }
}

}  // namespace

template <typename T>
void fill_normal(T* out, size_t n, uint64_t seed, std::string_view name, uint64_t first_index,
                 double mean, double stddev) {
  OMNI_REQUIRE(stddev >= 0.0, "[fill_normal] stddev must be >= 0 for '", name, "', got ", stddev);
  const uint64_t domain = name_hash(name);
  fill_by_pairs(out, n, first_index, [&](uint64_t k) {
    const auto w = block_at(seed, domain, k);
    const Pair z = box_muller(join64(w[0], w[1]), join64(w[2], w[3]));
    return Pair{mean + stddev * z.first, mean + stddev * z.second};
  });
}

template <typename T>
void fill_uniform(T* out, size_t n, uint64_t seed, std::string_view name, uint64_t first_index,
                  double lo, double hi) {
  OMNI_REQUIRE(lo <= hi, "[fill_uniform] need lo <= hi for '", name, "', got [", lo, ", ", hi, ")");
  const uint64_t domain = name_hash(name);
  const double width = hi - lo;
  fill_by_pairs(out, n, first_index, [&](uint64_t k) {
    const auto w = block_at(seed, domain, k);
    return Pair{lo + width * uniform_closed_open(join64(w[0], w[1])),
                lo + width * uniform_closed_open(join64(w[2], w[3]))};
  });
}

template void fill_normal<float>(float*, size_t, uint64_t, std::string_view, uint64_t, double,
                                 double);
template void fill_normal<double>(double*, size_t, uint64_t, std::string_view, uint64_t, double,
                                  double);
template void fill_uniform<float>(float*, size_t, uint64_t, std::string_view, uint64_t, double,
                                  double);
template void fill_uniform<double>(double*, size_t, uint64_t, std::string_view, uint64_t, double,
                                   double);

PhiloxStream::PhiloxStream(uint64_t seed, uint64_t stream)
    : seed_(seed), stream_(stream), counter_(0), position_(0) {
  load_block();
}

PhiloxStream::PhiloxStream(const State& state)
    : seed_(state.seed), stream_(state.stream), counter_(state.counter), position_(state.position) {
  OMNI_REQUIRE(state.position <= 4, "[PhiloxStream] saved position must be 0..4, got ",
               state.position);
  load_block();
}

void PhiloxStream::load_block() {
  block_ = block_at(seed_, stream_, counter_);
}

uint32_t PhiloxStream::next_u32() {
  if (position_ == 4) {
    ++counter_;
    position_ = 0;
    load_block();
  }
  return block_[position_++];
}

uint64_t PhiloxStream::next_u64() {
  const uint32_t lo = next_u32();
  return join64(lo, next_u32());
}

double PhiloxStream::next_double() {
  return uniform_closed_open(next_u64());
}

uint64_t PhiloxStream::next_below(uint64_t n) {
  OMNI_CHECK(n > 0, "[PhiloxStream::next_below] n must be positive");
  // Reject the lowest 2^64 mod n values so that what remains is a whole number of copies of
  // [0, n); the expected number of draws is below 2 for every n.
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t x = next_u64();
    if (x >= threshold) return x % n;
  }
}

double PhiloxStream::next_normal() {
  const uint64_t a = next_u64();
  return box_muller(a, next_u64()).first;
}

}  // namespace omni
