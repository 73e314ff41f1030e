// Conversions are checked against a deliberately naive reference: narrow-format values decoded
// from their bit fields with ldexp, and rounding done by finding the two neighbouring
// representable values in a sorted table and comparing distances in double (exact here, see
// round_ref), ties going to the even bit pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"

namespace omni {
namespace {

struct Format {
  int mant_bits;
  int exp_bits;
  uint16_t inf_bits() const { return static_cast<uint16_t>(((1u << exp_bits) - 1) << mant_bits); }
};
constexpr Format kF16{10, 5};
constexpr Format kBf16{7, 8};

// Value of a non-negative, non-NaN bit pattern from its fields. The infinity pattern, read as
// if its exponent were ordinary, gives 2^(emax+1): the value IEEE rounding compares against.
double decode_ref(uint32_t bits, Format f) {
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const int e = static_cast<int>(bits >> f.mant_bits);
  const double m = static_cast<double>(bits & ((1u << f.mant_bits) - 1));
  if (e == 0) return std::ldexp(m, 1 - bias - f.mant_bits);
  return std::ldexp(m + std::ldexp(1.0, f.mant_bits), e - bias - f.mant_bits);
}

// All non-negative finite values, index == bit pattern, plus the infinity stand-in at the end.
std::vector<double> value_table(Format f) {
  std::vector<double> values(f.inf_bits() + 1u);
  for (uint32_t b = 0; b < values.size(); ++b) values[b] = decode_ref(b, f);
  return values;
}

const std::vector<double>& table(Format f) {
  static const std::vector<double> f16 = value_table(kF16);
  static const std::vector<double> bf16 = value_table(kBf16);
  return f.exp_bits == kF16.exp_bits ? f16 : bf16;
}

// Nearest-even rounding of a non-NaN double. The two distances are exact: lo <= x < hi and
// hi <= 2 lo (or lo == 0), so both subtractions are of nearby values (Sterbenz) or trivial.
uint16_t round_ref(double x, Format f) {
  const auto& values = table(f);
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(x);
  if (ax >= values.back()) return sign | f.inf_bits();
  const auto lo =
      static_cast<size_t>(std::upper_bound(values.begin(), values.end(), ax) - values.begin() - 1);
  const double below = ax - values[lo], above = values[lo + 1] - ax;
  const size_t pick = below < above ? lo : above < below ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
  return static_cast<uint16_t>(sign | pick);
}

double narrow_to_double_ref(uint16_t h, Format f) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const uint32_t mag = h & 0x7fffu;
  if (mag == f.inf_bits()) return sign * std::numeric_limits<double>::infinity();
  if (mag > f.inf_bits()) return std::numeric_limits<double>::quiet_NaN();
  return sign * decode_ref(mag, f);
}

float from_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}
uint32_t bits_of(float f) {
  return std::bit_cast<uint32_t>(f);
}
bool is_nan16(uint16_t h, Format f) {
  return (h & f.inf_bits()) == f.inf_bits() && (h & ((1u << f.mant_bits) - 1)) != 0;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_STREQ(dtype_name(DType::F32), "f32");
  EXPECT_STREQ(dtype_name(DType::BF16), "bf16");
  EXPECT_STREQ(dtype_name(DType::F16), "f16");
  EXPECT_STREQ(dtype_name(DType::F64), "f64");
}

TEST(DType, ParseAcceptsEveryDocumentedSpelling) {
  for (const char* s : {"f32", "fp32", "float32"}) EXPECT_EQ(parse_dtype(s), DType::F32) << s;
  for (const char* s : {"bf16", "bfloat16"}) EXPECT_EQ(parse_dtype(s), DType::BF16) << s;
  for (const char* s : {"f16", "fp16", "float16"}) EXPECT_EQ(parse_dtype(s), DType::F16) << s;
  for (const char* s : {"f64", "float64"}) EXPECT_EQ(parse_dtype(s), DType::F64) << s;
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  }
}

TEST(DType, ParseRejectsOtherNamesAndListsTheAcceptedOnes) {
  for (const char* s : {"", "float", "half", "F32", "bf 16", "int8", "f32 "}) {
    try {
      parse_dtype(s);
      ADD_FAILURE() << "accepted '" << s << "'";
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("'") + s + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("bfloat16"), std::string::npos) << msg;
    }
  }
}

