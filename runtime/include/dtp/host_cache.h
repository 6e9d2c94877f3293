/// @file host_cache.h
/// @brief Host memory for tensors, kept and reused across training steps.
///
/// A training step allocates the same activation and gradient buffers every
/// time. Handed back to glibc, a large block goes back to the kernel and its
/// pages fault in again on the next step: thousands of page faults per step,
/// about half of a small model's step time. The cache keeps freed blocks in
/// free lists by size class and hands them out again, so a steady-state step
/// allocates nothing from the system.
///
/// The memory tracker is unaffected: it charges a tensor when it is made and
/// releases it when it dies, cached or not, so live and peak bytes per
/// category are what the program holds, not what the cache keeps.
///
/// Each thread (so each rank thread) has its own cache; a block returns to the
/// cache it came from whichever thread frees it. Under AddressSanitizer (so a
/// use after free is still caught) and when the environment sets
/// DTP_HOST_CACHE=0, the caches keep nothing: every block goes straight back
/// to the system.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace dtp {

/// Free lists of 64-byte-aligned host blocks by size class. Thread-safe.
class HostBlockCache {
 public:
  /// Keeps at most @p limit_bytes of free blocks; a block freed beyond it goes
  /// back to the system (0: keeps none, a plain aligned allocator).
  explicit HostBlockCache(std::size_t limit_bytes = kDefaultLimit);
  ~HostBlockCache();
  HostBlockCache(const HostBlockCache&) = delete;
  HostBlockCache& operator=(const HostBlockCache&) = delete;

  /// A block of at least @p bytes (its size class: size_class(bytes)), a cached one when there is
  /// one.
  void* take(std::size_t bytes);
  /// Returns a block that take(@p bytes) gave.
  void give_back(void* block, std::size_t bytes);
  /// Bytes held in free lists now.
  std::size_t cached_bytes() const;
  /// Blocks handed out from a free list.
  std::size_t reused() const;
  /// Blocks that had to come from the system.
  std::size_t fresh() const;
  /// The most bytes of free blocks it keeps; 0 when caching is off.
  std::size_t limit() const { return limit_; }
  /// Gives every free block back to the system.
  void clear();

  /// The size a request of @p bytes is rounded up to: a multiple of 64 bytes,
  /// in steps of a quarter of a power of two from 256 bytes up (so at most 25%
  /// more than asked there).
  static std::size_t size_class(std::size_t bytes);
  /// 2 GiB.
  static constexpr std::size_t kDefaultLimit = std::size_t{2} << 30;

 private:
  static int class_index(std::size_t bytes);
  mutable std::mutex mutex_;
  std::vector<std::vector<void*>> free_;  // by class_index
  std::size_t limit_;
  std::size_t cached_ = 0;
  std::size_t reused_ = 0;
  std::size_t fresh_ = 0;
};

/// The calling thread's cache, made on its first use; with caching off
/// (AddressSanitizer, DTP_HOST_CACHE=0) its limit() is 0.
std::shared_ptr<HostBlockCache> current_host_cache();

}  // namespace dtp
