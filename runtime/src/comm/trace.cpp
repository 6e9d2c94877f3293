// Trace spans: one global list guarded by a mutex. Recording is off unless
// enable() was called, and a disabled Scope costs one atomic load. With CUDA
// every Scope is also an NVTX range, recorded or not, so `nsys profile`
// shows the same spans on its timeline (without a profiler attached an NVTX
// call returns at once).
#include "dtp/trace.h"

#include <atomic>
#include <chrono>
#include <mutex>

#include "comm/rank_context.h"
#include "dtp/launch.h"

#if DTP_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace dtp::trace {

namespace {
std::atomic<bool> recording{false};
std::mutex spans_mutex;
std::vector<Span> recorded;

double unix_now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
double origin_unix = unix_now_us();  // origin on the wall clock, microseconds since the Unix epoch

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin)
      .count();
}

}  // namespace

void enable() {
  std::lock_guard lock(spans_mutex);
  recorded.clear();
  origin = std::chrono::steady_clock::now();
  origin_unix = unix_now_us();
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

std::vector<Span> take_spans() {
  std::vector<Span> taken;
  std::lock_guard lock(spans_mutex);
  taken.swap(recorded);
  return taken;
}

double origin_unix_us() {
  std::lock_guard lock(spans_mutex);
  return origin_unix;
}

Scope::Scope(std::string name, std::string category) {
#if DTP_HAVE_CUDA
  nvtxRangePushA(name.c_str());
#endif
  if (!recording) return;
  active_ = true;
  name_ = std::move(name);
  category_ = std::move(category);
  start_us_ = now_us();
}

Scope::~Scope() {
#if DTP_HAVE_CUDA
  nvtxRangePop();
#endif
  if (!active_ || !recording) return;
  Span span{std::move(name_),
            std::move(category_),
            std::max(current_rank(), 0),
            detail::worker_lane(),
            start_us_,
            now_us()};
  std::lock_guard lock(spans_mutex);
  recorded.push_back(std::move(span));
}

}  // namespace dtp::trace
