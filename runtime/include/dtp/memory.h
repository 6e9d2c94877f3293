/// @file memory.h
/// @brief The per-rank memory tracker: live and peak bytes per category and
/// per device kind (host or GPU).
///
/// Every Tensor allocation is charged to the tracker of the rank that made it,
/// under a category and the kind of device it lives on. Checkers compare
/// peaks with a chapter's memory formulas (ZeRO, activation checkpointing,
/// pipeline schedules); optimizer offload moves state from the GPU to the
/// host, which the per-device split shows.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "dtp/device.h"

namespace dtp {

/// What an allocation holds. `activations` are kept from a forward for its
/// backward; `recompute` are activations made again inside a backward
/// (activation checkpointing, chapter 09), live only until that backward
/// uses them; `offloaded` are activations moved to host memory between the
/// forward and the backward.
enum class MemoryCategory {
  params,
  grads,
  optimizer,
  activations,
  comm,
  other,
  recompute,
  offloaded
};
/// Number of MemoryCategory values (for per-category arrays).
inline constexpr int kMemoryCategoryCount = 8;
/// "params", "grads", "optimizer", "activations", "comm", "other",
/// "recompute" or "offloaded".
const char* memory_category_name(MemoryCategory category);

/// While one is alive on a thread, every allocation that thread makes as
/// MemoryCategory::activations is charged to MemoryCategory::recompute
/// instead, and the matrix-product FLOPs it runs count as recomputed too
/// (see flops.h). Wrap the forward a checkpointed backward runs again in one,
/// so that the tracker tells what the forward kept from what the backward
/// made again. Scopes nest.
class RecomputeScope {
 public:
  RecomputeScope();
  ~RecomputeScope();
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;
};
/// True while a RecomputeScope is alive on the calling thread.
bool recomputing();
/// @p requested, or MemoryCategory::recompute for activations made inside a RecomputeScope.
MemoryCategory charged_category(MemoryCategory requested);

/// Live and peak bytes per category and device kind for one rank. Thread-safe.
class MemoryTracker {
 public:
  /// Adds @p bytes to live(category, where) (and so to live(category) and
  /// total_live()), raising every peak that is exceeded.
  void charge(MemoryCategory category, std::int64_t bytes, DeviceKind where = DeviceKind::cpu);
  /// Subtracts @p bytes charged earlier under @p category on @p where; peaks are unchanged.
  void release(MemoryCategory category, std::int64_t bytes, DeviceKind where = DeviceKind::cpu);
  /// Bytes allocated now in @p category, host and GPU together.
  std::int64_t live(MemoryCategory category) const;
  /// Highest live(category) since construction or reset_peaks(). This is the
  /// peak of the host + GPU sum, which can be below the sum of the two peaks.
  std::int64_t peak(MemoryCategory category) const;
  /// Bytes allocated now in @p category on devices of kind @p where.
  std::int64_t live(MemoryCategory category, DeviceKind where) const;
  /// Highest live(category, where) since construction or reset_peaks().
  std::int64_t peak(MemoryCategory category, DeviceKind where) const;
  /// Highest live(activations) + live(recompute): what a step's activations
  /// took at once, kept ones and ones made again together.
  std::int64_t peak_activations_with_recompute() const;
  /// Bytes allocated now, all categories and devices.
  std::int64_t total_live() const;
  /// Highest total_live() since construction or reset_peaks().
  std::int64_t total_peak() const;
  /// Sets every peak to the current live value.
  void reset_peaks();
  /// One line per category: "params live 1.0 MiB peak 2.0 MiB"; a category
  /// with memory on both the host and a GPU adds its split per device kind.
  std::string summary() const;

 private:
  // Indexed [device kind][category]; the per-category sums keep their own
  // peaks because the peak of a sum is not the sum of the peaks.
  using PerCategory = std::array<std::int64_t, kMemoryCategoryCount>;
  std::int64_t kept_and_again() const {
    return live_[static_cast<int>(MemoryCategory::activations)] +
           live_[static_cast<int>(MemoryCategory::recompute)];
  }
  mutable std::mutex mutex_;
  std::array<PerCategory, kDeviceKindCount> device_live_{};
  std::array<PerCategory, kDeviceKindCount> device_peak_{};
  PerCategory live_{};
  PerCategory peak_{};
  std::int64_t activations_with_recompute_peak_ = 0;
  std::int64_t total_live_ = 0;
  std::int64_t total_peak_ = 0;
};

/// The tracker of the calling rank: launch() gives each rank its own; outside
/// launch() a process-wide tracker is used.
std::shared_ptr<MemoryTracker> current_memory_tracker();
/// Makes @p tracker the calling thread's tracker (launch() does this per rank).
void set_current_memory_tracker(std::shared_ptr<MemoryTracker> tracker);

}  // namespace dtp
