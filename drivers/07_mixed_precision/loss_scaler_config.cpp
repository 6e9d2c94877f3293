// Provided: the loss scaler's constructor, which refuses settings that would
// move the scale the wrong way (one that shrinks on good steps, or grows on
// a bad one). Factors of 1 make a static scale.
#include "07_mixed_precision/mixed_precision.h"

#include <cmath>

#include "dtp/error.h"

namespace dtp::ch07 {

LossScaler::LossScaler(ScalerConfig config) : config_(config), scale_(config.initial_scale) {
  DTP_CHECK(std::isfinite(config.initial_scale) && config.initial_scale > 0,
            "LossScaler: initial_scale must be finite and > 0, got ", config.initial_scale);
  // 1 and 1 are a static scale; a growth below 1 or a backoff above 1
  // would move the scale the wrong way.
  DTP_CHECK(std::isfinite(config.growth_factor) && config.growth_factor >= 1,
            "LossScaler: growth_factor must be >= 1, got ", config.growth_factor);
  DTP_CHECK(config.backoff_factor > 0 && config.backoff_factor <= 1,
            "LossScaler: backoff_factor must be in (0, 1], got ", config.backoff_factor);
  DTP_CHECK(config.growth_interval >= 1, "LossScaler: growth_interval must be at least 1, got ",
            config.growth_interval);
}

void LossScaler::restore(double scale, std::int64_t good_steps) {
  DTP_CHECK(std::isfinite(scale) && scale > 0,
            "LossScaler::restore: the scale must be finite and > 0, got ", scale);
  DTP_CHECK(good_steps >= 0 && good_steps < config_.growth_interval,
            "LossScaler::restore: good steps must be in [0, ", config_.growth_interval, "), got ",
            good_steps);
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace dtp::ch07
