// Checkers for 7.2: the mixed-precision step with f32 master weights, on
// the checker's device (the CPU, or the GPU in the gpu flavour).
//
// The expected values come from the checker's own step, written out with
// the runtime's ops on a second copy of the same model: cast the 16-bit
// gradients up, unscale, clip, AdamW on f32 masters, cast the masters down.
// Same ops in the same order give the same bits, so the comparisons are
// bitwise. The loss-curve and underflow checks compare with an f32 run.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "07_mixed_precision/mixed_precision.h"
#include "dtp/dtp.h"
#include "dtp/memory.h"
#include "dtp/optim.h"
#include "dtp/trainer.h"
#include "mixed_test_helpers.h"

namespace dtp::ch07 {
namespace {

using testing::batch_of;
using testing::CheckerRun;
using testing::first_difference;
using testing::small_config;

TEST(Puzzle7_2_mixed_step, GradsToMasterCastsEachUnitsGradientsUpExactly) {
  GPT model(small_config(DType::bf16));
  const Batch batch = batch_of(model.config(), 2, 1);
  model.forward(batch.inputs, batch.targets);
  model.backward();
  MasterWeights masters(model);
  AdamW adam(masters.buffers());
  masters.grads_to_master(adam);
  const std::vector<Unit*> units = model.units();
  for (std::size_t i = 0; i < units.size(); ++i) {
    const Tensor& g = adam.buffers()[i].grads;
    ASSERT_TRUE(g.defined()) << "after grads_to_master, optimizer buffer " << i << " ("
                             << units[i]->name()
                             << ") has no gradients: attach them with optimizer.set_grads(" << i
                             << ", ...)";
    EXPECT_EQ(g.dtype(), DType::f32) << "buffer " << i << ": the optimizer's gradients must be f32";
    EXPECT_EQ(g.category(), MemoryCategory::other)
        << "buffer " << i
        << ": the f32 gradients live for one update: charge them to MemoryCategory::other";
    const std::string diff = first_difference(units[i]->grads(), g);
    EXPECT_EQ(diff, "") << "buffer " << i << " (" << units[i]->name()
                        << "): the f32 gradients must equal the unit's bf16 gradients exactly: "
                        << diff;
  }
  masters.release_grads(adam);
  for (std::size_t i = 0; i < units.size(); ++i) EXPECT_FALSE(adam.buffers()[i].grads.defined());
}

TEST(Puzzle7_2_mixed_step, MasterToModelRoundsEachMasterToNearestEven) {
  GPT model(small_config(DType::bf16));
  MasterWeights masters(model);
  // Values a bf16 cannot hold (its spacing in [1, 2) is 2^-7): 1 - 0.001
  // rounds to 1; 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (even: 1);
  // 1 + 3 * 2^-8 a tie between 1 + 2^-7 and 1 + 2^-6 (even: 1 + 2^-6).
  const double values[] = {1 - 0.001, 1 + 0x1p-8, 1 + 3 * 0x1p-8, -2.5e-3, 1e-30};
  Tensor master = masters.buffers()[0].params;  // a view: writing it writes the master
  for (std::int64_t i = 0; i < master.numel(); ++i) master.set_item(i, values[i % 5] * (1 + i % 3));
  const std::vector<double> before = master.to_vector();
  masters.master_to_model();
  const std::vector<double> params = model.units()[0]->params().to_vector();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const float m = static_cast<float>(before[i]);
    const double expected = bf16_to_float(float_to_bf16(m));
    if (params[i] != expected) {
      const double truncated =
          bf16_to_float(bf16{static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(m) >> 16)});
      FAIL() << "unit " << model.units()[0]->name() << " element " << i << ": master " << m
             << " must become the bf16 " << expected << " (nearest, ties to even), got "
             << params[i]
             << (params[i] == truncated ? ": truncated instead of rounded (use ops::cast)" : "");
    }
  }
  EXPECT_EQ(master.to_vector(), before)
      << "master_to_model must not change the masters: they keep every bit";
}