TEST(DType, Bf16RoundTripsEveryBitPatternThroughF32) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t back = f32_to_bf16(bf16_to_f32(static_cast<uint16_t>(h)));
    if (is_nan16(static_cast<uint16_t>(h), kBf16)) {
      ASSERT_TRUE(is_nan16(back, kBf16)) << std::hex << h;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(DType, F16RoundTripsEveryBitPatternThroughF32) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t back = f32_to_f16(f16_to_f32(static_cast<uint16_t>(h)));
    if (is_nan16(static_cast<uint16_t>(h), kF16)) {
      ASSERT_TRUE(is_nan16(back, kF16)) << std::hex << h;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(DType, NarrowToF32MatchesLdexpOfTheBitFieldsForEveryPattern) {
  for (Format f : {kF16, kBf16}) {
    for (uint32_t h = 0; h <= 0xffff; ++h) {
      const auto h16 = static_cast<uint16_t>(h);
      const float got = f.exp_bits == kF16.exp_bits ? f16_to_f32(h16) : bf16_to_f32(h16);
      const double want = narrow_to_double_ref(h16, f);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << std::hex << h;
        ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
      } else {
        // Compare bits, not values, so that -0 is told apart from +0.
        ASSERT_EQ(std::bit_cast<uint64_t>(static_cast<double>(got)), std::bit_cast<uint64_t>(want))
            << std::hex << h << " exp_bits " << f.exp_bits;
      }
    }
  }
}

// Every 251st float bit pattern (251 is prime, so every exponent and low-bit pattern is hit).
void check_sampled_floats(Format f, uint16_t (*convert_one)(float)) {
  size_t mismatches = 0;
  uint32_t first_bad = 0;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 251) {
    const float x = from_bits(static_cast<uint32_t>(u));
    const uint16_t got = convert_one(x);
    const bool ok = std::isnan(x) ? is_nan16(got, f) && (got & 0x8000) == ((u >> 16) & 0x8000)
                                  : got == round_ref(x, f);
    if (!ok && mismatches++ == 0) first_bad = static_cast<uint32_t>(u);
  }
  EXPECT_EQ(mismatches, 0u) << "first bad input bits 0x" << std::hex << first_bad;
}

TEST(DType, F32ToF16MatchesReferenceOnSampledFloats) {
  check_sampled_floats(kF16, f32_to_f16);
}

TEST(DType, F32ToBf16MatchesReferenceOnSampledFloats) {
  check_sampled_floats(kBf16, f32_to_bf16);
}

// Every midpoint between neighbouring values (including the one between the largest finite
// value and the overflow point), and the floats just either side of it, in both signs.
void check_every_tie(Format f, uint16_t (*convert_one)(float)) {
  const auto& values = table(f);
  for (uint32_t lo = 0; lo + 1 < values.size(); ++lo) {
    const double mid = (values[lo] + values[lo + 1]) / 2;
    const auto tie = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(tie), mid) << "midpoint not a float at " << lo;
    const uint16_t even = static_cast<uint16_t>(lo % 2 == 0 ? lo : lo + 1);
    ASSERT_EQ(convert_one(tie), even) << std::hex << "tie above 0x" << lo;
    ASSERT_EQ(convert_one(-tie), even | 0x8000) << std::hex << "tie above 0x" << lo;
    for (float x : {std::nextafter(tie, 0.0f), std::nextafter(tie, INFINITY)}) {
      ASSERT_EQ(convert_one(x), round_ref(x, f)) << std::hex << "near tie 0x" << bits_of(x);
      ASSERT_EQ(convert_one(-x), round_ref(-x, f)) << std::hex << "near tie 0x" << bits_of(x);
    }
  }
}

TEST(DType, F32ToF16RoundsEveryTieToEven) {
  check_every_tie(kF16, f32_to_f16);
}

TEST(DType, F32ToBf16RoundsEveryTieToEven) {
  check_every_tie(kBf16, f32_to_bf16);
}

TEST(DType, F32ToF16BoundaryCases) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);  // largest finite half
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);  // below the overflow midpoint
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // midpoint: ties to even = infinity
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(FLT_MAX), 0x7c00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // half of it: tie, even is zero
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);  // 1.5 units: tie, up to even
  EXPECT_EQ(f32_to_f16(0x1.4p-23f), 0x0002);  // 2.5 units: tie, down to even
  EXPECT_EQ(f32_to_f16(-0x1p-30f), 0x8000);   // underflow keeps the sign
  EXPECT_EQ(f32_to_f16(0x1p-149f), 0x0000);   // float subnormal
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(0x3ffp-24f), 0x03ff);           // largest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // rounds out of the subnormal range
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);  // tie, down to even
  EXPECT_EQ(f32_to_f16(1.0f + 0x3p-11f), 0x3c02);  // tie, up to even
  EXPECT_EQ(f32_to_f16(2.0f - 0x1p-12f), 0x4000);  // carry into the exponent
}

