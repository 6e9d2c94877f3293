// Optimizers on flat buffers against hand-computed steps, the learning-rate
// schedule, clipping by global norm, and optimizer-state memory.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/nn_ops.h"
#include "dtp/optim.h"

namespace dtp {
namespace {

std::vector<ParamBuffer> one_buffer(const std::vector<double>& params,
                                    const std::vector<double>& grads, DType dtype = DType::f64) {
  return {{"w", Tensor::from_values(params, dtype), Tensor::from_values(grads, dtype)}};
}

TEST(NnOptim, AdamWMatchesHandComputedSteps) {
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  auto buffers = one_buffer({1.0, -2.0}, {0.5, 0.0});
  AdamW adam(buffers, {b1, b2, eps, wd});
  adam.step(lr);
  // Step 1: m = 0.05, v = 0.00025, m^ = 0.5, v^ = 0.25:
  // p = 1 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.01 * 1).
  EXPECT_NEAR(buffers[0].params.item(0), 1 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.01), 1e-15);
  EXPECT_NEAR(buffers[0].params.item(0), 0.899000002, 1e-9);
  // A zero gradient still decays the weight (decoupled decay): -2 * (1 - 0.001).
  EXPECT_NEAR(buffers[0].params.item(1), -1.998, 1e-15);
  EXPECT_NEAR(adam.first_moment(0).item(0), 0.05, 1e-15);
  EXPECT_NEAR(adam.second_moment(0).item(0), 0.00025, 1e-15);

