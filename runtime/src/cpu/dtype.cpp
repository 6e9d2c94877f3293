#include "dtp/dtype.h"

#include <cmath>
#include <cstring>

#include "dtp/error.h"

namespace dtp {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i32}) {
    if (name == dtype_name(d)) return d;
  }
  DTP_CHECK(false, "unknown dtype '", name, "': expected one of f64, f32, bf16, f16, i32");
  return DType::f32;
}

bool is_floating(DType dtype) { return dtype != DType::i32; }

namespace {
std::uint32_t float_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
float bits_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
}  // namespace

bf16 float_to_bf16(float value) {
  std::uint32_t bits = float_bits(value);
  if (std::isnan(value)) return bf16{static_cast<std::uint16_t>((bits >> 16) | 0x40)};
  // Round to nearest even on the 16 bits that are dropped.
  std::uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return bf16{static_cast<std::uint16_t>((bits + rounding) >> 16)};
}

float bf16_to_float(bf16 value) { return bits_float(static_cast<std::uint32_t>(value.bits) << 16); }

f16 float_to_f16(float value) {
  std::uint32_t bits = float_bits(value);
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

float f16_to_float(f16 value) {
  std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000) << 16;
  std::uint32_t exponent = (value.bits >> 10) & 0x1F;
  std::uint32_t mantissa = value.bits & 0x3FF;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    float magnitude = static_cast<float>(mantissa) / 16777216.0f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return bits_float(sign | 0x7F800000 | (mantissa << 13));
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace dtp
