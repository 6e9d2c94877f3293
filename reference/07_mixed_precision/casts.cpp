// Reference for 7.1: f32 <-> bf16 and f32 <-> f16 by bit manipulation.
//
// Rounding to nearest, ties to even, on an integer significand: to drop the
// low k bits of m, add (half - 1) plus the lowest kept bit, then shift. Below
// half never carries; above half always does; exactly half carries only when
// the kept part is odd, which makes it even. A carry out of the kept bits is
// the next binade: with the exponent stored just above the mantissa, the
// same add increments the exponent, and past the largest finite value it
// lands exactly on the infinity pattern.
#include <bit>
#include <cmath>
#include <cstdint>

#include "07_mixed_precision/mixed_precision.h"

namespace dtp::ch07 {

namespace {

// m with its low k bits rounded away to nearest even (k >= 1), shifted down.
constexpr std::uint32_t round_off(std::uint32_t m, int k) {
  if (k >= 32) return 0;  // everything is dropped: below half of the smallest kept unit
  const std::uint32_t half = 1u << (k - 1), kept_lsb = (m >> k) & 1u;
  // 64 bits: m + half may pass 2^32 for k near 32.
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(m) + (half - 1) + kept_lsb) >> k);
}

}  // namespace

std::uint16_t f32_to_bf16_bits(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  // A NaN's mantissa could round up into the exponent and read as infinity:
  // keep the top half and force the quiet bit instead.
  if (std::isnan(x)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  // The sign is above the exponent, so rounding the magnitude bits in place
  // is the same as rounding the absolute value.
  const std::uint32_t sign = bits & 0x80000000u;
  return static_cast<std::uint16_t>((sign >> 16) | round_off(bits & 0x7FFFFFFFu, 16));
}

float bf16_bits_to_f32(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t f32_to_f16_bits(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const int field = static_cast<int>((bits >> 23) & 0xFFu);
  const std::uint32_t mantissa = bits & 0x7FFFFFu;
  if (field == 0xFF) return static_cast<std::uint16_t>(sign | (mantissa != 0 ? 0x7E00u : 0x7C00u));
  if (field == 0) return sign;  // f32 zero or subnormal (< 2^-126): far below f16's 2^-25
  const int e = field - 127;    // x = m x 2^(e - 23)
  const std::uint32_t m = 0x800000u | mantissa;                    // 24-bit significand
  if (e >= 16) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 2^16: past 65504
  if (e >= -14) {
    // Normal: exponent field e + 15 above 10 mantissa bits; the significand
    // keeps 11 bits (its leading 1 lands on the exponent's lowest bit, which
    // is why the field is e + 14 plus that bit). A carry from rounding moves
    // into the exponent; from 65520 up it reaches 0x7C00, infinity.
    const std::uint32_t kept = round_off(m, 13);  // 11 bits, or 2^11 after a carry
    return static_cast<std::uint16_t>(sign | ((static_cast<std::uint32_t>(e + 14) << 10) + kept));
  }
  // Subnormal: value = kept x 2^-24, kept = m x 2^(e - 23 + 24) rounded. A
  // carry to 2^10 is the smallest normal, whose pattern is the same number.
  return static_cast<std::uint16_t>(sign | round_off(m, -1 - e));
}

float f16_bits_to_f32(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t field = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  if (field == 0x1F)
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (field == 0) {  // zero or subnormal: mantissa x 2^-24, a normal f32 unless zero
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((field - 15 + 127) << 23) | (mantissa << 13));
}

}  // namespace dtp::ch07
