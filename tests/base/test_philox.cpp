#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/error.h"
#include "base/philox.h"

namespace omni {
namespace {

using Words4 = std::array<uint32_t, 4>;
using Words2 = std::array<uint32_t, 2>;

// The first three are Random123's tests/kat_vectors lines for philox4x32 10; the last two are
// from the longer generated list distributed with the Random123 manual (examples/kat_vectors).
struct KnownAnswer {
  Words4 counter;
  Words2 key;
  Words4 expected;
};
constexpr KnownAnswer kRandom123Vectors[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    {{1, 0, 0, 0}, {1, 0}, {0xac08141b, 0xdfc5ccbe, 0x79c07a47, 0xa7f66093}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0x00000000, 0xffffffff},
     {0x08f7720c, 0x845ee9e0, 0x502ccd3d, 0xa9a00e27}},
};

TEST(Philox, MatchesRandom123KnownAnswerVectors) {
  for (const auto& v : kRandom123Vectors) {
    EXPECT_EQ(philox4x32_10(v.counter, v.key), v.expected) << std::hex << v.counter[0];
  }
  static_assert(philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5);
}

TEST(Philox, NameHashIsFnv1a64) {
  // Published FNV-1a 64-bit test vectors.
  EXPECT_EQ(name_hash(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(name_hash("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(name_hash("foobar"), 0x85944171f73967e8ull);
}

// The definition a GPU initialiser must reproduce: element 2k and 2k+1 of tensor `name` come
// from Philox block k with counter (k, name_hash) and key seed, as the Box-Muller pair.
TEST(FillNormal, ElementIsBoxMullerOfItsPhiloxBlock) {
  const uint64_t seed = 0x0123456789abcdefull;
  const uint64_t h = name_hash("layers.0.attn.wq");
  std::vector<double> got(10);
  fill_normal(got.data(), got.size(), seed, "layers.0.attn.wq", 1000, 0.0, 1.0);
  for (uint64_t i = 1000; i < 1010; ++i) {
    const uint64_t k = i / 2;
    const auto w = philox4x32_10({uint32_t(k), uint32_t(k >> 32), uint32_t(h), uint32_t(h >> 32)},
                                 {uint32_t(seed), uint32_t(seed >> 32)});
    const uint64_t a = uint64_t{w[1]} << 32 | w[0], b = uint64_t{w[3]} << 32 | w[2];
    const double u1 = static_cast<double>((a >> 11) + 1) * 0x1p-53;  // (0, 1]
    const double u2 = static_cast<double>(b >> 11) * 0x1p-53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1)), t = 2.0 * std::numbers::pi * u2;
    EXPECT_EQ(got[i - 1000], i % 2 == 0 ? r * std::cos(t) : r * std::sin(t)) << i;
  }
}

TEST(FillNormal, ValuesDoNotDependOnHowTheRangeIsSplit) {
  const size_t n = 1000;
  std::vector<float> whole(n), pieces(n);
  fill_normal(whole.data(), n, 42, "w", 7, 0.0, 0.02);
  // Ragged pieces, starting at odd and even global indices.
  for (size_t begin = 0, len = 1; begin < n; begin += len, len = len * 3 % 97 + 1) {
    const size_t m = std::min(len, n - begin);
    fill_normal(pieces.data() + begin, m, 42, "w", 7 + begin, 0.0, 0.02);
  }
  EXPECT_EQ(whole, pieces);
}

TEST(FillNormal, ValuesDoNotDependOnThreadCount) {
#ifndef _OPENMP
  GTEST_SKIP() << "built without OpenMP";
#else
  const size_t n = (size_t{1} << 18) + 3;  // several parallel chunks, ragged end
  const int saved = omp_get_max_threads();
  std::vector<float> results[3];
  for (int i = 0; i < 3; ++i) {
    omp_set_num_threads(1 << i);
    results[i].resize(n);
    fill_normal(results[i].data(), n, 9, "embedding", 12345, 0.0, 1.0);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
#endif
}

TEST(FillNormal, FloatValuesAreTheRoundedDoubleValues) {
  std::vector<float> f(257);
  std::vector<double> d(257);
  fill_normal(f.data(), f.size(), 3, "x", 1, 0.5, 2.0);
  fill_normal(d.data(), d.size(), 3, "x", 1, 0.5, 2.0);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], static_cast<float>(d[i])) << i;
}

TEST(FillNormal, MeanAndStddevScaleTheStandardValues) {
  std::vector<double> z(64), scaled(64);
  fill_normal(z.data(), z.size(), 5, "b", 0, 0.0, 1.0);
  fill_normal(scaled.data(), scaled.size(), 5, "b", 0, 3.0, 0.25);
  for (size_t i = 0; i < z.size(); ++i) EXPECT_EQ(scaled[i], 3.0 + 0.25 * z[i]) << i;
  EXPECT_THROW(fill_normal(z.data(), z.size(), 5, "b", 0, 0.0, -1.0), UsageError);
}

TEST(FillNormal, DifferentNamesOrSeedsGiveDifferentValues) {
  const size_t n = 256;
  std::vector<double> a(n), b(n), c(n);
  fill_normal(a.data(), n, 1, "layers.0.mlp.w1", 0, 0.0, 1.0);
  fill_normal(b.data(), n, 1, "layers.0.mlp.w2", 0, 0.0, 1.0);
  fill_normal(c.data(), n, 2, "layers.0.mlp.w1", 0, 0.0, 1.0);
  size_t same_ab = 0, same_ac = 0;
  for (size_t i = 0; i < n; ++i) {
    same_ab += a[i] == b[i];
    same_ac += a[i] == c[i];
  }
  EXPECT_EQ(same_ab, 0u);
  EXPECT_EQ(same_ac, 0u);
}

TEST(FillNormal, MillionSamplesHaveMeanZeroAndUnitStddev) {
  const size_t n = 1000000;
  std::vector<double> z(n);
  fill_normal(z.data(), n, 2024, "stats", 0, 0.0, 1.0);
  double sum = 0, sum_sq = 0;
  for (double v : z) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum_sq += v * v;
  }
  const double mean = sum / n;
  const double stddev = std::sqrt(sum_sq / n - mean * mean);
  // Standard errors are 0.001 (mean) and 0.0007 (stddev): these bounds are 5+ sigma.
  EXPECT_LT(std::fabs(mean), 0.005);
  EXPECT_LT(std::fabs(stddev - 1.0), 0.005);
}

TEST(FillUniform, ValuesLieInRangeWithTheExpectedMeanAndIgnoreSplitting) {
  const size_t n = 100001;
  std::vector<double> u(n), tail(n - 500);
  fill_uniform(u.data(), n, 11, "u", 3, -2.0, 6.0);
  fill_uniform(tail.data(), tail.size(), 11, "u", 503, -2.0, 6.0);
  double sum = 0;
  for (double v : u) {
    ASSERT_GE(v, -2.0);
    ASSERT_LT(v, 6.0);
    sum += v;
  }
  EXPECT_NEAR(sum / n, 2.0, 0.04);  // stddev of the mean is 8/sqrt(12 n) = 0.0073
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), u.begin() + 500));
}

