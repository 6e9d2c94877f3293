/// @file mixed_precision.h
/// @brief Chapter 07 contract: mixed precision. 7.1 is the two 16-bit
/// formats themselves: converting an f32 to bf16 and to f16 by hand, with
/// round-to-nearest-even, subnormals, overflow to infinity and NaN kept NaN,
/// and back.
///
/// A 16-bit value is passed as its bit pattern (std::uint16_t), an f32 as a
/// float; std::bit_cast<std::uint32_t>(x) gives an f32's 32 bits.
///
/// | format | sign | exponent (bias) | mantissa | largest finite | smallest normal | epsilon |
/// |---|---|---|---|---|---|---|
/// | f32  | 1 | 8 (127) | 23 | 3.4e38 | 2^-126 | 2^-23 |
/// | bf16 | 1 | 8 (127) | 7  | 3.39e38 | 2^-126 | 2^-7 |
/// | f16  | 1 | 5 (15)  | 10 | 65504 | 2^-14 | 2^-10 |
///
/// See chapters/07_mixed_precision/README.md.
#pragma once

#include <cstdint>

namespace dtp::ch07 {

/// 7.1 The bf16 nearest to @p x, as its 16 bits. bf16 is the top half of
/// an f32, so this is the top 16 bits of x after rounding away the low 16:
/// to nearest, and on an exact tie to the even one (the one whose lowest
/// kept bit is 0). A value that rounds past the largest finite bf16 becomes
/// infinity with its sign. f32 subnormals round like any other value. A NaN
/// stays a NaN with its sign (rounding must not carry its mantissa into the
/// exponent and make it an infinity).
std::uint16_t f32_to_bf16_bits(float x);

/// 7.1 The f32 equal to the bf16 with bits @p bits (always exact).
float bf16_bits_to_f32(std::uint16_t bits);

/// 7.1 The f16 nearest to @p x, as its 16 bits: 1 sign bit, 5 exponent bits
/// (bias 15), 10 mantissa bits. Rounding to nearest, ties to even. Normal
/// f16 values are [2^-14, 65504]; below 2^-14 the exponent field is 0 and
/// the value is mantissa x 2^-24 (subnormal), so |x| below 2^-25 rounds to
/// 0 (exactly 2^-25 is a tie and goes to the even 0). |x| that rounds to
/// 65536 or more (|x| >= 65520) becomes infinity with its sign. Infinity
/// stays infinity; a NaN stays a NaN with its sign.
std::uint16_t f32_to_f16_bits(float x);

/// 7.1 The f32 equal to the f16 with bits @p bits (always exact: subnormal
/// f16 values become normal f32 values).
float f16_bits_to_f32(std::uint16_t bits);

}  // namespace dtp::ch07
