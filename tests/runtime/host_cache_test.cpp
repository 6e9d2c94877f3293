// The host block cache (dtp/host_cache.h): freed tensor memory is reused by
// the next allocation of its size class, while the memory tracker still counts
// only what tensors hold.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

#include "dtp/host_cache.h"
#include "dtp/memory.h"
#include "dtp/tensor.h"

namespace dtp {
namespace {

TEST(HostBlockCache, SizeClassesAreMultiplesOf64AtMostAQuarterAboveTheRequest) {
  EXPECT_EQ(HostBlockCache::size_class(0), 64u);
  EXPECT_EQ(HostBlockCache::size_class(64), 64u);
  EXPECT_EQ(HostBlockCache::size_class(65), 128u);
  EXPECT_EQ(HostBlockCache::size_class(129), 192u);
  EXPECT_EQ(HostBlockCache::size_class(1025), 1280u);  // 1024 + a quarter
  for (std::size_t bytes :
       {65u, 100u, 1000u, 4097u, 100000u, 1u << 20, (1u << 20) + 1, 12345679u}) {
    const std::size_t size = HostBlockCache::size_class(bytes);
    EXPECT_GE(size, bytes) << "a request of " << bytes << " bytes got a smaller class";
    EXPECT_EQ(size % 64, 0u) << "the class of " << bytes << " bytes (" << size
                             << ") is not 64-byte aligned";
    if (bytes > 256) {
      EXPECT_LE(size, bytes + bytes / 4) << "the class of " << bytes << " bytes wastes over 25%";
    }
    EXPECT_EQ(HostBlockCache::size_class(size), size) << "a class size must be its own class";
  }
}

TEST(HostBlockCache, AFreedBlockIsTheNextOneOfItsClass) {
  HostBlockCache cache;
  void* first = cache.take(100000);
  cache.give_back(first, 100000);
  EXPECT_EQ(cache.cached_bytes(), HostBlockCache::size_class(100000));
  void* again = cache.take(99999);  // same class
  EXPECT_EQ(again, first);
  EXPECT_EQ(cache.reused(), 1u);
  EXPECT_EQ(cache.fresh(), 1u);
  EXPECT_EQ(cache.cached_bytes(), 0u);
  void* other = cache.take(1000);  // another class: fresh
  EXPECT_NE(other, first);
  EXPECT_EQ(cache.fresh(), 2u);
  cache.give_back(again, 99999);
  cache.give_back(other, 1000);
  cache.clear();
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

TEST(HostBlockCache, ALimitOfZeroKeepsNothing) {  // caching off: AddressSanitizer, DTP_HOST_CACHE=0
  HostBlockCache cache(/*limit_bytes=*/0);
  void* a = cache.take(1000);
  cache.give_back(a, 1000);
  EXPECT_EQ(cache.cached_bytes(), 0u);
  EXPECT_EQ(cache.reused(), 0u);
}

TEST(HostBlockCache, KeepsNoMoreThanItsLimit) {
  HostBlockCache cache(/*limit_bytes=*/4096);
  void* a = cache.take(4096);
  void* b = cache.take(4096);
  cache.give_back(a, 4096);
  cache.give_back(b, 4096);  // over the limit: back to the system
  EXPECT_EQ(cache.cached_bytes(), 4096u);
}

TEST(HostBlockCache, BlocksAreAlignedFor64ByteVectorLoads) {
  HostBlockCache cache;
  for (std::size_t bytes : {1u, 63u, 65u, 4000u, 1u << 20}) {
    void* block = cache.take(bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(block) % 64, 0u) << bytes << " bytes";
    cache.give_back(block, bytes);
  }
}

TEST(HostBlockCache, TensorsReuseMemoryAndTheTrackerCountsOnlyLiveTensors) {
  auto tracker = std::make_shared<MemoryTracker>();
  std::thread rank([&] {  // a fresh thread: its own cache and tracker, as a rank has
    set_current_memory_tracker(tracker);
    const void* first = nullptr;
    {
      Tensor t = Tensor::zeros({1000, 100}, DType::f32, Device::cpu(), MemoryCategory::activations);
      first = t.raw();
      EXPECT_EQ(tracker->live(MemoryCategory::activations), 400000);
    }
    EXPECT_EQ(tracker->live(MemoryCategory::activations), 0)
        << "a cached block still counted as live";
    Tensor again = Tensor::empty({100000}, DType::f32, Device::cpu(), MemoryCategory::grads);
    EXPECT_EQ(tracker->live(MemoryCategory::grads), 400000);
    EXPECT_EQ(tracker->peak(MemoryCategory::activations), 400000);
    if (current_host_cache()->limit() > 0) {
      EXPECT_EQ(again.raw(), first)
          << "the second tensor of the same size did not reuse the first's memory";
    }
    set_current_memory_tracker(nullptr);
  });
  rank.join();
}

TEST(HostBlockCache, ABlockFreedOnAnotherThreadReturnsToItsOwnCache) {
  std::shared_ptr<HostBlockCache> owner;
  Tensor made;
  std::thread rank([&] {
    owner = current_host_cache();
    made = Tensor::empty({5000}, DType::f64);
  });
  rank.join();
  if (owner->limit() == 0)
    GTEST_SKIP() << "the host cache is off (AddressSanitizer or DTP_HOST_CACHE=0)";
  made = Tensor();  // freed here, on the test's thread
  EXPECT_EQ(owner->cached_bytes(), HostBlockCache::size_class(40000));
}

}  // namespace
}  // namespace dtp
