// The vectorized exp behind the f32 GELU (runtime/src/cpu/exp.h) against
// std::exp: within 2 ulp over every exponent the loops can meet, and the
// edges (underflow to 0, overflow to inf, NaN kept) as documented.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/exp.h"

namespace dtp {
namespace {

std::vector<float> exp8_of(const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  detail::map8(xs.data(), nullptr, out.data(), static_cast<std::int64_t>(xs.size()),
               [](detail::Float8 x, detail::Float8) { return detail::exp8(x); });
  return out;
}

TEST(CpuExp, WithinTwoUlpOfStdExp) {
  std::vector<float> xs;
  for (float x = -87.3f; x < 88.7f; x += 3e-4f) xs.push_back(x);
  const std::vector<float> got = exp8_of(xs);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float want = std::exp(xs[i]);
    const float ulp = std::nextafter(want, std::numeric_limits<float>::infinity()) - want;
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want), 2.0 * ulp)
        << "exp8(" << xs[i] << ") is " << got[i] << " but std::exp gives " << want;
  }
}

TEST(CpuExp, EdgesUnderflowOverflowAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  // 11 values: one whole vector and a partial one (the padded tail).
  const std::vector<float> xs = {-inf,   -100.0f, -87.4f,
                                 0.0f,   1.0f,    88.8f,
                                 100.0f, inf,     std::numeric_limits<float>::quiet_NaN(),
                                 -1.0f,  2.0f};
  const std::vector<float> got = exp8_of(xs);
  EXPECT_EQ(got[0], 0.0f) << "e^-inf";
  EXPECT_EQ(got[1], 0.0f) << "e^-100 is below the smallest normal float: 0";
  EXPECT_EQ(got[2], 0.0f) << "e^-87.4";
  EXPECT_EQ(got[3], 1.0f) << "e^0 exactly";
  EXPECT_NEAR(got[4], std::exp(1.0f), 2e-7f) << "e^1";
  EXPECT_EQ(got[5], inf) << "e^88.8 is past the largest float";
  EXPECT_EQ(got[6], inf) << "e^100";
  EXPECT_EQ(got[7], inf) << "e^inf";
  EXPECT_TRUE(std::isnan(got[8])) << "a NaN must stay NaN (a diverging run must show), got "
                                  << got[8];
  EXPECT_NEAR(got[9], std::exp(-1.0f), 1e-7f) << "e^-1 in the partial last vector";
  EXPECT_NEAR(got[10], std::exp(2.0f), 1e-6f) << "e^2 in the partial last vector";
}

}  // namespace
}  // namespace dtp
