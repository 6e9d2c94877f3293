// The progress display of dtp-train. On a terminal one line updates in place
// every step (loss, tokens/s, time left) and a line is kept every N steps;
// in a file or pipe only the kept lines are written.
#pragma once

#include <chrono>
#include <cstdint>

#include "dtp/train_run.h"

namespace dtp::train_app {

/// log_every = 0 means about ten kept lines per run.
std::int64_t resolve_log_every(std::int64_t log_every, std::int64_t steps);

class Progress {
 public:
  /// @p terminal: stdout is a terminal (in-place updates are possible).
  Progress(std::int64_t total_steps, std::int64_t log_every, bool terminal);
  /// Whether step @p step (counted from 1) keeps a line: the first, every
  /// log_every-th and the last.
  bool keeps(std::int64_t step) const;
  /// Shows @p record: a kept line, or (on a terminal) the in-place line.
  void show(const StepRecord& record);
  /// Ends an in-place line, so that what follows starts on a fresh line.
  void break_line();

 private:
  std::int64_t total_;
  std::int64_t log_every_;
  bool terminal_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace dtp::train_app