TEST(DType, F32ToBf16BoundaryCases) {
  EXPECT_EQ(f32_to_bf16(FLT_MAX), 0x7f80);  // above the overflow midpoint
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fff)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f8000)), 0x7f80);  // midpoint, 0x7f7f odd: infinity
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, down to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, up to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x00000001)), 0x0000);  // float subnormals
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000)), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008001)), 0x0001);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);
  EXPECT_EQ(f32_to_bf16(from_bits(0x007fffff)), 0x0080);  // rounds up to the smallest normal
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

TEST(DType, NaNStaysQuietNaNWithItsSign) {
  // 0x7f800001 is the classic trap: a payload only in bits that truncation drops.
  for (uint32_t u : {0x7f800001u, 0x7f801fffu, 0x7fc00000u, 0x7fffffffu, 0x7fa00000u, 0xff800001u,
                     0xffc00000u, 0xffffe000u}) {
    const float x = from_bits(u);
    const uint16_t sign = (u >> 16) & 0x8000;
    const uint16_t h = f32_to_f16(x), b = f32_to_bf16(x);
    EXPECT_TRUE(is_nan16(h, kF16) && (h & 0x0200) && (h & 0x8000) == sign) << std::hex << u;
    EXPECT_TRUE(is_nan16(b, kBf16) && (b & 0x0040) && (b & 0x8000) == sign) << std::hex << u;
  }
}

TEST(DType, ScalarConversionsAreUsableInConstantExpressions) {
  static_assert(f32_to_f16(1.0f) == 0x3c00);
  static_assert(f16_to_f32(0x0001) == 0x1p-24f);
  static_assert(f32_to_bf16(-2.0f) == 0xc000);
  static_assert(bf16_to_f32(0x3f80) == 1.0f);
  // The value types (shared with the GPU kernels) and dtype_of.
  static_assert(to_float(bf16{0xbf80}) == -1.0f && to_float(f16{0x8001}) == -0x1p-24f);
  static_assert(from_float<bf16>(1.0f).bits == 0x3f80 && from_float<f16>(65520.0f).bits == 0x7c00);
  static_assert(dtype_of<float>() == DType::F32 && dtype_of<bf16>() == DType::BF16 &&
                dtype_of<f16>() == DType::F16 && dtype_of<double>() == DType::F64);
  static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2 && alignof(bf16) == 2);
}

// The value types are the same bits as the uint16_t conversions, for every pattern both ways.
TEST(DType, ValueTypesConvertLikeTheBitPatternFunctions) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto b = static_cast<uint16_t>(h);
    ASSERT_EQ(bits_of(to_float(bf16{b})), bits_of(bf16_to_f32(b))) << std::hex << h;
    ASSERT_EQ(bits_of(to_float(f16{b})), bits_of(f16_to_f32(b))) << std::hex << h;
    ASSERT_EQ(dtype_size(dtype_of<bf16>()), sizeof(bf16));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(static_cast<uint32_t>(rng()));
    ASSERT_EQ(from_float<bf16>(x).bits, f32_to_bf16(x)) << x;
    ASSERT_EQ(from_float<f16>(x).bits, f32_to_f16(x)) << x;
    ASSERT_EQ(bits_of(from_float<float>(x)), bits_of(x));
  }
}

// f16 subnormals m * 2^-24 are normal floats: the integer normalisation must give exactly the
// product (what the GPU kernels computed before they shared this header).
TEST(DType, F16SubnormalsWidenToTheirExactValue) {
  for (uint16_t m = 1; m < 0x400; ++m) {
    const float want = std::ldexp(static_cast<float>(m), -24);
    ASSERT_EQ(bits_of(f16_to_f32(m)), bits_of(want)) << m;
    ASSERT_EQ(bits_of(f16_to_f32(static_cast<uint16_t>(0x8000u | m))), bits_of(-want)) << m;
  }
}

// --- convert() ---

constexpr DType kAllTypes[] = {DType::F32, DType::BF16, DType::F16, DType::F64};

// Stores the reference rounding of x in type t; returns the raw bytes.
void store_ref(double x, DType t, unsigned char* p) {
  if (t == DType::F64) {
    std::memcpy(p, &x, 8);
  } else if (t == DType::F32) {
    const auto f = static_cast<float>(x);  // one hardware rounding of a double: correct
    std::memcpy(p, &f, 4);
  } else {
    const Format f = t == DType::F16 ? kF16 : kBf16;
    const auto quiet_nan = static_cast<uint16_t>(f.inf_bits() | 1u << (f.mant_bits - 1));
    const uint16_t h = std::isnan(x) ? quiet_nan : round_ref(x, f);
    std::memcpy(p, &h, 2);
  }
}

