#include "train/progress.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace dtp::train_app {
namespace {

std::string duration_text(double seconds) {
  char text[32];
  const long long s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600)
    std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, s / 60 % 60);
  else
    std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
  return text;
}

}  // namespace

std::int64_t resolve_log_every(std::int64_t log_every, std::int64_t steps) {
  if (log_every > 0) return log_every;
  return std::max<std::int64_t>(1, (steps + 9) / 10);
}

Progress::Progress(std::int64_t total_steps, std::int64_t log_every, bool terminal)
    : total_(total_steps),
      log_every_(resolve_log_every(log_every, total_steps)),
      terminal_(terminal) {}

bool Progress::keeps(std::int64_t step) const {
  return step == 1 || step % log_every_ == 0 || step == total_;
}

void Progress::show(const StepRecord& record) {
  // Time left from the mean step so far (setup excluded after the first step).
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double left =
      elapsed / static_cast<double>(record.step) * static_cast<double>(total_ - record.step);
  const std::string eta = record.step == total_ ? "" : "  ETA " + duration_text(left);
  const std::string line = format_step(record, total_) + eta;
  if (keeps(record.step)) {
    // "\r\033[K" returns to the start of the in-place line and clears it.
    std::printf("%s%s\n", terminal_ ? "\r\033[K" : "", line.c_str());
    line_open_ = false;
  } else if (terminal_) {
    std::printf("\r\033[K%s", line.c_str());
    line_open_ = true;
  }
  std::fflush(stdout);
}

void Progress::break_line() {
  if (!line_open_) return;
  std::printf("\n");
  std::fflush(stdout);
  line_open_ = false;
}

}  // namespace dtp::train_app
