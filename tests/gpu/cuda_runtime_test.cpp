// CUDA tensors and the thread backend on one GPU. These skip where no GPU is
// usable and fail instead under DTP_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include <cstdint>
#if DTP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "support/all_to_all_v_case.h"
#include "support/harness.h"

namespace dtp {
namespace {

World gpu_world(int size) {
  World world;
  world.size = size;
  world.device = Device::cuda(0);
  world.timeout_seconds = 30;
  return world;
}

TEST(CudaTensor, CopiesFillsAndRandomValuesMatchTheCpu) {
  DTP_REQUIRE_GPU();
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor host = testing::pattern_tensor(3, 1001, dtype);
    Tensor device = host.to(Device::cuda(0));
    EXPECT_EQ(device.device(), Device::cuda(0));
    EXPECT_EQ(device.to_vector(), host.to_vector());
    Tensor copy = Tensor::zeros({1001}, dtype, Device::cuda(0));
    copy.copy_from(device);  // device to device
    EXPECT_EQ(copy.slice(500, 3).to_vector(), host.slice(500, 3).to_vector());
    copy.fill(2);
    EXPECT_EQ(copy.item(1000), 2);
    copy.set_item(7, 5);
    EXPECT_EQ(copy.item(7), 5);
  }
  for (DType dtype :
       {DType::f32, DType::f64}) {  // f64 shows an ulp of a fused multiply-add on the device
    SCOPED_TRACE(dtype_name(dtype));
    Tensor cpu = Tensor::random_uniform({4097}, 42, -2, 3, dtype);
    Tensor gpu = Tensor::random_uniform({4097}, 42, -2, 3, dtype, Device::cuda(0));
    EXPECT_EQ(gpu.to_vector(), cpu.to_vector());
  }
}

#if DTP_HAVE_CUDA
TEST(CudaTensor, FreedMemoryStaysInThePoolAcrossSynchronizations) {
  DTP_REQUIRE_GPU();
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  {
    Tensor big =
        Tensor::zeros({16 << 20}, DType::f32, Device::cuda(0));  // 64 MiB, freed at the brace
    EXPECT_EQ(big.item(0), 0);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::uint64_t reserved = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved),
            cudaSuccess);
  // With the default release threshold (0) the synchronization would have
  // handed the 64 MiB back to the driver, and the next step would map them again.
  EXPECT_GE(reserved, std::uint64_t{64} << 20) << "the device pool released freed memory at a "
                                                  "synchronization (release threshold not raised)";
}
#endif

TEST(CudaTensor, DeviceMemoryIsChargedToTheTracker) {
  DTP_REQUIRE_GPU();
  auto tracker = std::make_shared<MemoryTracker>();
  set_current_memory_tracker(tracker);
  {
    Tensor x = Tensor::zeros({1000}, DType::f32, Device::cuda(0), MemoryCategory::params);
    EXPECT_EQ(tracker->live(MemoryCategory::params), 4000);
  }
  EXPECT_EQ(tracker->live(MemoryCategory::params), 0);
  set_current_memory_tracker(nullptr);
}

TEST(CudaTensor, DeviceMemoryIsChargedToTheGpuSideOfTheTracker) {
  DTP_REQUIRE_GPU();
  auto tracker = std::make_shared<MemoryTracker>();
  set_current_memory_tracker(tracker);
  {
    Tensor on_gpu = Tensor::zeros({1000}, DType::f32, Device::cuda(0), MemoryCategory::optimizer);
    Tensor on_host = on_gpu.to(Device::cpu());  // an offloaded copy: same category, the host's side
    EXPECT_EQ(tracker->live(MemoryCategory::optimizer, DeviceKind::cuda), 4000);
    EXPECT_EQ(tracker->live(MemoryCategory::optimizer, DeviceKind::cpu), 4000);
    EXPECT_EQ(tracker->live(MemoryCategory::optimizer), 8000);
    EXPECT_NE(tracker->summary().find("cuda live"), std::string::npos) << tracker->summary();
  }
  EXPECT_EQ(tracker->live(MemoryCategory::optimizer, DeviceKind::cuda), 0);
  EXPECT_EQ(tracker->peak(MemoryCategory::optimizer, DeviceKind::cuda), 4000);
  set_current_memory_tracker(nullptr);
}