template <typename T>
T read_as(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

double load_ref(DType t, const unsigned char* p) {
  if (t == DType::F64) return read_as<double>(p);
  if (t == DType::F32) return read_as<float>(p);
  return narrow_to_double_ref(read_as<uint16_t>(p), t == DType::F16 ? kF16 : kBf16);
}

TEST(DType, ConvertRoundsOnceFromTheExactValueForEveryPair) {
  // clang-format off
  const double values[] = {
      0.0, -0.0, 1.0, -1.5, 3.14159265358979, 1.0 / 3,
      65504.0, 65519.0, 65520.0, 1e6, 3.4e38, 1e39, -1e300,         // f16/f32 overflow
      0x1p-24, 0x1p-25, 0x1.8p-24, 1e-30, 1e-45, 1e-310,            // subnormals, underflow
      1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8 + 0x1p-40,              // double-rounding traps
      INFINITY, -INFINITY, NAN};
  // clang-format on
  const size_t n = std::size(values);
  for (DType src : kAllTypes) {
    std::vector<unsigned char> in(n * dtype_size(src));
    for (size_t i = 0; i < n; ++i) store_ref(values[i], src, &in[i * dtype_size(src)]);
    for (DType dst : kAllTypes) {
      std::vector<unsigned char> out(n * dtype_size(dst)), want(n * dtype_size(dst));
      convert(in.data(), src, out.data(), dst, n);
      for (size_t i = 0; i < n; ++i) {
        const double exact = load_ref(src, &in[i * dtype_size(src)]);
        store_ref(exact, dst, &want[i * dtype_size(dst)]);
        const double got = load_ref(dst, &out[i * dtype_size(dst)]);
        if (std::isnan(exact)) {
          EXPECT_TRUE(std::isnan(got)) << dtype_name(src) << "->" << dtype_name(dst);
        } else {
          EXPECT_EQ(0, std::memcmp(&out[i * dtype_size(dst)], &want[i * dtype_size(dst)],
                                   dtype_size(dst)))
              << dtype_name(src) << "->" << dtype_name(dst) << " value " << values[i] << " got "
              << got;
        }
      }
    }
  }
}

TEST(DType, ConvertFromF64RoundsOnceNotViaF32) {
  // Via f32 these land exactly on a tie and go to even; the true value is above the tie.
  const double x[] = {1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-11 - 0x1p-40, 1.0 + 0x1p-8 + 0x1p-40};
  uint16_t h[3], b[3];
  convert(x, DType::F64, h, DType::F16, 3);
  convert(x, DType::F64, b, DType::BF16, 3);
  EXPECT_EQ(h[0], 0x3c01);
  EXPECT_EQ(h[1], 0x3c00);
  EXPECT_EQ(b[2], 0x3f81);

  // Random doubles near every kind of tie, and anywhere, against the reference.
  std::mt19937_64 rng(12345);
  std::vector<double> xs;
  for (Format f : {kF16, kBf16}) {
    const auto& values = table(f);
    for (int i = 0; i < 100000; ++i) {
      const size_t lo = rng() % (values.size() - 1);
      const double mid = (values[lo] + values[lo + 1]) / 2;
      const double nudge =
          std::ldexp(static_cast<double>(static_cast<int64_t>(rng() % 2001) - 1000),
                     std::ilogb(mid == 0 ? 1.0 : mid) - 45);
      xs.push_back((rng() & 1) ? -(mid + nudge) : mid + nudge);
    }
  }
  for (int i = 0; i < 100000; ++i) {
    const double d = std::bit_cast<double>(rng());
    if (!std::isnan(d)) xs.push_back(d);
  }
  std::vector<uint16_t> h16(xs.size()), b16(xs.size());
  convert(xs.data(), DType::F64, h16.data(), DType::F16, xs.size());
  convert(xs.data(), DType::F64, b16.data(), DType::BF16, xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(h16[i], round_ref(xs[i], kF16)) << std::hexfloat << xs[i];
    ASSERT_EQ(b16[i], round_ref(xs[i], kBf16)) << std::hexfloat << xs[i];
  }
}

TEST(DType, ConvertToTheSameTypeCopiesBitsIncludingSignallingNaN) {
  const uint32_t in[] = {0x7f800001u, 0x80000000u, 0x3f800000u};
  uint32_t out[3] = {};
  convert(in, DType::F32, out, DType::F32, 3);
  EXPECT_EQ(0, std::memcmp(in, out, sizeof in));
}

}  // namespace
}  // namespace omni
