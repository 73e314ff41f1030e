// Element types of stored tensors, and exact conversions between them: the one dtype of host
// code, the GPU kernels (backend/gpu/, built as CUDA, HIP or emulated, all C++20) and Tensor.
//
// The scalar conversions are constexpr and use only integer operations on the bit patterns, so
// they round the same way (nearest, ties to even) whatever the caller's floating-point flags:
// a kernel compiled with -ffast-math may call them and still keep NaN, infinities and signed
// zeros intact. They are host and device functions (OMNI_HOST_DEVICE) and use builtins the
// three compilers share instead of <bit>, whose functions are host-only for nvcc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define OMNI_HOST_DEVICE __host__ __device__
#else
#define OMNI_HOST_DEVICE
#endif

namespace omni {

enum class DType : uint8_t { F32, BF16, F16, F64 };

size_t dtype_size(DType t);
// "f32", "bf16", "f16", "f64". Inline: the GPU library names types too, and links without
// the core library's objects.
inline const char* dtype_name(DType t) {
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
  return "invalid dtype";
}
// Accepts f32/fp32/float32, bf16/bfloat16, f16/fp16/float16, f64/float64; throws UsageError.
DType parse_dtype(std::string_view name);

// 16-bit floating-point storage as bit patterns, in host memory and on the GPU alike;
// arithmetic is always in float (to_float, from_float below).
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

// Storage that is 16 bits wide (bf16, f16): the model computes with it, but keeps its
// gradients and per-row statistics in float (backend/ops.h's contract).
template <typename T>
inline constexpr bool is_16bit = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
// The type of a storage type's parameter gradients and statistics: float for 16-bit storage,
// the type itself for float and double.
template <typename T>
using accum_t = std::conditional_t<is_16bit<T>, float, T>;

// The DType of an element type (Tensor::data<T>, the GEMM's operand types).
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::F32;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return DType::BF16;
  } else if constexpr (std::is_same_v<T, f16>) {
    return DType::F16;
  } else {
    static_assert(std::is_same_v<T, double>, "dtype_of<T>: T is float, bf16, f16 or double");
    return DType::F64;
  }
}

OMNI_HOST_DEVICE constexpr uint32_t float_bits(float f) {
  return __builtin_bit_cast(uint32_t, f);
}
OMNI_HOST_DEVICE constexpr float bits_float(uint32_t u) {
  return __builtin_bit_cast(float, u);
}

// bfloat16 is the top half of a float, so rounding is "add just under half an ulp, plus the lsb
// of the kept part (ties to even), and truncate". The carry may run into the exponent, which is
// exactly right: it bumps to the next binade or, from the largest finite value, to infinity.
OMNI_HOST_DEVICE constexpr uint16_t f32_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncating could clear every payload bit and leave an infinity, so force the quiet bit.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

OMNI_HOST_DEVICE constexpr float bf16_to_f32(uint16_t h) {
  return bits_float(uint32_t{h} << 16);
}

OMNI_HOST_DEVICE constexpr uint16_t f32_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    // NaN: keep sign and the top payload bits; the quiet bit keeps it from reading as infinity.
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x01ffu));
  }
  // 65520 is halfway between 65504 (largest half, odd significand) and 2^16; ties go to even,
  // i.e. to infinity, so everything from there up (including inf itself) overflows.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    // Normal half (|f| >= 2^-14): rebias the exponent 127 -> 15, then round 23 -> 10 mantissa
    // bits as in f32_to_bf16; a carry into the exponent field is again the correct result.
    uint32_t r = a - (uint32_t{127 - 15} << 23);
    r += 0x0fffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal half: the result counts units of 2^-24. With the implicit bit, the float is
  // m * 2^(e-150), i.e. m >> (126 - e) units. Below 2^-25 (e < 102) even the rounding is zero;
  // 2^-25 itself is the tie between 0 and 1 unit and goes to 0.
  const uint32_t e = a >> 23;
  if (e < 102) return sign;
  const uint32_t m = (a & 0x007fffffu) | 0x00800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1u))) ++q;  // q == 0x400 is the smallest normal: fine
  return static_cast<uint16_t>(sign | q);
}

OMNI_HOST_DEVICE constexpr float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x03ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e != 0) return bits_float(sign | ((e + (127 - 15)) << 23) | (m << 13));
  if (m == 0) return bits_float(sign);
  // Subnormal half m * 2^-24 is a normal float: move the leading bit p of m to the implicit
  // position, giving exponent p - 24.
  uint32_t p = 9;
  while ((m >> p) == 0) --p;
  return bits_float(sign | ((p + 127 - 24) << 23) | ((m << (23 - p)) & 0x007fffffu));
}

// The value types' conversions, for code generic over the element type T (float, bf16, f16).
OMNI_HOST_DEVICE constexpr float to_float(float x) {
  return x;
}
OMNI_HOST_DEVICE constexpr float to_float(bf16 x) {
  return bf16_to_f32(x.bits);
}
OMNI_HOST_DEVICE constexpr float to_float(f16 x) {
  return f16_to_f32(x.bits);
}
template <typename T>
OMNI_HOST_DEVICE constexpr T from_float(float f);
template <>
OMNI_HOST_DEVICE constexpr float from_float<float>(float f) {
  return f;
}
template <>
OMNI_HOST_DEVICE constexpr bf16 from_float<bf16>(float f) {
  return bf16{f32_to_bf16(f)};
}
template <>
OMNI_HOST_DEVICE constexpr f16 from_float<f16>(float f) {
  return f16{f32_to_f16(f)};
}

// Converts n elements. Each output is the input's exact value rounded once (nearest, ties to
// even); NaN stays NaN. Same-type "conversion" copies the bits.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace omni