  // Step 2 with g = -1, bias corrections 1 - 0.9^2 and 1 - 0.999^2.
  buffers[0].grads.set_item(0, -1.0);
  const double p1 = buffers[0].params.item(0);
  adam.step(lr);
  const double m = 0.9 * 0.05 + 0.1 * -1.0, v = 0.999 * 0.00025 + 0.001 * 1.0;
  const double mhat = m / (1 - 0.81), vhat = v / (1 - 0.999 * 0.999);
  EXPECT_NEAR(buffers[0].params.item(0), p1 - lr * (mhat / (std::sqrt(vhat) + eps) + wd * p1),
              1e-14);
  EXPECT_EQ(adam.steps(), 2);
}

TEST(NnOptim, SgdMomentumMatchesHandComputedSteps) {
  auto buffers = one_buffer({1.0}, {0.5});
  SGD sgd(buffers, {0.9, 0.0, false});
  sgd.step(0.1);
  EXPECT_NEAR(buffers[0].params.item(0), 0.95, 1e-15);  // buf = 0.5
  sgd.step(0.1);
  EXPECT_NEAR(buffers[0].params.item(0), 0.855, 1e-15);  // buf = 0.95
  EXPECT_NEAR(sgd.momentum_buffer(0).item(0), 0.95, 1e-15);

  auto nesterov = one_buffer({1.0}, {0.5});
  SGD sgd_n(nesterov, {0.9, 0.1, true});
  sgd_n.step(0.1);
  // g' = 0.5 + 0.1 * 1 = 0.6; buf = 0.6; p -= 0.1 * (0.6 + 0.9 * 0.6).
  EXPECT_NEAR(nesterov[0].params.item(0), 1 - 0.1 * (0.6 + 0.54), 1e-15);

  auto plain = one_buffer({1.0}, {0.5});
  SGD sgd_plain(plain, {0.0, 0.0, false});
  sgd_plain.step(0.2);
  EXPECT_NEAR(plain[0].params.item(0), 0.9, 1e-15);
  EXPECT_FALSE(sgd_plain.momentum_buffer(0).defined());
}

TEST(NnOptim, UpdatesWorkOnShardsLikeOnWholeBuffers) {
  // ZeRO updates a slice of a buffer; the result must be the same elements.
  std::vector<double> p = {1, 2, 3, 4, 5}, g = {0.1, -0.2, 0.3, -0.4, 0.5};
  auto whole = one_buffer(p, g, DType::f32);
  AdamW whole_adam(whole, {0.9, 0.95, 1e-8, 0.1});
  whole_adam.step(0.01);
  auto sharded = one_buffer(p, g, DType::f32);
  std::vector<ParamBuffer> shards;
  for (int r = 0; r < 2; ++r) {
    ChunkRange range = chunk_range(5, 2, r);
    shards.push_back({"shard", sharded[0].params.slice(range.offset, range.length),
                      sharded[0].grads.slice(range.offset, range.length)});
  }
  AdamW shard_adam(shards, {0.9, 0.95, 1e-8, 0.1});
  shard_adam.step(0.01);
  EXPECT_TRUE(ops::equal(whole[0].params, sharded[0].params));
}

TEST(NnOptim, StateIsChargedAsOptimizerMemory) {
  auto tracker = std::make_shared<MemoryTracker>();
  set_current_memory_tracker(tracker);
  {
    auto buffers =
        one_buffer(std::vector<double>(100, 1.0), std::vector<double>(100, 0.0), DType::f32);
    AdamW adam(buffers);
    EXPECT_EQ(tracker->live(MemoryCategory::optimizer), 2 * 100 * 4);
    SGD sgd(buffers);
    EXPECT_EQ(tracker->live(MemoryCategory::optimizer), 3 * 100 * 4);
  }
  EXPECT_EQ(tracker->live(MemoryCategory::optimizer), 0);
  set_current_memory_tracker(nullptr);
}

TEST(NnOptim, ScheduleWarmsUpLinearlyThenFollowsACosine) {
  LRSchedule s{1.0, 0.1, 10, 110};
  EXPECT_NEAR(s.at(0), 0.1, 1e-15);
  EXPECT_NEAR(s.at(4), 0.5, 1e-15);
  EXPECT_NEAR(s.at(9), 1.0, 1e-15);
  EXPECT_NEAR(s.at(10), 1.0, 1e-15);
  EXPECT_NEAR(s.at(60), 0.55, 1e-15);  // half way: min + (max - min) / 2
  EXPECT_NEAR(s.at(35), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_NEAR(s.at(110), 0.1, 1e-15);
  EXPECT_NEAR(s.at(1000), 0.1, 1e-15);
  LRSchedule constant{0.5, 0.5, 0, 10};
  EXPECT_EQ(constant.at(3), 0.5);
}

TEST(NnOptim, ClipByGlobalNormScalesEveryBufferAndReturnsTheNorm) {
  std::vector<Tensor> grads = {Tensor::from_values({3.0}), Tensor::from_values({0.0, 4.0})};
  EXPECT_NEAR(global_grad_norm(grads), 5.0, 1e-15);
  EXPECT_NEAR(clip_grad_norm(grads, 1.0), 5.0, 1e-15);
  EXPECT_NEAR(grads[0].item(0), 0.6, 1e-6);
  EXPECT_NEAR(grads[1].item(1), 0.8, 1e-6);
  EXPECT_NEAR(global_grad_norm(grads), 1.0, 1e-6);
  // Below the limit, or with clipping off, nothing changes.
  EXPECT_NEAR(clip_grad_norm(grads, 2.0), 1.0, 1e-6);
  EXPECT_NEAR(grads[1].item(1), 0.8, 1e-6);
  clip_grad_norm(grads, 0.0);
  EXPECT_NEAR(grads[1].item(1), 0.8, 1e-6);
}

TEST(NnOptim, MismatchedBuffersAreRejected) {
  std::vector<ParamBuffer> bad = {{"w", Tensor::from_values({1, 2}), Tensor::from_values({1})}};
  try {
    AdamW adam(bad);
    FAIL() << "params and grads of different sizes must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  auto ok = one_buffer({1.0}, {1.0});
  EXPECT_THROW(SGD(ok, {1.5, 0, false}), Error);
}

// A 16-bit parameter would lose every update smaller than its spacing: the
// update kernels refuse it, on every device, and say what to do instead.
TEST(NnOptim, SixteenBitParametersAreRefusedNamingMasterWeights) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    Tensor p = Tensor::from_values({1.0, 2.0}, dtype), g = Tensor::from_values({0.5, 0.5}, dtype);
    Tensor m = Tensor::zeros({2}, dtype), v = Tensor::zeros({2}, dtype), none;
    for (const auto& [what, update] : std::vector<std::pair<const char*, std::function<void()>>>{
             {"adamw_update",
              [&] { ops::adamw_update(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.0, 1); }},
             {"sgd_update", [&] { ops::sgd_update(p, g, none, 0.1, 0.0); }}}) {
      try {
        update();
        ADD_FAILURE() << what << " on " << dtype_name(dtype) << " parameters must be refused";
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(std::string(what) + ": params is " + dtype_name(dtype)),
                  std::string::npos)
            << message;
        EXPECT_NE(message.find("f32 master weights"), std::string::npos) << message;
      }
    }
    EXPECT_EQ(p.to_vector(), (std::vector<double>{1.0, 2.0})) << "a refused update changes nothing";
  }
}

}  // namespace
}  // namespace dtp
