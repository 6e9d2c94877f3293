// Checkers for 7.1: f32 <-> bf16 and f32 <-> f16.
//
// The expected values come from arithmetic, not bits: the nearest value of
// the format is found by scaling x to an integer count of the format's units
// in the last place and rounding that to an integer (ties to even),
// in double, where every step is exact (std::rint in the default rounding
// mode, which the test never changes). The bits are then assembled from
// that value. A student's bit manipulation is compared with it.
//
// What is checked, for each direction of each format:
// - 16 bits -> f32: all 65536 patterns, exactly (NaN: a NaN with its sign).
// - f32 -> 16 bits: every one of the 65536 top halves of an f32 (every
//   sign, exponent and kept mantissa) with low halves on and around every
//   rounding boundary (exactly half, just below, just above, all zeros, all
//   ones), then 4 million random bit patterns. About 7 million inputs.
// Every wrong answer is counted; the first few are shown with what the
// wrong bits most likely mean.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "07_mixed_precision/mixed_precision.h"

namespace {

// 2^n for the exponents used here (|n| well inside double's normal range):
// faster than std::ldexp, and exact.
double pow2(int n) { return std::bit_cast<double>(static_cast<std::uint64_t>(n + 1023) << 52); }

// A 16-bit floating-point format: 1 sign bit, exponent bits, mantissa bits.
struct Format {
  const char* name;
  int exponent_bits;
  int mantissa_bits;
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  int min_exponent() const { return 1 - bias(); }  // of the smallest normal
  std::uint16_t infinity() const {
    return static_cast<std::uint16_t>(((1 << exponent_bits) - 1) << mantissa_bits);
  }
  std::uint16_t mantissa_mask() const {
    return static_cast<std::uint16_t>((1 << mantissa_bits) - 1);
  }
  double largest() const { return (2.0 - pow2(-mantissa_bits)) * pow2(bias()); }
};
constexpr Format kBf16{"bf16", 8, 7};
constexpr Format kF16{"f16", 5, 10};

bool is_nan_bits(std::uint16_t b, const Format& f) {
  return (b & f.infinity()) == f.infinity() && (b & f.mantissa_mask()) != 0;
}

// The value of a 16-bit pattern, by the definition (NaN for NaN patterns).
double decode(std::uint16_t b, const Format& f) {
  const double sign = (b & 0x8000u) ? -1.0 : 1.0;
  const int field = (b >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
  const int mantissa = b & f.mantissa_mask();
  if (field == (1 << f.exponent_bits) - 1)
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  if (field == 0) return sign * mantissa * pow2(f.min_exponent() - f.mantissa_bits);
  return sign * (1.0 + mantissa * pow2(-f.mantissa_bits)) * pow2(field - f.bias());
}

// The bits of a value the format holds exactly (or of an infinity).
std::uint16_t encode(double v, const Format& f) {
  const auto sign = static_cast<std::uint16_t>(std::signbit(v) ? 0x8000u : 0u);
  const double a = std::fabs(v);
  if (std::isinf(a)) return static_cast<std::uint16_t>(sign | f.infinity());
  if (a < pow2(f.min_exponent()))  // zero or subnormal: a whole number of the smallest unit
    return static_cast<std::uint16_t>(
        sign | static_cast<std::uint16_t>(a * pow2(f.mantissa_bits - f.min_exponent())));
  const int exponent = std::ilogb(a);  // the leading bit is 2^exponent
  const auto mantissa =
      static_cast<std::uint16_t>((a * pow2(-exponent) - 1.0) * pow2(f.mantissa_bits));
  return static_cast<std::uint16_t>(sign | ((exponent + f.bias()) << f.mantissa_bits) | mantissa);
}

// The unit in the last place of the format at |x| (finite and nonzero: ilogb
// of 0 or infinity is not an exponent), as a power of two.
int ulp_exponent(double x, const Format& f) {
  return std::max(std::ilogb(x), f.min_exponent()) - f.mantissa_bits;
}

// The format's value nearest to finite x, rounding the count of units with
// `round` (std::rint in the default rounding mode: ties to even); past the
// largest finite: infinity.
double round_to(double x, const Format& f, double (*round)(double) = std::rint) {
  if (x == 0 || std::isinf(x)) return x;  // infinity stays infinity (and has no ulp)
  const int q = ulp_exponent(x, f);
  const double v = round(x * pow2(-q)) * pow2(q);
  if (std::fabs(v) > f.largest()) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return v == 0 ? std::copysign(0.0, x) : v;
}

double half_away(double v) { return std::round(v); }  // ties away from zero
double toward_zero(double v) { return std::trunc(v); }

std::string hex(std::uint32_t v, int digits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%0*X", digits, v);
  return text;
}

std::string number(double v) {
  std::ostringstream out;
  out.precision(9);
  out << v;
  return out.str();
}

std::string describe16(std::uint16_t b, const Format& f) {
  return hex(b, 4) + " = " + number(decode(b, f));
}

// What a wrong answer most likely is, in words; "" when nothing fits.
std::string explain(float x, std::uint16_t expected, std::uint16_t got, const Format& f) {
  if (std::isnan(x)) {
    if ((got & 0x7FFFu) == f.infinity())
      return "a NaN became infinity: its mantissa bits were lost (rounding carried them into the "
             "exponent, "
             "or the shift dropped them); set the top mantissa bit";
    if (!is_nan_bits(got, f)) return "a NaN must stay a NaN (exponent all ones, mantissa not zero)";
    return "the NaN's sign was lost";
  }
  if (is_nan_bits(got, f))
    return "a NaN from a number: the rounding carried into the exponent's all-ones pattern?";
  if ((got ^ expected) == 0x8000u) return "only the sign is wrong";
  const double xd = x;
  const std::uint16_t field_mask = f.infinity();
  if ((expected & field_mask) == 0 && (expected & 0x7FFFu) != 0 && (got & 0x7FFFu) == 0)
    return "flushed to zero (or truncated): below the smallest normal (2^" +
           std::to_string(f.min_exponent()) + ") " + f.name +
           " has subnormals: exponent field 0, value = mantissa x 2^" +
           std::to_string(f.min_exponent() - f.mantissa_bits) +
           ", rounded to nearest like any other value";
  if (got == encode(round_to(xd, f, toward_zero), f))
    return "truncated (rounded toward zero): the dropped bits were more than half a unit, or "
           "exactly half "
           "with an odd kept part, so it must round up";
  const double scaled = std::isfinite(xd) && xd != 0 ? xd * pow2(-ulp_exponent(xd, f)) : 0.0;
  const bool tie = scaled - std::floor(scaled) == 0.5;
  if (tie && got == encode(round_to(xd, f, half_away), f))
    return "an exact tie rounded away from zero: ties go to the neighbour whose lowest kept bit is "
           "0 (even)";
  if ((expected & 0x7FFFu) == f.infinity() && std::isfinite(decode(got, f)))
    return "past the largest finite " + std::string(f.name) + " (" + number(f.largest()) +
           ") a value rounds to infinity";
  if ((got & 0x7FFFu) == f.infinity())
    return "infinity for a value that rounds to a finite " + std::string(f.name);
  const int field_got = (got & field_mask) >> f.mantissa_bits,
            field_want = (expected & field_mask) >> f.mantissa_bits;
  if (field_got != field_want && (got & f.mantissa_mask()) == (expected & f.mantissa_mask()))
    return "the exponent field is off by " + std::to_string(field_got - field_want) +
           " (the bias of " + f.name + " is " + std::to_string(f.bias()) + ", of f32 127)";
  return "";
}

// Runs to_bits over `inputs`; one failure message for the first few wrong.
void check_to_bits(const char* fn, std::uint16_t (*to_bits)(float), const Format& f,
                   const std::vector<std::uint32_t>& inputs) {
  std::int64_t wrong = 0;
  std::ostringstream shown;
  for (std::uint32_t pattern : inputs) {
    const float x = std::bit_cast<float>(pattern);
    const std::uint16_t got = to_bits(x);
    const bool nan = std::isnan(x);
    const std::uint16_t expected =
        nan ? static_cast<std::uint16_t>((pattern >> 16 & 0x8000u) | f.infinity() |
                                         (1u << (f.mantissa_bits - 1)))
            : encode(round_to(static_cast<double>(x), f), f);
    const bool ok =
        nan ? is_nan_bits(got, f) && (got & 0x8000u) == (expected & 0x8000u) : got == expected;
    if (ok) continue;
    if (++wrong <= 5) {
      const std::string want = nan ? std::string("a ") +
                                         ((pattern >> 31) ? "negative" : "positive") +
                                         " NaN (e.g. " + hex(expected, 4) + ")"
                                   : describe16(expected, f);
      const std::string why = explain(x, expected, got, f);
      shown << "\n  " << fn << "(x = " << number(x) << ", bits " << hex(pattern, 8)
            << "): expected " << want << ", got " << describe16(got, f)
            << (why.empty() ? "" : "\n      -> " + why);
    }
  }
  EXPECT_EQ(wrong, 0) << fn << ": " << wrong << " of " << inputs.size()
                      << " inputs wrong; the first ones:" << shown.str();
}

void check_from_bits(const char* fn, float (*from_bits)(std::uint16_t), const Format& f) {
  std::int64_t wrong = 0;
  std::ostringstream shown;
  for (std::uint32_t b = 0; b <= 0xFFFFu; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float got = from_bits(bits);
    const double want = decode(bits, f);
    const bool ok = std::isnan(want) ? std::isnan(got) && std::signbit(got) == ((b & 0x8000u) != 0)
                                     : static_cast<double>(got) == want &&
                                           std::signbit(got) == std::signbit(want);
    if (ok) continue;
    if (++wrong <= 5) {
      shown << "\n  " << fn << "(" << hex(b, 4) << "): expected "
            << (std::isnan(want) ? std::string("a NaN with its sign") : number(want)) << ", got "
            << number(got) << " (f32 bits " << hex(std::bit_cast<std::uint32_t>(got), 8) << ")";
      const int field = (b >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1);
      if (field == 0 && (b & f.mantissa_mask()) == 0)
        shown << "\n      -> exponent and mantissa 0 is zero, with its sign";
      else if (field == 0)
        shown << "\n      -> a subnormal: exponent field 0 means mantissa x 2^"
              << f.min_exponent() - f.mantissa_bits << ", with no implicit leading 1";
      else if (std::isnan(want))
        shown << "\n      -> a NaN pattern (exponent all ones, mantissa not zero) must give a NaN";
    }
  }
  EXPECT_EQ(wrong, 0) << fn << ": " << wrong
                      << " of 65536 patterns wrong; the first ones:" << shown.str();
}

// Every top half of an f32 with low halves at and around every rounding
// boundary of the format, then random patterns.
std::vector<std::uint32_t> cast_inputs(const Format& f) {
  std::vector<std::uint32_t> lows = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
  if (f.mantissa_bits == 10)  // f16 drops 13 bits of a normal: 3 of them are in the low half
    for (std::uint32_t kept = 0; kept < 8; ++kept)
      for (std::uint32_t dropped : {0x0000u, 0x0001u, 0x0FFFu, 0x1000u, 0x1001u, 0x1FFFu})
        lows.push_back(kept << 13 | dropped);
  std::vector<std::uint32_t> inputs;
  for (std::uint32_t high = 0; high <= 0xFFFFu; ++high)
    for (std::uint32_t low : lows) inputs.push_back(high << 16 | low);
  std::mt19937 random(7);
  for (int i = 0; i < (1 << 22); ++i) inputs.push_back(static_cast<std::uint32_t>(random()));
  return inputs;
}

TEST(Puzzle7_1_casts, Bf16BitsToF32IsExactForAll65536Patterns) {
  check_from_bits("bf16_bits_to_f32", dtp::ch07::bf16_bits_to_f32, kBf16);
}

TEST(Puzzle7_1_casts, F16BitsToF32IsExactForAll65536Patterns) {
  check_from_bits("f16_bits_to_f32", dtp::ch07::f16_bits_to_f32, kF16);
}

TEST(Puzzle7_1_casts, F32ToBf16RoundsToNearestEvenOnEveryBoundary) {
  check_to_bits("f32_to_bf16_bits", dtp::ch07::f32_to_bf16_bits, kBf16, cast_inputs(kBf16));
}

TEST(Puzzle7_1_casts, F32ToF16RoundsToNearestEvenOnEveryBoundary) {
  check_to_bits("f32_to_f16_bits", dtp::ch07::f32_to_f16_bits, kF16, cast_inputs(kF16));
}

// The lesson's worked examples, with the values written out by hand.
TEST(Puzzle7_1_casts, TheLessonsExamples) {
  struct Case {
    float x;
    std::uint16_t bf16, f16;
    const char* why;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const Case cases[] = {
      {1.0f, 0x3F80, 0x3C00, "one"},
      {-2.0f, 0xC000, 0xC000, "minus two"},
      {0.1f, 0x3DCD, 0x2E66, "0.1: bf16 rounds up, f16 down"},
      {1.0f + 1.0f / 256, 0x3F80, 0x3C04, "1 + 2^-8: a tie in bf16, to the even 1.0"},
      {1.0f + 3.0f / 256, 0x3F82, 0x3C0C, "1 + 3 x 2^-8: a tie in bf16, to the even 1 + 2^-6"},
      {65504.0f, 0x4780, 0x7BFF, "the largest f16"},
      {65519.0f, 0x4780, 0x7BFF, "just below f16's overflow threshold"},
      {65520.0f, 0x4780, 0x7C00, "f16's overflow threshold: a tie that rounds to 65536, infinity"},
      {1e5f, 0x47C3, 0x7C00, "past f16's range, well inside bf16's"},
      {std::ldexp(1.0f, -14), 0x3880, 0x0400, "the smallest normal f16"},
      {std::ldexp(1.0f, -24), 0x3380, 0x0001, "the smallest subnormal f16"},
      {std::ldexp(1.0f, -25), 0x3300, 0x0000,
       "half the smallest subnormal f16: a tie, to the even 0"},
      {std::ldexp(3.0f, -26), 0x3340, 0x0001, "0.75 x 2^-24: rounds up to the smallest subnormal"},
      {3.4e38f, 0x7F80, 0x7C00, "near f32's largest: rounds past bf16's largest to infinity"},
      {-inf, 0xFF80, 0xFC00, "minus infinity"},
      {-0.0f, 0x8000, 0x8000, "minus zero keeps its sign"},
  };
  for (const Case& c : cases) {
    const std::uint16_t b = dtp::ch07::f32_to_bf16_bits(c.x), h = dtp::ch07::f32_to_f16_bits(c.x);
    EXPECT_EQ(hex(b, 4), hex(c.bf16, 4)) << "f32_to_bf16_bits(" << number(c.x) << "): " << c.why;
    EXPECT_EQ(hex(h, 4), hex(c.f16, 4)) << "f32_to_f16_bits(" << number(c.x) << "): " << c.why;
  }
  // A NaN whose mantissa is all in the low 16 bits: a careless shift makes it infinity.
  const float low_nan = std::bit_cast<float>(0x7F800001u);
  EXPECT_TRUE(is_nan_bits(dtp::ch07::f32_to_bf16_bits(low_nan), kBf16))
      << "f32_to_bf16_bits(NaN with bits 0x7F800001) gave "
      << hex(dtp::ch07::f32_to_bf16_bits(low_nan), 4)
      << ": a NaN must stay a NaN even when its only mantissa bits are the ones dropped";
  EXPECT_TRUE(is_nan_bits(dtp::ch07::f32_to_f16_bits(low_nan), kF16))
      << "f32_to_f16_bits(NaN with bits 0x7F800001) gave "
      << hex(dtp::ch07::f32_to_f16_bits(low_nan), 4)
      << ": a NaN must stay a NaN even when its only mantissa bits are the ones dropped";
}

}  // namespace
