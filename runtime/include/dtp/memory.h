/// @file memory.h
/// @brief The per-rank memory tracker: live and peak bytes per category.
///
/// Every Tensor allocation is charged to the tracker of the rank that made it,
/// under a category. Checkers compare peaks with a chapter's memory formulas
/// (ZeRO, activation checkpointing, pipeline schedules).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace dtp {

/// What an allocation holds.
enum class MemoryCategory { params, grads, optimizer, activations, comm, other };
/// Number of MemoryCategory values (for per-category arrays).
inline constexpr int kMemoryCategoryCount = 6;
/// "params", "grads", "optimizer", "activations", "comm" or "other".
const char* memory_category_name(MemoryCategory category);

/// Live and peak bytes per category for one rank. Thread-safe.
class MemoryTracker {
 public:
  /// Adds @p bytes to live(category) and total_live(), raising the peaks if exceeded.
  void charge(MemoryCategory category, std::int64_t bytes);
  /// Subtracts @p bytes charged earlier under @p category; peaks are unchanged.
  void release(MemoryCategory category, std::int64_t bytes);
  /// Bytes allocated now in @p category.
  std::int64_t live(MemoryCategory category) const;
  /// Highest live(category) since construction or reset_peaks().
  std::int64_t peak(MemoryCategory category) const;
  /// Bytes allocated now, all categories.
  std::int64_t total_live() const;
  /// Highest total_live() since construction or reset_peaks().
  std::int64_t total_peak() const;
  /// Sets every peak to the current live value.
  void reset_peaks();
  /// One line per category: "params live 1.0 MiB peak 2.0 MiB".
  std::string summary() const;

 private:
  mutable std::mutex mutex_;
  std::array<std::int64_t, kMemoryCategoryCount> live_{};
  std::array<std::int64_t, kMemoryCategoryCount> peak_{};
  std::int64_t total_live_ = 0;
  std::int64_t total_peak_ = 0;
};

/// The tracker of the calling rank: launch() gives each rank its own; outside
/// launch() a process-wide tracker is used.
std::shared_ptr<MemoryTracker> current_memory_tracker();
/// Makes @p tracker the calling thread's tracker (launch() does this per rank).
void set_current_memory_tracker(std::shared_ptr<MemoryTracker> tracker);

}  // namespace dtp
