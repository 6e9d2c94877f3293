/// @file dtype.h
/// @brief Element types: f64, f32, bf16, f16 (stored as 16 bits), i32 (token ids).
#pragma once

#include <cstddef>
#include <cstdint>
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
bf16 float_to_bf16(float value);
/// Exact.
float bf16_to_float(bf16 value);
/// Rounds to nearest even; overflow gives infinity, tiny values become subnormal or zero.
f16 float_to_f16(float value);
/// Exact.
float f16_to_float(f16 value);

/// The C++ type that stores one element of a DType (bf16 and f16 as the structs above).
template <DType D>
struct StorageType;
// One specialization per DType: f64 -> double, f32 -> float, bf16 -> bf16, f16 -> f16,
// i32 -> std::int32_t.
/// @cond
template <>
struct StorageType<DType::f64> { using type = double; };
template <>
struct StorageType<DType::f32> { using type = float; };
template <>
struct StorageType<DType::bf16> { using type = bf16; };
template <>
struct StorageType<DType::f16> { using type = f16; };
template <>
struct StorageType<DType::i32> { using type = std::int32_t; };
/// @endcond

/// The DType whose storage is T (double, float, bf16, f16, int32_t).
template <typename T>
constexpr DType dtype_of();
// One specialization per storage type, the inverse of StorageType.
/// @cond
template <>
constexpr DType dtype_of<double>() { return DType::f64; }
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <>
constexpr DType dtype_of<f16>() { return DType::f16; }
template <>
constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
/// @endcond

}  // namespace dtp
