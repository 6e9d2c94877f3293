// Helpers for the communication tests: small thread worlds, launches that
// must fail (the RankFailure, the exception the rank threw, the report), and
// environment variables set for one scope.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "dtp/dtp.h"
#include "support/scoped_env.h"  // ScopedEnv, used with these helpers

namespace dtp::testing {

/// A world of @p size ranks on the thread backend with a short timeout.
inline World thread_world(int size, double timeout_seconds = 5.0) {
  World world;
  world.size = size;
  world.timeout_seconds = timeout_seconds;
  return world;
}

/// Runs launch() and returns the failure it must raise (a test failure if none).
inline RankFailure launch_failure(const World& world, const std::function<void(Comm&)>& fn) {
  try {
    launch(world, fn);
  } catch (const RankFailure& failure) {
    return failure;
  }
  ADD_FAILURE() << "launch was expected to fail but every rank succeeded";
  return RankFailure(-1, "", nullptr);
}

/// True when the exception the failed rank threw is an @p E.
template <typename E>
bool original_is(const RankFailure& failure) {
  if (!failure.original()) return false;
  try {
    failure.rethrow_original();
  } catch (const E&) {
    return true;
  } catch (...) {
  }
  return false;
}

inline ::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected to find\n  " << part << "\nin\n" << text;
}

}  // namespace dtp::testing
