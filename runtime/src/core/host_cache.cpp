#include "dtp/host_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dtp/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define DTP_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTP_UNDER_ASAN 1
#endif
#endif

namespace dtp {

namespace {
constexpr std::size_t kAlignment = 64;  // suits vector loads; aligned_alloc needs a multiple of it

int floor_log2(std::size_t n) { return 63 - __builtin_clzll(static_cast<unsigned long long>(n)); }

void* system_block(std::size_t bytes) {
  void* block = std::aligned_alloc(kAlignment, bytes);
  DTP_CHECK(block != nullptr, "out of host memory allocating ", bytes, " bytes");
  return block;
}
}  // namespace

HostBlockCache::HostBlockCache(std::size_t limit_bytes) : free_(4 * 64), limit_(limit_bytes) {}

HostBlockCache::~HostBlockCache() { clear(); }

std::size_t HostBlockCache::size_class(std::size_t bytes) {
  if (bytes <= kAlignment) return kAlignment;
  const std::size_t base = std::size_t{1} << floor_log2(bytes - 1);  // base < bytes <= 2 base
  const std::size_t step = std::max(base / 4, kAlignment);           // classes stay multiples of 64
  return base + (bytes - base + step - 1) / step * step;
}

int HostBlockCache::class_index(std::size_t bytes) {
  const std::size_t size = size_class(bytes);
  const int k = floor_log2(size);
  const std::size_t base = std::size_t{1} << k;
  return 4 * k + static_cast<int>((size - base) / std::max(base / 4, kAlignment));
}

void* HostBlockCache::take(std::size_t bytes) {
  const int index = class_index(bytes);
  {
    std::lock_guard lock(mutex_);
    std::vector<void*>& list = free_[static_cast<std::size_t>(index)];
    if (!list.empty()) {
      void* block = list.back();
      list.pop_back();
      cached_ -= size_class(bytes);
      ++reused_;
      return block;
    }
    ++fresh_;
  }
  return system_block(size_class(bytes));
}

void HostBlockCache::give_back(void* block, std::size_t bytes) {
  const std::size_t size = size_class(bytes);
  {
    std::lock_guard lock(mutex_);
    if (cached_ + size <= limit_) {
      free_[static_cast<std::size_t>(class_index(bytes))].push_back(block);
      cached_ += size;
      return;
    }
  }
  std::free(block);
}

std::size_t HostBlockCache::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return cached_;
}

std::size_t HostBlockCache::reused() const {
  std::lock_guard lock(mutex_);
  return reused_;
}

std::size_t HostBlockCache::fresh() const {
  std::lock_guard lock(mutex_);
  return fresh_;
}

void HostBlockCache::clear() {
  std::lock_guard lock(mutex_);
  for (std::vector<void*>& list : free_) {
    for (void* block : list) std::free(block);
    list.clear();
  }
  cached_ = 0;
}

namespace {
bool caching_on() {
#ifdef DTP_UNDER_ASAN
  return false;  // a reused block would hide a use after free from AddressSanitizer
#else
  static const bool on = [] {
    const char* value = std::getenv("DTP_HOST_CACHE");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return on;
#endif
}
}  // namespace

std::shared_ptr<HostBlockCache> current_host_cache() {
  // One per thread; a Storage holds its cache, so blocks still out when the
  // thread ends return to it, and it frees them when the last one is back.
  thread_local std::shared_ptr<HostBlockCache> cache =
      std::make_shared<HostBlockCache>(caching_on() ? HostBlockCache::kDefaultLimit : 0);
  return cache;
}

}  // namespace dtp