TEST(Puzzle7_2_mixed_step, ThreeStepsMatchTheCheckersOwnStepBitForBit) {
  const GPTConfig config = small_config(DType::bf16);
  const double lr = 3e-3, max_norm = 0.5;
  GPT model(config);
  MasterWeights masters(model);
  AdamW adam(masters.buffers());
  CheckerRun expected(config);
  for (int step = 1; step <= 3; ++step) {
    const Batch batch = batch_of(config, 4, step);
    const MixedStep got = mixed_precision_step(masters, adam, nullptr, batch, lr, max_norm);
    const CheckerRun::Step want = expected.step(batch, 1.0, lr, max_norm);
    ASSERT_EQ(got.loss, want.loss)
        << "step " << step << ": the loss must be the model's forward on the batch";
    ASSERT_EQ(got.grad_norm, want.grad_norm)
        << "step " << step
        << ": grad_norm must be the global norm of the f32 gradients before clipping";
    ASSERT_TRUE(got.stepped) << "step " << step << ": without a scaler every step is taken";
    for (std::size_t i = 0; i < expected.masters.size(); ++i) {
      const std::string diff = first_difference(expected.masters[i], masters.buffers()[i].params);
      if (!diff.empty()) {
        const bool unmoved =
            first_difference(expected.masters_before[i], masters.buffers()[i].params).empty();
        FAIL() << "step " << step << ", master of " << model.units()[i]->name() << ": " << diff
               << (unmoved ? "\n    -> the masters did not move: the optimizer must step on the "
                             "f32 gradients "
                             "grads_to_master attached"
                           : "\n    -> expected: cast up, clip_gradients(max_norm), step(lr), in "
                             "that order");
      }
      const std::string model_diff =
          first_difference(expected.model.units()[i]->params(), model.units()[i]->params());
      if (!model_diff.empty())
        FAIL() << "step " << step << ", bf16 parameters of " << model.units()[i]->name() << ": "
               << model_diff
               << "\n    -> after the update the model must be the masters cast down "
                  "(master_to_model)";
    }
    EXPECT_EQ(adam.steps(), step) << "one optimizer step per call";
    for (std::size_t i = 0; i < adam.buffers().size(); ++i)
      EXPECT_FALSE(adam.buffers()[i].grads.defined())
          << "step " << step << ": the f32 gradients of buffer " << i
          << " are still attached: release them after the update (masters.release_grads) so they "
             "are freed";
  }
}

TEST(Puzzle7_2_mixed_step, F16WithTheScalerMatchesTheScaledStepAndSkipsAnOverflow) {
  const GPTConfig config = small_config(DType::f16);
  GPT model(config);
  MasterWeights masters(model);
  AdamW adam(masters.buffers());
  LossScaler scaler({1024.0, 2.0, 0.5, 100});
  CheckerRun expected(config);
  const Batch batch = batch_of(config, 4, 1);
  const MixedStep got = mixed_precision_step(masters, adam, &scaler, batch, 3e-3, 1.0);
  const CheckerRun::Step want = expected.step(batch, 1024.0, 3e-3, 1.0);
  ASSERT_TRUE(got.stepped) << "a good first step was skipped";
  EXPECT_EQ(got.grad_norm, want.grad_norm)
      << "grad_norm is the norm of the true gradients: the f32 norm / scale";
  for (std::size_t i = 0; i < expected.masters.size(); ++i) {
    const std::string diff = first_difference(expected.masters[i], masters.buffers()[i].params);
    ASSERT_EQ(diff, "")
        << "master of " << model.units()[i]->name()
        << " after a step with scale 1024: backward must be called with the scaler's scale "
           "(model.backward(scaler->scale())) and the f32 gradients unscaled by scaler->step: "
        << diff;
  }

  // Now an inf in one gradient, put there as backward finishes the head.
  model.on_grad_ready([](Unit& unit) {
    if (unit.name() == "head") unit.grads().set_item(1, std::numeric_limits<double>::infinity());
  });
  std::vector<std::vector<double>> masters_before, params_before, moments_before;
  for (std::size_t i = 0; i < adam.buffers().size(); ++i) {
    masters_before.push_back(masters.buffers()[i].params.to_vector());
    params_before.push_back(model.units()[i]->params().to_vector());
    moments_before.push_back(adam.first_moment(i).to_vector());
    moments_before.push_back(adam.second_moment(i).to_vector());
  }
  const MixedStep skipped =
      mixed_precision_step(masters, adam, &scaler, batch_of(config, 4, 2), 3e-3, 1.0);
  EXPECT_FALSE(skipped.stepped) << "the head's gradient held an inf: the step must be skipped";
  EXPECT_FALSE(std::isfinite(skipped.grad_norm)) << "grad_norm of an overflowed step is inf or NaN";
  EXPECT_EQ(scaler.scale(), 512.0) << "a skipped step halves the scale";
  for (std::size_t i = 0; i < adam.buffers().size(); ++i) {
    EXPECT_EQ(masters.buffers()[i].params.to_vector(), masters_before[i])
        << "skipped step: the masters of " << model.units()[i]->name() << " changed";
    EXPECT_EQ(model.units()[i]->params().to_vector(), params_before[i])
        << "skipped step: the f16 parameters of " << model.units()[i]->name()
        << " changed (cast the masters down only after a step that was taken)";
    EXPECT_EQ(adam.first_moment(i).to_vector(), moments_before[2 * i])
        << "skipped step: AdamW m changed";
    EXPECT_EQ(adam.second_moment(i).to_vector(), moments_before[2 * i + 1])
        << "skipped step: AdamW v changed";
  }
}

