/// @file error.h
/// @brief Errors DTP throws, and the check macro that builds them.
///
/// Every message says what was expected and what was found, so a student can
/// act on it without a debugger.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dtp {

/// Base of every error DTP raises for bad input or a broken protocol.
class Error : public std::runtime_error {
 public:
  /// @param message returned by what(); say what was expected and what was found.
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// Thrown by a puzzle stub. Deliberately NOT a dtp::Error, so a checker that
/// expects a dtp::Error for bad input cannot be satisfied by an unsolved stub.
class NotSolved : public std::logic_error {
 public:
  /// @param puzzle the puzzle id and name, e.g. "1.4 ring_all_gather".
  explicit NotSolved(const std::string& puzzle)
      : std::logic_error("puzzle " + puzzle + " is not solved yet") {}
};

/// A communication call waited longer than DTP_TIMEOUT; the message holds a
/// report of what every rank was doing.
class CommTimeout : public Error {
 public:
  using Error::Error;
};

/// Every rank still running is waiting for another: nothing can ever wake
/// them. The message holds the same report as a timeout.
class CommDeadlock : public Error {
 public:
  using Error::Error;
};

/// Ranks called different collectives (kind, size, dtype, root or op) at the
/// same step, or a received message did not fit the receive buffer.
class CommMismatch : public Error {
 public:
  using Error::Error;
};

/// Raised in every other rank when one rank failed: it unwinds them so that
/// launch() can report the rank that failed first.
class CommAborted : public Error {
 public:
  using Error::Error;
};

/// @cond INTERNAL
namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace detail
/// @endcond

}  // namespace dtp

/// Throws dtp::Error with the concatenated message parts when @p cond is false.
/// Example: `DTP_CHECK(n >= 1, "chunk: n must be at least 1, got ", n);`
#define DTP_CHECK(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond))                                                                          \
      ::dtp::detail::throw_error(__FILE__, __LINE__, ::dtp::detail::concat(__VA_ARGS__)); \
  } while (0)
