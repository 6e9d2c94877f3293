// Trace spans: one global list guarded by a mutex. Recording is off unless
// enable() was called, and a disabled Scope costs one atomic load.
#include "dtp/trace.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>

#include "dtp/error.h"
#include "dtp/json.h"
#include "comm/rank_context.h"
#include "dtp/launch.h"

namespace dtp::trace {

namespace {
std::atomic<bool> recording{false};
std::mutex spans_mutex;
std::vector<Span> recorded;
std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin).count();
}

}  // namespace

void enable() {
  std::lock_guard lock(spans_mutex);
  recorded.clear();
  origin = std::chrono::steady_clock::now();
  recording = true;
}

void disable() { recording = false; }
bool enabled() { return recording; }

void clear() {
  std::lock_guard lock(spans_mutex);
  recorded.clear();
}

std::vector<Span> spans() {
  std::lock_guard lock(spans_mutex);
  return recorded;
}

std::vector<Span> spans_since(std::size_t first) {
  std::lock_guard lock(spans_mutex);
  if (first >= recorded.size()) return {};
  return std::vector<Span>(recorded.begin() + static_cast<std::ptrdiff_t>(first), recorded.end());
}

void write_chrome_json(const std::string& path) {
  std::vector<Span> all = spans();
  std::ofstream out(path);
  DTP_CHECK(out.good(), "trace: cannot write '", path, "'");
  // Complete events ("ph":"X"): one track (tid) per rank and lane, named by
  // metadata events so Perfetto shows "rank 0" and "rank 0 comm".
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  int ranks = 0;
  for (const Span& s : all) ranks = std::max(ranks, s.rank + 1);
  for (int r = 0; r < ranks; ++r)
    for (int lane = 0; lane < 2; ++lane)
      out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << 2 * r + lane
          << ",\"args\":{\"name\":\"rank " << r << (lane ? " comm" : "") << "\"}},\n";
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Span& s = all[i];
    char times[96];
    std::snprintf(times, sizeof times, "\"ts\":%.3f,\"dur\":%.3f", s.start_us, s.end_us - s.start_us);
    out << "{\"name\":" << json_string(s.name) << ",\"cat\":" << json_string(s.category)
        << ",\"ph\":\"X\",\"pid\":0,\"tid\":" << 2 * s.rank + s.lane << "," << times << "}"
        << ",\n";
  }
  out << "{\"name\":\"dtp\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{}}\n]}\n";
}

Scope::Scope(std::string name, std::string category) {
  if (!recording) return;
  active_ = true;
  name_ = std::move(name);
  category_ = std::move(category);
  start_us_ = now_us();
}

Scope::~Scope() {
  if (!active_ || !recording) return;
  Span span{std::move(name_), std::move(category_), std::max(current_rank(), 0),
            detail::is_comm_worker() ? 1 : 0, start_us_, now_us()};
  std::lock_guard lock(spans_mutex);
  recorded.push_back(std::move(span));
}

}  // namespace dtp::trace
