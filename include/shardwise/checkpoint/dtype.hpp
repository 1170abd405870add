#pragma once
// The element types a safetensors file may hold and shardwise reads: their names in the header, their sizes,
// the C++ type of each, and the conversions between the 16-bit floats and float.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace shardwise {

static_assert(std::endian::native == std::endian::little,
              "shardwise::checkpoint: safetensors files are little-endian and shardwise reads them in place; a "
              "big-endian host is not supported");

/// The dtypes of the safetensors format that shardwise reads and writes.
enum class dtype : std::uint8_t { F64, F32, F16, BF16, I64, I32, U8, BOOL };

inline constexpr dtype all_dtypes[] = {dtype::F64, dtype::F32, dtype::F16, dtype::BF16,
                                       dtype::I64, dtype::I32, dtype::U8,  dtype::BOOL};

/// The name in the header ("F32", "BF16", ...).
[[nodiscard]] constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::F64:
      return "F64";
    case dtype::F32:
      return "F32";
    case dtype::F16:
      return "F16";
    case dtype::BF16:
      return "BF16";
    case dtype::I64:
      return "I64";
    case dtype::I32:
      return "I32";
    case dtype::U8:
      return "U8";
    case dtype::BOOL:
      return "BOOL";
  }
  return "?";
}

/// Bytes per element.
[[nodiscard]] constexpr std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::F64:
    case dtype::I64:
      return 8;
    case dtype::F32:
    case dtype::I32:
      return 4;
    case dtype::F16:
    case dtype::BF16:
      return 2;
    case dtype::U8:
    case dtype::BOOL:
      return 1;
  }
  return 0;
}

[[nodiscard]] constexpr bool is_floating(dtype t) {
  return t == dtype::F64 || t == dtype::F32 || t == dtype::F16 || t == dtype::BF16;
}

/// The dtype named `name`, or nothing for a name shardwise does not read.
[[nodiscard]] constexpr std::optional<dtype> parse_dtype(std::string_view name) {
  for (dtype t : all_dtypes)
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

/// A 16-bit float (IEEE binary16) held as its bits; read them into float with to_float.
struct float16 {
  std::uint16_t bits;  ///< The IEEE binary16 bits.
};
/// A bfloat16 held as its bits (the top 16 bits of a float); read them into float with to_float.
struct bfloat16 {
  std::uint16_t bits;  ///< The bfloat16 bits.
};

namespace detail {
template <class T>
struct dtype_for_type;  // no definition: shardwise stores no other element type
template <>
struct dtype_for_type<double> : std::integral_constant<dtype, dtype::F64> {};
template <>
struct dtype_for_type<float> : std::integral_constant<dtype, dtype::F32> {};
template <>
struct dtype_for_type<float16> : std::integral_constant<dtype, dtype::F16> {};
template <>
struct dtype_for_type<bfloat16> : std::integral_constant<dtype, dtype::BF16> {};
template <>
struct dtype_for_type<std::int64_t> : std::integral_constant<dtype, dtype::I64> {};
template <>
struct dtype_for_type<std::int32_t> : std::integral_constant<dtype, dtype::I32> {};
template <>
struct dtype_for_type<std::uint8_t> : std::integral_constant<dtype, dtype::U8> {};
template <>
struct dtype_for_type<bool> : std::integral_constant<dtype, dtype::BOOL> {};
}  // namespace detail

/// Element types with a safetensors dtype: double, float, float16, bfloat16, int64_t, int32_t, uint8_t, bool.
template <class T>
concept safetensors_element = requires { detail::dtype_for_type<std::remove_cv_t<T>>::value; };

template <safetensors_element T>
inline constexpr dtype dtype_of = detail::dtype_for_type<std::remove_cv_t<T>>::value;

/// binary16 to float, exactly (every binary16 value is a float).
[[nodiscard]] constexpr float to_float(float16 h) {
  std::uint32_t const sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  std::uint32_t exponent = (h.bits >> 10) & 0x1Fu;
  std::uint32_t mantissa = h.bits & 0x3FFu;
  std::uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // infinity or NaN (payload kept)
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else if (mantissa == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal: shift the mantissa up until its leading one becomes the implicit bit.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return std::bit_cast<float>(bits);
}

/// float to binary16, rounded to nearest, ties to even; overflow gives infinity, NaN stays NaN.
[[nodiscard]] constexpr float16 to_float16(float f) {
  std::uint32_t const bits = std::bit_cast<std::uint32_t>(f);
  auto const sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  std::uint32_t const exponent = (bits >> 23) & 0xFFu;
  std::uint32_t const mantissa = bits & 0x7FFFFFu;
  if (exponent == 0xFF)  // infinity or NaN (a quiet NaN keeps a non-zero mantissa)
    return {static_cast<std::uint16_t>(sign | 0x7C00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u))};
  int const e = static_cast<int>(exponent) - 127 + 15;
  if (e >= 31) return {static_cast<std::uint16_t>(sign | 0x7C00u)};
  std::uint32_t full;  // the significand with its implicit bit
  int shift;           // how far to shift it right to reach the 10-bit binary16 field
  std::uint32_t base;  // the exponent field of the result
  if (e <= 0) {        // subnormal or zero in binary16
    if (e < -10) return {sign};
    full = mantissa | 0x800000u;
    shift = 14 - e;
    base = 0;
  } else {
    full = mantissa;
    shift = 13;
    base = static_cast<std::uint32_t>(e) << 10;
  }
  std::uint32_t result = base + (full >> shift);
  std::uint32_t const rest = full & ((1u << shift) - 1);
  std::uint32_t const half = 1u << (shift - 1);
  if (rest > half || (rest == half && (result & 1u))) ++result;  // a carry may raise the exponent: correct
  return {static_cast<std::uint16_t>(sign | result)};
}

[[nodiscard]] constexpr float to_float(bfloat16 b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16);
}

/// float to bfloat16, rounded to nearest, ties to even; NaN stays NaN.
[[nodiscard]] constexpr bfloat16 to_bfloat16(float f) {
  std::uint32_t const bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return {static_cast<std::uint16_t>((bits >> 16) | 0x40u)};
  std::uint32_t const rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return {static_cast<std::uint16_t>((bits + rounding) >> 16)};
}

}  // namespace shardwise
