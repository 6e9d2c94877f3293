#include "dtp/memory.h"

#include <algorithm>
#include <cstdio>

namespace dtp {

const char* memory_category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::params:
      return "params";
    case MemoryCategory::grads:
      return "grads";
    case MemoryCategory::optimizer:
      return "optimizer";
    case MemoryCategory::activations:
      return "activations";
    case MemoryCategory::comm:
      return "comm";
    case MemoryCategory::other:
      return "other";
    case MemoryCategory::recompute:
      return "recompute";
    case MemoryCategory::offloaded:
      return "offloaded";
  }
  return "?";
}

namespace {
thread_local int recompute_depth = 0;
}  // namespace

RecomputeScope::RecomputeScope() { ++recompute_depth; }
RecomputeScope::~RecomputeScope() { --recompute_depth; }
bool recomputing() { return recompute_depth > 0; }

MemoryCategory charged_category(MemoryCategory requested) {
  return requested == MemoryCategory::activations && recomputing() ? MemoryCategory::recompute
                                                                   : requested;
}

void MemoryTracker::charge(MemoryCategory category, std::int64_t bytes, DeviceKind where) {
  std::lock_guard lock(mutex_);
  const auto c = static_cast<int>(category);
  const auto d = static_cast<int>(where);
  device_live_[d][c] += bytes;
  device_peak_[d][c] = std::max(device_peak_[d][c], device_live_[d][c]);
  live_[c] += bytes;
  peak_[c] = std::max(peak_[c], live_[c]);
  activations_with_recompute_peak_ = std::max(activations_with_recompute_peak_, kept_and_again());
  total_live_ += bytes;
  total_peak_ = std::max(total_peak_, total_live_);
}

void MemoryTracker::release(MemoryCategory category, std::int64_t bytes, DeviceKind where) {
  std::lock_guard lock(mutex_);
  device_live_[static_cast<int>(where)][static_cast<int>(category)] -= bytes;
  live_[static_cast<int>(category)] -= bytes;
  total_live_ -= bytes;
}

std::int64_t MemoryTracker::live(MemoryCategory category) const {
  std::lock_guard lock(mutex_);
  return live_[static_cast<int>(category)];
}

std::int64_t MemoryTracker::peak(MemoryCategory category) const {
  std::lock_guard lock(mutex_);
  return peak_[static_cast<int>(category)];
}

std::int64_t MemoryTracker::live(MemoryCategory category, DeviceKind where) const {
  std::lock_guard lock(mutex_);
  return device_live_[static_cast<int>(where)][static_cast<int>(category)];
}

std::int64_t MemoryTracker::peak(MemoryCategory category, DeviceKind where) const {
  std::lock_guard lock(mutex_);
  return device_peak_[static_cast<int>(where)][static_cast<int>(category)];
}

std::int64_t MemoryTracker::total_live() const {
  std::lock_guard lock(mutex_);
  return total_live_;
}

std::int64_t MemoryTracker::total_peak() const {
  std::lock_guard lock(mutex_);
  return total_peak_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard lock(mutex_);
  peak_ = live_;
  device_peak_ = device_live_;
  total_peak_ = total_live_;
  activations_with_recompute_peak_ = kept_and_again();
}

std::int64_t MemoryTracker::peak_activations_with_recompute() const {
  std::lock_guard lock(mutex_);
  return activations_with_recompute_peak_;
}

std::string MemoryTracker::summary() const {
  std::lock_guard lock(mutex_);
  constexpr double kMiB = 1048576.0;
  constexpr int cpu = static_cast<int>(DeviceKind::cpu), cuda = static_cast<int>(DeviceKind::cuda);
  std::string out;
  char line[256];
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    std::snprintf(line, sizeof line, "%-12s live %10.3f MiB  peak %10.3f MiB",
                  memory_category_name(static_cast<MemoryCategory>(c)), live_[c] / kMiB,
                  peak_[c] / kMiB);
    out += line;
    // Only a category that used both sides (offloaded optimizer state, staged
    // buffers) needs the split; elsewhere it would repeat the line.
    if (device_peak_[cpu][c] > 0 && device_peak_[cuda][c] > 0) {
      std::snprintf(line, sizeof line,
                    "  (cpu live %.3f peak %.3f MiB, cuda live %.3f peak %.3f MiB)",
                    device_live_[cpu][c] / kMiB, device_peak_[cpu][c] / kMiB,
                    device_live_[cuda][c] / kMiB, device_peak_[cuda][c] / kMiB);
      out += line;
    }
    out += "\n";
  }
  return out;
}

namespace {
std::shared_ptr<MemoryTracker>& thread_tracker() {
  thread_local std::shared_ptr<MemoryTracker> tracker;
  return tracker;
}
}  // namespace

std::shared_ptr<MemoryTracker> current_memory_tracker() {
  static auto process_tracker = std::make_shared<MemoryTracker>();
  auto& mine = thread_tracker();
  return mine ? mine : process_tracker;
}

void set_current_memory_tracker(std::shared_ptr<MemoryTracker> tracker) {
  thread_tracker() = std::move(tracker);
}

}  // namespace dtp
