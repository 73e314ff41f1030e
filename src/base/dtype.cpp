#include "base/dtype.h"

#include <bit>
#include <cstring>
#include <type_traits>

#include "base/error.h"

namespace omni {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::F64:
      return 8;
  }
  OMNI_CHECK(false, "[dtype_size] invalid DType value ", static_cast<int>(t));
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::F16;
  if (name == "f64" || name == "float64") return DType::F64;
  throw UsageError(detail::concat("unknown dtype '", name,
                                  "' (expected one of f32/fp32/float32, bf16/bfloat16, "
                                  "f16/fp16/float16, f64/float64)"));
}

namespace {

// Rounding a double to f32 and then to f16/bf16 is double rounding, and can be wrong:
// 1 + 2^-11 + 2^-40 becomes the f32 tie 1 + 2^-11, which then goes to even (1.0) instead of up.
// Rounding to f32 *to odd* first (truncate, then set the lsb if anything was dropped) keeps the
// "was it above the tie" information in the last bit; a later nearest-even rounding to at most
// 24 - 2 bits is then the correctly rounded result (Boldo & Melquiond, "When double rounding is
// odd", 2005). Done on the bits so it holds under any floating-point flags.
uint32_t f64_to_f32_bits_round_to_odd(double d) {
  const auto u = std::bit_cast<uint64_t>(d);
  const auto sign = static_cast<uint32_t>(u >> 32) & 0x80000000u;
  const uint64_t a = u & 0x7fffffffffffffffull;
  if (a >= 0x7ff0000000000000ull) {
    if (a == 0x7ff0000000000000ull) return sign | 0x7f800000u;
    return sign | 0x7fc00000u | static_cast<uint32_t>((a >> 29) & 0x003fffffu);  // quiet NaN
  }
  const int f32_exp = static_cast<int>(a >> 52) - 1023 + 127;
  // Beyond the f32 range truncation gives the largest finite float, whose lsb is already odd;
  // the narrow formats overflow to infinity from it, as they should.
  if (f32_exp >= 255) return sign | 0x7f7fffffu;
  if (f32_exp >= 1) {
    const auto mant = static_cast<uint32_t>((a >> 29) & 0x007fffffu);
    const uint32_t sticky = (a & 0x1fffffffu) != 0 ? 1u : 0u;
    return sign | (static_cast<uint32_t>(f32_exp) << 23) | mant | sticky;
  }
  // f32 subnormal range: counts units of 2^-149. Far below it only the sticky bit survives.
  const int shift = 29 + 1 - f32_exp;
  if (shift >= 64) return sign | (a != 0 ? 1u : 0u);
  const uint64_t mant = (a & 0x000fffffffffffffull) | ((a >> 52) != 0 ? (1ull << 52) : 0);
  const auto kept = static_cast<uint32_t>(mant >> shift);
  const uint32_t sticky = (mant & ((1ull << shift) - 1)) != 0 ? 1u : 0u;
  return sign | kept | sticky;
}

// The element types are dtype_of's: float, bf16, f16, double. Every narrower type widens
// exactly, so a conversion is "widen to Wide, round once to D"; Wide is double only when a side
// is f64, to keep the common f32<->bf16 path in floats.
template <typename T>
constexpr bool kHalf = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <typename Wide, typename T>
Wide widen(T v) {
  if constexpr (kHalf<T>)
    return static_cast<Wide>(to_float(v));
  else
    return static_cast<Wide>(v);
}

template <typename D, typename Wide>
D narrow(Wide v) {
  if constexpr (std::is_same_v<Wide, double> && kHalf<D>)
    return from_float<D>(std::bit_cast<float>(f64_to_f32_bits_round_to_odd(v)));
  else if constexpr (kHalf<D>)
    return from_float<D>(v);
  else
    return static_cast<D>(v);
}

template <typename S, typename D>
void convert_typed(const void* src, void* dst, size_t n) {
  using Wide =
      std::conditional_t<std::is_same_v<S, double> || std::is_same_v<D, double>, double, float>;
  const auto* in = static_cast<const S*>(src);
  auto* out = static_cast<D*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = narrow<D, Wide>(widen<Wide>(in[i]));
}

template <typename S>
void convert_from(const void* src, void* dst, DType dst_type, size_t n) {
  switch (dst_type) {
    case DType::F32:
      return convert_typed<S, float>(src, dst, n);
    case DType::BF16:
      return convert_typed<S, bf16>(src, dst, n);
    case DType::F16:
      return convert_typed<S, f16>(src, dst, n);
    case DType::F64:
      return convert_typed<S, double>(src, dst, n);
  }
  OMNI_CHECK(false, "[convert] invalid destination DType ", static_cast<int>(dst_type));
}

}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (n == 0) return;
  if (src_type == dst_type) {
    std::memmove(dst, src, n * dtype_size(src_type));
    return;
  }
  switch (src_type) {
    case DType::F32:
      return convert_from<float>(src, dst, dst_type, n);
    case DType::BF16:
      return convert_from<bf16>(src, dst, dst_type, n);
    case DType::F16:
      return convert_from<f16>(src, dst, dst_type, n);
    case DType::F64:
      return convert_from<double>(src, dst, dst_type, n);
  }
  OMNI_CHECK(false, "[convert] invalid source DType ", static_cast<int>(src_type));
}

}  // namespace omni
