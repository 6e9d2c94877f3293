// Internal: exp for the loops that take one per element (GELU's tanh,
// attention's softmax), eight floats at a time.
//
// std::exp is a call into libm per element, and a loop around it cannot be
// vectorized. exp8 works on a vector of 8 floats (GCC vector extensions:
// two SSE registers on the baseline, one AVX register where the code is
// built for it) with branch-free arithmetic: with x = n ln2 + r (n an
// integer, |r| <= ln2 / 2), e^x = 2^n e^r, where 2^n is built in the
// exponent bits and e^r is a degree-7 polynomial (Cephes' expf
// coefficients). Within 2 ulp of std::exp (tested); e^x is 0 below -87.3
// (where e^x is no longer a normal float) and +inf above 88.7; NaN stays
// NaN, so a diverging run still shows up. No FMA (-ffp-contract=off), so
// every machine gets the same bits.
//
// For f64 the loops keep std::exp: f64 is the numerics cross-check with
// PyTorch and keeps libm's accuracy.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace dtp::detail {

typedef float Float8 __attribute__((vector_size(32)));
typedef std::int32_t Int8 __attribute__((vector_size(32)));

[[gnu::always_inline]] inline Float8 exp8(Float8 x) {
  constexpr float kLowest = -87.3f, kHighest = 88.7f;
  const Int8 underflows = x<kLowest, overflows = x> kHighest;
  const Float8 lowest = Float8{} + kLowest, highest = Float8{} + kHighest;
  x = x < kLowest ? lowest : x;  // NaN compares false: it stays NaN
  x = x > kHighest ? highest : x;
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (round to nearest, no call).
  const float kRound = 12582912.0f;
  const Float8 n = (x * 1.44269504088896341f + kRound) - kRound;
  // r = x - n ln2, with ln2 split in two so that n * 0.693359375 is exact.
  const Float8 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  Float8 p = Float8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * r) * r + r + 1.0f;
  // 2^n in two halves (n reaches 128 near the top, past the largest exponent).
  const Int8 half = __builtin_convertvector(n, Int8) >> 1;
  const Float8 two_to_half = reinterpret_cast<Float8>((half + 127) << 23);
  const Float8 two_to_rest =
      reinterpret_cast<Float8>((__builtin_convertvector(n, Int8) - half + 127) << 23);
  const Float8 e = (p * two_to_half) * two_to_rest;
  const Float8 zero = Float8{}, inf = Float8{} + std::numeric_limits<float>::infinity();
  return underflows ? zero : (overflows ? inf : e);
}

/// out[i] = f(a[i]) (b null) or f(a[i], b[i]) for n elements, f taking and
/// giving Float8; the last partial vector goes through a padded copy, so
/// every element gets the same arithmetic wherever it sits. out may alias
/// a or b.
template <typename F>
[[gnu::always_inline]] inline void map8(const float* a, const float* b, float* out, std::int64_t n,
                                        F f) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {  // whole vectors: fixed-size copies, kept in registers
    Float8 x, y{};
    std::memcpy(&x, a + i, sizeof x);
    if (b != nullptr) std::memcpy(&y, b + i, sizeof y);
    const Float8 z = f(x, y);
    std::memcpy(out + i, &z, sizeof z);
  }
  if (i == n) return;
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(n - i);
  Float8 x{}, y{};
  std::memcpy(&x, a + i, bytes);
  if (b != nullptr) std::memcpy(&y, b + i, bytes);
  const Float8 z = f(x, y);
  std::memcpy(out + i, &z, bytes);
}

}  // namespace dtp::detail