TEST(PhiloxStream, WordsAreThePhiloxBlocksOfItsSeedAndStream) {
  const uint64_t seed = 0xfeedface12345678ull, stream = 7;
  PhiloxStream s(seed, stream);
  for (uint32_t block = 0; block < 3; ++block) {
    const auto w = philox4x32_10({block, 0, uint32_t(stream), uint32_t(stream >> 32)},
                                 {uint32_t(seed), uint32_t(seed >> 32)});
    for (uint32_t word : w) EXPECT_EQ(s.next_u32(), word);
  }
}

TEST(PhiloxStream, DifferentStreamsGiveDifferentSequences) {
  PhiloxStream a(1, 0), b(1, 1);
  int same = 0;
  for (int i = 0; i < 64; ++i) same += a.next_u32() == b.next_u32();
  EXPECT_LT(same, 2);
}

TEST(PhiloxStream, NextBelowStaysInRangeAndIsRoughlyUniform) {
  PhiloxStream s(99, 3);
  constexpr uint64_t kBuckets = 10;
  constexpr int kDraws = 100000;
  std::array<int, kBuckets> counts{};
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t v = s.next_below(kBuckets);
    ASSERT_LT(v, kBuckets);
    ++counts[v];
  }
  // Expected 10000 each, sigma about 95.
  for (int c : counts) EXPECT_NEAR(c, kDraws / kBuckets, 500);
  // A bound that is not a power of two and rejects a large fraction: 2^63 + 1.
  const uint64_t big = (uint64_t{1} << 63) + 1;
  int upper_half = 0;
  for (int i = 0; i < 10000; ++i) {
    const uint64_t v = s.next_below(big);
    ASSERT_LT(v, big);
    upper_half += v >= big / 2;
  }
  EXPECT_NEAR(upper_half, 5000, 300);
  EXPECT_EQ(s.next_below(1), 0u);
}

TEST(PhiloxStream, NextDoubleIsInUnitIntervalAndNextNormalIsStandard) {
  PhiloxStream s(5, 5);
  double sum = 0, sum_sq = 0;
  constexpr int kDraws = 200000;
  for (int i = 0; i < kDraws; ++i) {
    const double u = s.next_double();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double z = s.next_normal();
    sum += z;
    sum_sq += z * z;
  }
  EXPECT_NEAR(sum / kDraws, 0.0, 0.012);     // 5 sigma
  EXPECT_NEAR(sum_sq / kDraws, 1.0, 0.016);  // 5 sigma (variance of z^2 is 2)
}

TEST(PhiloxStream, RestoredStateResumesTheExactSequence) {
  PhiloxStream s(123, 456);
  // Leave the stream at every position within a block before saving.
  for (int skip = 0; skip < 9; ++skip) {
    for (int i = 0; i < skip; ++i) s.next_u32();
    const PhiloxStream::State saved = s.state();
    PhiloxStream resumed(saved);
    EXPECT_EQ(resumed.state(), saved);
    for (int i = 0; i < 50; ++i) {
      ASSERT_EQ(s.next_u32(), resumed.next_u32());
      ASSERT_EQ(s.next_below(1000), resumed.next_below(1000));
      ASSERT_EQ(s.next_double(), resumed.next_double());
      ASSERT_EQ(s.next_normal(), resumed.next_normal());
    }
  }
}

TEST(PhiloxStream, RejectsASavedPositionPastTheBlock) {
  EXPECT_THROW(PhiloxStream(PhiloxStream::State{1, 2, 3, 5}), UsageError);
}

}  // namespace
}  // namespace omni
