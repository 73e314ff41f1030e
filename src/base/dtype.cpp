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

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::F64:
      return "f64";
  }
  OMNI_CHECK(false, "[dtype_name] invalid DType value ", static_cast<int>(t));
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

template <DType T>
struct Storage;
template <>
struct Storage<DType::F32> {
  using type = float;
};
template <>
struct Storage<DType::BF16> {
  using type = uint16_t;
};
template <>
struct Storage<DType::F16> {
  using type = uint16_t;
};
template <>
struct Storage<DType::F64> {
  using type = double;
};

// Every narrower type widens exactly, so a conversion is "widen to Wide, round once to D";
// Wide is double only when a side is f64, to keep the common f32<->bf16 path in floats.
template <DType T, typename Wide>
Wide widen(typename Storage<T>::type v) {
  if constexpr (T == DType::BF16)
    return static_cast<Wide>(bf16_to_f32(v));
  else if constexpr (T == DType::F16)
    return static_cast<Wide>(f16_to_f32(v));
  else
    return static_cast<Wide>(v);
}

template <DType T, typename Wide>
typename Storage<T>::type narrow(Wide v) {
  if constexpr (std::is_same_v<Wide, double> && (T == DType::BF16 || T == DType::F16)) {
    const float odd = std::bit_cast<float>(f64_to_f32_bits_round_to_odd(v));
    return T == DType::BF16 ? f32_to_bf16(odd) : f32_to_f16(odd);
  } else if constexpr (T == DType::BF16) {
    return f32_to_bf16(v);
  } else if constexpr (T == DType::F16) {
    return f32_to_f16(v);
  } else {
    return static_cast<typename Storage<T>::type>(v);
  }
}

template <DType S, DType D>
void convert_typed(const void* src, void* dst, size_t n) {
  using Wide = std::conditional_t<S == DType::F64 || D == DType::F64, double, float>;
  const auto* in = static_cast<const typename Storage<S>::type*>(src);
  auto* out = static_cast<typename Storage<D>::type*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = narrow<D, Wide>(widen<S, Wide>(in[i]));
}

template <DType S>
void convert_from(const void* src, void* dst, DType dst_type, size_t n) {
  switch (dst_type) {
    case DType::F32:
      return convert_typed<S, DType::F32>(src, dst, n);
    case DType::BF16:
      return convert_typed<S, DType::BF16>(src, dst, n);
    case DType::F16:
      return convert_typed<S, DType::F16>(src, dst, n);
    case DType::F64:
      return convert_typed<S, DType::F64>(src, dst, n);
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
      return convert_from<DType::F32>(src, dst, dst_type, n);
    case DType::BF16:
      return convert_from<DType::BF16>(src, dst, dst_type, n);
    case DType::F16:
      return convert_from<DType::F16>(src, dst, dst_type, n);
    case DType::F64:
      return convert_from<DType::F64>(src, dst, dst_type, n);
  }
  OMNI_CHECK(false, "[convert] invalid source DType ", static_cast<int>(src_type));
}

}  // namespace omni
