// The provided part of chapter 07's loss scaler (drivers/07_mixed_precision):
// its constructor refuses settings that break the schedule, naming the field.
#include <gtest/gtest.h>

#include <string>

#include "07_mixed_precision/mixed_precision.h"
#include "support/harness.h"

namespace dtp::ch07 {
namespace {

using dtp::testing::error_of;

TEST(LossScalerConfig, RefusesBadSettingsNamingTheField) {
  EXPECT_NE(error_of([] {
              LossScaler({0.0, 2.0, 0.5, 10});
            }).find("initial_scale must be finite and > 0, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              LossScaler({1.0, 0.5, 0.5, 10});
            }).find("growth_factor must be >= 1, got 0.5"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              LossScaler({1.0, 2.0, 1.5, 10});
            }).find("backoff_factor must be in (0, 1], got 1.5"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              LossScaler({1.0, 2.0, 0.5, 0});
            }).find("growth_interval must be at least 1, got 0"),
            std::string::npos);
  EXPECT_EQ(error_of([] { LossScaler(ScalerConfig{}); }), "(no error)") << "the defaults are valid";
  EXPECT_EQ(error_of([] {
              LossScaler({1024.0, 1.0, 1.0, 1});
            }),
            "(no error)")
      << "a static scale is valid";
}

}  // namespace
}  // namespace dtp::ch07