// A constructed case: weights initialized 10x smaller than usual make about
// one gradient element in seven smaller than f16's smallest subnormal
// (2^-24). One SGD step with lr 1 moves each f32 master by its gradient, so
// a gradient lost to underflow is a master that did not move where the f32
// run's did.
double fraction_lost(LossScaler* scaler) {
  GPTConfig config = small_config(DType::f16);
  config.d_model = 32;
  config.init_std = 0.002;
  GPT model(config);
  MasterWeights masters(model);
  SGD sgd(masters.buffers(), {0.0, 0.0, false});
  GPTConfig f32_config = config;
  f32_config.dtype = DType::f32;
  GPT reference(f32_config);
  const Batch batch = batch_of(config, 4, 9);
  std::vector<std::vector<double>> before;
  for (const ParamBuffer& b : masters.buffers()) before.push_back(b.params.to_vector());
  mixed_precision_step(masters, sgd, scaler, batch, 1.0, 0.0);
  reference.forward(batch.inputs, batch.targets);
  reference.backward();
  std::int64_t moved = 0, lost = 0;
  for (std::size_t u = 0; u < before.size(); ++u) {
    const std::vector<double> g = reference.units()[u]->grads().to_vector();
    const std::vector<double> after = masters.buffers()[u].params.to_vector();
    for (std::size_t i = 0; i < g.size(); ++i) {
      const float master_before = static_cast<float>(before[u][i]);
      if (master_before - static_cast<float>(g[i]) == master_before) continue;  // f32 loses it too
      ++moved;
      if (after[i] == master_before) ++lost;
    }
  }
  return static_cast<double>(lost) / static_cast<double>(moved);
}

TEST(Puzzle7_2_mixed_step, F16WithoutScalingLosesSmallGradientsAndWithScalingKeepsThem) {
  const double unscaled = fraction_lost(nullptr);
  EXPECT_GT(unscaled, 0.05)
      << "the constructed case: without loss scaling, f16 backward flushes the gradients "
         "below 2^-24 to zero; expected more than 5% of the masters that f32 moves to stay "
         "put, got "
      << 100 * unscaled << "% (is backward really running in f16?)";
  LossScaler scaler;  // 2^16
  const double scaled = fraction_lost(&scaler);
  EXPECT_LT(scaled, 0.001)
      << "with the loss scaled by 2^16, those gradients are normal f16 numbers; expected under "
         "0.1% of the masters to stay put, got "
      << 100 * scaled << "% (backward must use the scaler's scale)";
}

