/// @file trace.h
/// @brief Per-rank spans of work, exported as Chrome / Perfetto trace JSON.
#pragma once

#include <string>
#include <vector>

namespace dtp::trace {

/// One interval of work on one rank.
struct Span {
  std::string name;      ///< e.g. "all_reduce" or "block 3 backward"
  std::string category;  ///< "compute", "comm", "schedule", ...
  int rank = 0;          ///< the rank (0 outside launch())
  int lane = 0;          ///< 0: the rank's own thread; 1: its communication thread
  double start_us = 0;   ///< microseconds since enable()
  double end_us = 0;     ///< microseconds since enable(), when the span ended
};

/// Starts recording (clears earlier spans).
void enable();
/// Stops recording; recorded spans stay until the next enable() or clear().
void disable();
/// True between enable() and disable().
bool enabled();
/// Drops the recorded spans; recording stays on or off as it was.
void clear();
/// Spans recorded so far, in the order they ended.
std::vector<Span> spans();
/// Writes spans() as Chrome trace-event JSON (open in ui.perfetto.dev).
void write_chrome_json(const std::string& path);

/// Records one span on the calling rank from construction to destruction.
class Scope {
 public:
  /// Notes the start time if recording is on; otherwise this scope records nothing.
  Scope(std::string name, std::string category);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::string name_;
  std::string category_;
  double start_us_ = 0;
  bool active_ = false;
};

}  // namespace dtp::trace
