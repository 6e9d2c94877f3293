// The memory tracker's split by device kind: what optimizer offload moves
// between the GPU and the host must show on the right side. (The CUDA half
// is in tests/gpu/cuda_runtime_test.cpp.)
#include <gtest/gtest.h>

#include "runtime/comm_test_helpers.h"
#include "support/harness.h"

namespace dtp {
namespace {

TEST(MemoryTrackerDevices, KeepsLiveAndPeakPerDeviceKindAndTheirSum) {
  MemoryTracker tracker;
  tracker.charge(MemoryCategory::optimizer, 100, DeviceKind::cuda);
  tracker.charge(MemoryCategory::optimizer, 40, DeviceKind::cpu);
  EXPECT_EQ(tracker.live(MemoryCategory::optimizer, DeviceKind::cuda), 100);
  EXPECT_EQ(tracker.live(MemoryCategory::optimizer, DeviceKind::cpu), 40);
  EXPECT_EQ(tracker.live(MemoryCategory::optimizer), 140);
  // Offload: the GPU copy goes, the host copy grows.
  tracker.release(MemoryCategory::optimizer, 100, DeviceKind::cuda);
  tracker.charge(MemoryCategory::optimizer, 100, DeviceKind::cpu);
  EXPECT_EQ(tracker.live(MemoryCategory::optimizer, DeviceKind::cuda), 0);
  EXPECT_EQ(tracker.peak(MemoryCategory::optimizer, DeviceKind::cuda), 100);
  EXPECT_EQ(tracker.live(MemoryCategory::optimizer, DeviceKind::cpu), 140);
  EXPECT_EQ(tracker.peak(MemoryCategory::optimizer, DeviceKind::cpu), 140);
  // The category's peak is the peak of the sum (140), not 100 + 140.
  EXPECT_EQ(tracker.peak(MemoryCategory::optimizer), 140);
  EXPECT_EQ(tracker.total_peak(), 140);
  tracker.reset_peaks();
  EXPECT_EQ(tracker.peak(MemoryCategory::optimizer, DeviceKind::cuda), 0);
  EXPECT_EQ(tracker.peak(MemoryCategory::optimizer, DeviceKind::cpu), 140);
}

TEST(MemoryTrackerDevices, TheOneArgumentFormsChargeTheHost) {
  MemoryTracker tracker;
  tracker.charge(MemoryCategory::grads, 8);
  EXPECT_EQ(tracker.live(MemoryCategory::grads, DeviceKind::cpu), 8);
  EXPECT_EQ(tracker.live(MemoryCategory::grads, DeviceKind::cuda), 0);
  tracker.release(MemoryCategory::grads, 8);
  EXPECT_EQ(tracker.live(MemoryCategory::grads, DeviceKind::cpu), 0);
}

TEST(MemoryTrackerDevices, HostTensorsAreChargedToTheHost) {
  auto tracker = std::make_shared<MemoryTracker>();
  set_current_memory_tracker(tracker);
  {
    Tensor params = Tensor::zeros({1000}, DType::f32, Device::cpu(), MemoryCategory::params);
    EXPECT_EQ(tracker->live(MemoryCategory::params, DeviceKind::cpu), 4000);
    EXPECT_EQ(tracker->live(MemoryCategory::params, DeviceKind::cuda), 0);
  }
  EXPECT_EQ(tracker->live(MemoryCategory::params, DeviceKind::cpu), 0);
  EXPECT_EQ(tracker->peak(MemoryCategory::params, DeviceKind::cpu), 4000);
  set_current_memory_tracker(nullptr);
}

TEST(MemoryTrackerDevices, SummaryShowsTheSplitOnlyWhereBothSidesWereUsed) {
  MemoryTracker tracker;
  tracker.charge(MemoryCategory::params, 1 << 20, DeviceKind::cuda);
  tracker.charge(MemoryCategory::optimizer, 1 << 20, DeviceKind::cuda);
  tracker.charge(MemoryCategory::optimizer, 2 << 20, DeviceKind::cpu);
  const std::string text = tracker.summary();
  const std::string optimizer_line = text.substr(text.find("optimizer"));
  EXPECT_TRUE(testing::contains(optimizer_line.substr(0, optimizer_line.find('\n')),
                                "(cpu live 2.000 peak 2.000 MiB, cuda live 1.000 peak 1.000 MiB)"));
  const std::string params_line = text.substr(text.find("params"));
  EXPECT_EQ(params_line.substr(0, params_line.find('\n')).find("cpu live"), std::string::npos)
      << text;
}

TEST(MemoryTrackerDevices, DeviceKindsHaveNames) {
  EXPECT_STREQ(device_kind_name(DeviceKind::cpu), "cpu");
  EXPECT_STREQ(device_kind_name(DeviceKind::cuda), "cuda");
  EXPECT_EQ(Device::cuda(1).kind, DeviceKind::cuda);
}

}  // namespace
}  // namespace dtp