TEST(Puzzle7_2_mixed_step, MemoryPerParameterIsTwoPlusTwoPlusTwelveBytes) {
  const auto tracker = current_memory_tracker();
  const std::int64_t params0 = tracker->live(MemoryCategory::params);
  const std::int64_t grads0 = tracker->live(MemoryCategory::grads);
  const std::int64_t optimizer0 = tracker->live(MemoryCategory::optimizer);
  const std::int64_t other0 = tracker->live(MemoryCategory::other);
  const GPTConfig config = small_config(DType::bf16);
  GPT model(config);
  MasterWeights masters(model);
  AdamW adam(masters.buffers());
  const std::int64_t N = model.parameter_count();
  tracker->reset_peaks();
  mixed_precision_step(masters, adam, nullptr, batch_of(config, 2, 1), 1e-3, 1.0);
  EXPECT_EQ(tracker->live(MemoryCategory::params) - params0, 2 * N)
      << "params: the bf16 working copy, 2 bytes per parameter (" << N << " parameters)";
  EXPECT_EQ(tracker->live(MemoryCategory::grads) - grads0, 2 * N)
      << "grads: the bf16 gradients, 2 bytes per parameter";
  EXPECT_EQ(tracker->live(MemoryCategory::optimizer) - optimizer0, 12 * N)
      << "optimizer: the f32 master and AdamW's f32 m and v, 12 bytes per parameter";
  EXPECT_EQ(tracker->live(MemoryCategory::other), other0)
      << "after the step nothing else stays: the f32 gradients are freed (release_grads)";
  EXPECT_GE(tracker->peak(MemoryCategory::other) - other0, 4 * N)
      << "during the step the f32 gradients (4 bytes per parameter) are charged to "
         "MemoryCategory::other";
}

// bf16 training follows f32 training: the default `dtp train` model and
// data, 240 steps of 8 sequences of 16 tokens, losses averaged over windows
// of 20 steps (one step's loss is noisy in both). The slow one (3.5 s).
TEST(Puzzle7_2_mixed_step, Bf16LossCurveFollowsF32OverTwoHundredFortySteps) {
  TrainConfig config;
  config.steps = 240;
  config.batch = 8;
  config.seq = 16;
  config.model.device = dtp::testing::checker_device();
  Trainer f32_trainer(config);
  TrainConfig bf16_config = config;
  bf16_config.model.dtype = DType::bf16;
  Trainer bf16_trainer(bf16_config);  // its model, sampler and schedule; the step is yours
  MasterWeights masters(bf16_trainer.model());
  std::unique_ptr<Optimizer> optimizer = make_optimizer(bf16_trainer.config(), masters.buffers());
  const std::int64_t window = 20;
  double f32_sum = 0, bf16_sum = 0, first_f32 = 0, last_f32 = 0;
  for (std::int64_t step = 0; step < config.steps; ++step) {
    f32_sum += f32_trainer.step().loss;
    const Batch batch = bf16_trainer.sampler().batch(step, config.model.device);
    bf16_sum += mixed_precision_step(masters, *optimizer, nullptr, batch,
                                     config.schedule().at(step), config.grad_clip)
                    .loss;
    if ((step + 1) % window == 0) {
      const double f32_mean = f32_sum / window, bf16_mean = bf16_sum / window;
      if (step + 1 == window) first_f32 = f32_mean;
      last_f32 = f32_mean;
      ASSERT_LT(std::abs(bf16_mean - f32_mean), 0.015 * f32_mean + 0.01)
          << "steps " << step + 2 - window << "-" << step + 1 << ": mean loss f32 " << f32_mean
          << ", bf16 " << bf16_mean
          << ": bf16 with f32 masters must stay within 1.5% (+0.01) of f32 (measured: within "
             "0.15%)";
      std::printf("steps %3lld-%3lld  mean loss f32 %.4f  bf16 %.4f\n",
                  static_cast<long long>(step + 2 - window), static_cast<long long>(step + 1),
                  f32_mean, bf16_mean);
      f32_sum = bf16_sum = 0;
    }
  }
  EXPECT_LT(last_f32, first_f32 - 0.3)
      << "the f32 run must learn for the comparison to mean anything";
}

}  // namespace
}  // namespace dtp::ch07
