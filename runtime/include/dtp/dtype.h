/// @file dtype.h
/// @brief Element types: f64, f32, bf16, f16 (stored as 16 bits), i32 (token ids).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace dtp {

/// The element type of a Tensor.
enum class DType { f64, f32, bf16, f16, i32 };

/// Bytes per element.
std::size_t dtype_size(DType dtype);
/// "f64", "f32", "bf16", "f16" or "i32".
const char* dtype_name(DType dtype);
/// Parses a name written by dtype_name(); throws dtp::Error on anything else.
DType parse_dtype(const std::string& name);
/// True for f64, f32, bf16 and f16.
bool is_floating(DType dtype);

/// bfloat16 storage: the top 16 bits of an IEEE float (8-bit exponent, 7-bit mantissa).
struct bf16 {
  std::uint16_t bits = 0;  ///< raw bit pattern (sign, exponent, mantissa); 0 is +0.0
};
/// IEEE half precision storage (5-bit exponent, 10-bit mantissa).
struct f16 {
  std::uint16_t bits = 0;  ///< raw bit pattern (sign, exponent, mantissa); 0 is +0.0
};

/// Rounds to nearest even; NaN stays NaN.
inline bf16 float_to_bf16(float value);
/// Exact.
inline float bf16_to_float(bf16 value);
/// Rounds to nearest even; overflow gives infinity, tiny values become subnormal or zero.
inline f16 float_to_f16(float value);
/// Exact.
inline float f16_to_float(f16 value);

// Defined here, inline, so that the conversion loops of the 16-bit ops
// compile to a few instructions per element instead of a call.
/// @cond
namespace detail {
inline std::uint32_t float_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
inline float bits_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
}  // namespace detail

inline bf16 float_to_bf16(float value) {
  std::uint32_t bits = detail::float_bits(value);
  if (std::isnan(value)) return bf16{static_cast<std::uint16_t>((bits >> 16) | 0x40)};
  // Round to nearest even on the 16 bits that are dropped.
  std::uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return bf16{static_cast<std::uint16_t>((bits + rounding) >> 16)};
}

inline float bf16_to_float(bf16 value) {
  return detail::bits_float(static_cast<std::uint32_t>(value.bits) << 16);
}

inline f16 float_to_f16(float value) {
  std::uint32_t bits = detail::float_bits(value);
  std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000);
  std::uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude >= 0x7F800000) {  // inf or NaN
    return f16{static_cast<std::uint16_t>(sign | 0x7C00 | (magnitude > 0x7F800000 ? 0x200 : 0))};
  }
  if (magnitude >= 0x477FF000) return f16{static_cast<std::uint16_t>(sign | 0x7C00)};  // overflow
  if (magnitude < 0x38800000) {
    // Subnormal half (or zero): scale into the 10-bit mantissa with rounding.
    float scaled = std::fabs(value) * 16777216.0f;  // 2^24 = 1 / smallest subnormal
    auto mantissa = static_cast<std::uint32_t>(std::nearbyint(scaled));
    return f16{static_cast<std::uint16_t>(sign | mantissa)};
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  std::uint32_t rebased = magnitude - 0x38000000;
  std::uint32_t rounding = 0xFFF + ((rebased >> 13) & 1);
  return f16{static_cast<std::uint16_t>(sign | ((rebased + rounding) >> 13))};
}

inline float f16_to_float(f16 value) {
  std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000) << 16;
  std::uint32_t exponent = (value.bits >> 10) & 0x1F;
  std::uint32_t mantissa = value.bits & 0x3FF;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    float magnitude = static_cast<float>(mantissa) / 16777216.0f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return detail::bits_float(sign | 0x7F800000 | (mantissa << 13));
  return detail::bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/// @endcond

/// The C++ type that stores one element of a DType (bf16 and f16 as the structs above).
template <DType D>
struct StorageType;
// One specialization per DType: f64 -> double, f32 -> float, bf16 -> bf16, f16 -> f16,
// i32 -> std::int32_t.
/// @cond
template <>
struct StorageType<DType::f64> {
  using type = double;
};
template <>
struct StorageType<DType::f32> {
  using type = float;
};
template <>
struct StorageType<DType::bf16> {
  using type = bf16;
};
template <>
struct StorageType<DType::f16> {
  using type = f16;
};
template <>
struct StorageType<DType::i32> {
  using type = std::int32_t;
};
/// @endcond

/// The DType whose storage is T (double, float, bf16, f16, int32_t).
template <typename T>
constexpr DType dtype_of();
// One specialization per storage type, the inverse of StorageType.
/// @cond
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
/// @endcond

}  // namespace dtp
