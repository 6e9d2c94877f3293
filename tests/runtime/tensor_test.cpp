// Tensor, dtype and memory-tracker checks.
#include <gtest/gtest.h>

#include <cmath>

#include "dtp/dtp.h"

namespace dtp {
namespace {

TEST(ChunkRange, CeilChunksWithShortTail) {
  // 10 in 4: 3, 3, 3, 1.  5 in 4: 2, 2, 1, 0.  1 in 4: 1, 0, 0, 0.
  std::vector<std::vector<std::int64_t>> expected = {{3, 3, 3, 1}, {2, 2, 1, 0}, {1, 0, 0, 0}};
  std::vector<std::int64_t> lengths = {10, 5, 1};
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    std::int64_t offset = 0;
    for (int i = 0; i < 4; ++i) {
      ChunkRange r = chunk_range(lengths[k], 4, i);
      EXPECT_EQ(r.length, expected[k][i]) << lengths[k] << " elements, chunk " << i;
      EXPECT_EQ(r.offset, std::min(offset, lengths[k])) << lengths[k] << " elements, chunk " << i;
      offset += r.length;
    }
    EXPECT_EQ(offset, lengths[k]);
  }
  EXPECT_THROW(chunk_range(10, 0, 0), Error);
  EXPECT_THROW(chunk_range(10, 4, 4), Error);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_values({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, DType::f32);
  std::vector<Tensor> parts = t.chunk(4);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[3].numel(), 1);
  EXPECT_EQ(parts[3].item(0), 9);
  parts[1].fill(-1);
  EXPECT_EQ(t.item(3), -1);
  EXPECT_EQ(t.item(5), -1);
  EXPECT_EQ(t.item(6), 6);
  EXPECT_TRUE(parts[1].shares_storage_with(t));
  Tensor grid = t.view({2, 5});
  EXPECT_EQ(grid.size(0), 2);
  EXPECT_EQ(grid.size(1), 5);
  EXPECT_EQ(grid.slice(7, 2).item(1), 8);
  Tensor copy = t.clone();
  EXPECT_FALSE(copy.shares_storage_with(t));
  copy.fill(0);
  EXPECT_EQ(t.item(0), 0);
  EXPECT_EQ(t.item(9), 9);
}

TEST(Tensor, ErrorsSayWhatWasExpected) {
  Tensor t = Tensor::zeros({2, 3}, DType::f32);
  try {
    t.view({4, 2});
    FAIL() << "view with the wrong element count must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("6 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(t.slice(4, 3), Error);
  EXPECT_THROW(t.chunk(0), Error);
  EXPECT_THROW(Tensor::zeros({1, 1, 1, 1, 1}), Error);
  Tensor other = Tensor::zeros({5}, DType::f32);
  EXPECT_THROW(t.copy_from(other), Error);
  EXPECT_THROW(Tensor().raw(), Error);
  EXPECT_THROW(parse_device("gpu0"), Error);
  EXPECT_THROW(parse_dtype("float"), Error);
  EXPECT_THROW(Tensor::zeros({2}, DType::f32, Device::cuda(0)), Error);
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
}

TEST(Dtype, SixteenBitConversionsRoundToNearestEven) {
  for (float v : {0.0f, 1.0f, -2.5f, 256.0f, 3.140625f, 65504.0f}) {
    EXPECT_EQ(f16_to_float(float_to_f16(v)), v) << v;
  }
  for (float v : {0.0f, 1.0f, -2.5f, 256.0f, 3.140625f}) {
    EXPECT_EQ(bf16_to_float(float_to_bf16(v)), v) << v;
  }
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_float(float_to_f16(5.9604645e-8f)), 5.9604645e-8f);  // smallest subnormal
  Tensor h = Tensor::from_values({1.5, -3}, DType::f16);
  EXPECT_EQ(h.item(0), 1.5);
  EXPECT_EQ(h.item(1), -3);
}

TEST(MemoryTracker, ChargesLiveAndPeakPerCategory) {
  auto tracker = std::make_shared<MemoryTracker>();
  set_current_memory_tracker(tracker);
  {
    Tensor params = Tensor::zeros({1000}, DType::f32, Device::cpu(), MemoryCategory::params);
    {
      Tensor grads = Tensor::zeros({500}, DType::f64, Device::cpu(), MemoryCategory::grads);
      EXPECT_EQ(tracker->live(MemoryCategory::grads), 4000);
      Tensor view = grads.chunk(2)[1];  // views allocate nothing
      EXPECT_EQ(tracker->total_live(), 8000);
    }
    EXPECT_EQ(tracker->live(MemoryCategory::params), 4000);
    EXPECT_EQ(tracker->live(MemoryCategory::grads), 0);
    EXPECT_EQ(tracker->peak(MemoryCategory::grads), 4000);
    EXPECT_EQ(tracker->total_peak(), 8000);
    tracker->reset_peaks();
    EXPECT_EQ(tracker->total_peak(), 4000);
  }
  EXPECT_EQ(tracker->total_live(), 0);
  set_current_memory_tracker(nullptr);
}

TEST(Ops, AccumulateAndScale) {
  Tensor a = Tensor::from_values({1, 5, -2}, DType::f32);
  Tensor b = Tensor::from_values({4, 2, -3}, DType::f32);
  Tensor s = a.clone();
  ops::accumulate(s, b);
  EXPECT_EQ(s.to_vector(), (std::vector<double>{5, 7, -5}));
  Tensor m = a.clone();
  ops::accumulate(m, b, ReduceOp::max);
  EXPECT_EQ(m.to_vector(), (std::vector<double>{4, 5, -2}));
  Tensor n = a.clone();
  ops::accumulate(n, b, ReduceOp::min);
  EXPECT_EQ(n.to_vector(), (std::vector<double>{1, 2, -3}));
  ops::scale(s, 0.5);
  EXPECT_EQ(s.to_vector(), (std::vector<double>{2.5, 3.5, -2.5}));
  EXPECT_THROW(ops::accumulate(s, Tensor::zeros({2})), Error);
  Tensor ints = Tensor::from_values({1, 2}, DType::i32);
  EXPECT_THROW(ops::scale(ints, 2), Error);
}

}  // namespace
}  // namespace dtp