TEST(CudaOps, AccumulateAndScaleMatchTheCpu) {
  DTP_REQUIRE_GPU();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    Tensor a = testing::pattern_tensor(1, 777, DType::f32),
           b = testing::pattern_tensor(2, 777, DType::f32);
    Tensor ga = a.to(Device::cuda(0)), gb = b.to(Device::cuda(0));
    ops::accumulate(a, b, op);
    ops::accumulate(ga, gb, op);
    EXPECT_EQ(ga.to_vector(), a.to_vector()) << reduce_op_name(op);
  }
  Tensor x = testing::pattern_tensor(0, 99, DType::f64), gx = x.to(Device::cuda(0));
  ops::scale(x, 0.25);
  ops::scale(gx, 0.25);
  EXPECT_EQ(gx.to_vector(), x.to_vector());
}

TEST(CudaThreadBackend, SendRecvBetweenRanksSharingOneGpu) {
  DTP_REQUIRE_GPU();
  std::vector<std::vector<double>> got(4);
  launch(gpu_world(4), [&](Comm& comm) {
    const int n = comm.size(), r = comm.rank();
    EXPECT_TRUE(comm.device().is_cuda());
    Tensor out = testing::pattern_tensor(r, 10007, DType::f32, comm.device());
    Tensor in = Tensor::zeros({10007}, DType::f32, comm.device());
    comm.send(out, (r + 1) % n);
    out.fill(0);  // queued after the send's copy on this rank's stream
    comm.recv(in, (r + n - 1) % n);
    got[r] = in.to_vector();
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(testing::values_equal(
        "gpu ring exchange", r, testing::pattern_values((r + 3) % 4, 10007, DType::f32), got[r]));
}

class CudaLibraryCollectives : public ::testing::TestWithParam<int> {};

TEST_P(CudaLibraryCollectives, MatchTheExactSums) {
  DTP_REQUIRE_GPU();
  const int n = GetParam();
  for (std::int64_t len :
       {std::int64_t{1}, std::int64_t{n + 3}, std::int64_t{4 * 1024 * 1024 + 5}}) {
    std::vector<std::vector<double>> reduced(n), gathered(n), scattered(n);
    launch(gpu_world(n), [&](Comm& comm) {
      const int r = comm.rank();
      Tensor x = testing::pattern_tensor(r, len, DType::f32, comm.device());
      comm.all_reduce(x);
      reduced[r] = x.to_vector();
      ChunkRange mine = chunk_range(len, n, r);
      Tensor shard = Tensor::zeros({mine.length}, DType::f32, comm.device());
      comm.reduce_scatter(testing::pattern_tensor(r, len, DType::f32, comm.device()), shard);
      scattered[r] = shard.to_vector();
      Tensor full = Tensor::zeros({len}, DType::f32, comm.device());
      comm.all_gather(shard, full);
      gathered[r] = full.to_vector();
    });
    std::vector<double> sum = testing::pattern_sum(n, len, DType::f32);
    for (int r = 0; r < n; ++r) {
      ChunkRange mine = chunk_range(len, n, r);
      EXPECT_TRUE(testing::values_equal("gpu all_reduce", r, sum, reduced[r], n));
      EXPECT_TRUE(
          testing::values_equal("gpu all_gather of reduce_scatter", r, sum, gathered[r], n));
      EXPECT_TRUE(testing::values_equal(
          "gpu reduce_scatter", r,
          std::vector<double>(sum.begin() + mine.offset, sum.begin() + mine.offset + mine.length),
          scattered[r]));
    }
  }
}

TEST_P(CudaLibraryCollectives, AllToAllVMovesEveryBlockWithItsOwnCount) {
  DTP_REQUIRE_GPU();
  const int n = GetParam();
  launch(gpu_world(n), [n](Comm& comm) {
    testing::AllToAllVCase exchange(comm.rank(), n, DType::f32, comm.device());
    comm.all_to_all_v(exchange.in, exchange.send_counts, exchange.out, exchange.recv_counts);
    EXPECT_TRUE(exchange.received_everything());
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CudaLibraryCollectives, ::testing::Range(1, 9),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace dtp
