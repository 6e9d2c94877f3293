// Internal: a timeout in seconds as a clock duration, without overflow.
#pragma once

#include <algorithm>
#include <chrono>

namespace dtp {

/// Timeouts above this (about four months) are clamped: steady_clock counts
/// nanoseconds in 64 bits, and a deadline past its range wraps into the past,
/// which would make every wait fail at once.
constexpr double kLongestTimeoutSeconds = 1e7;

inline std::chrono::steady_clock::duration timeout_duration(double seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::min(seconds, kLongestTimeoutSeconds)));
}

}  // namespace dtp
