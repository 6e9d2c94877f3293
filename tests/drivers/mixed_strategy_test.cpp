// Checkers of the provided mixed-precision driver
// (drivers/07_mixed_precision/mixed_strategy.cpp), linked with the
// reference: its option checks, and what `dtp train --precision` reports:
// the loss scale on every step, skipped steps, and the ranks' mean loss;
// and its checkpoints (a run in slices equals the run never stopped).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "07_mixed_precision/mixed_precision.h"
#include "drivers/07_mixed_precision/mixed_strategy.h"
#include "dtp/dtp.h"
#include "support/checkpoints.h"
#include "support/harness.h"

namespace dtp::ch07 {
namespace {

using testing::error_of;

// The strategy with @p options, as `dtp train --precision` runs it.
testing::RunFn run_with(const MixedPrecisionRunOptions& options) {
  return [options](const TrainConfig& c) {
    return drivers::run_strategy(c, MixedPrecisionStrategy(options));
  };
}

TrainConfig tiny_run(DType precision, std::int64_t steps) {
  TrainConfig config;
  config.model.dtype = precision;
  config.model.d_model = 16;
  config.model.heads = 2;
  config.steps = steps;
  config.batch = 4;
  config.seq = 8;
  config.warmup = 2;
  config.strategy = "mixed";
  return config;
}

TEST(MixedDriverOptions, RefusesBadSettingsNamingThem) {
  MixedPrecisionRunOptions options;
  EXPECT_NE(error_of([&] {
              validate_mixed_precision(tiny_run(DType::f32, 1), options);
            }).find("the model must be bf16 or f16"),
            std::string::npos);
  for (const char* bad : {"-4", "0", "inf", "nan", "big", "12x", ""})
    EXPECT_NE(error_of([&] {
                parse_loss_scale(bad);
              }).find(std::string("expected dynamic, none or a number > 0, got '") + bad + "'"),
              std::string::npos)
        << bad;
  EXPECT_EQ(parse_loss_scale("1024").value, 1024.0);
  EXPECT_EQ(parse_loss_scale("dynamic").kind, LossScale::Kind::dynamic);
  EXPECT_EQ(loss_scale_for(options, DType::f16).kind, LossScale::Kind::dynamic) << "f16's default";
  EXPECT_EQ(loss_scale_for(options, DType::bf16).kind, LossScale::Kind::none) << "bf16's default";
  options.loss_scale = LossScale{LossScale::Kind::fixed, -1.0};
  EXPECT_NE(error_of([&] {
              validate_mixed_precision(tiny_run(DType::f16, 1), options);
            }).find("a fixed --loss-scale must be finite and > 0, got -1"),
            std::string::npos);
  options.loss_scale = parse_loss_scale("1024");
  EXPECT_EQ(error_of([&] { validate_mixed_precision(tiny_run(DType::f16, 1), options); }),
            "(no error)");
  TrainConfig on_gpu = tiny_run(DType::bf16, 1);
  on_gpu.model.device = Device::cuda(0);
  EXPECT_EQ(error_of([&] { validate_mixed_precision(on_gpu, options); }), "(no error)")
      << "the CUDA kernels take bf16 and f16";
  options.world = 3;
  EXPECT_NE(error_of([&] {
              validate_mixed_precision(tiny_run(DType::f16, 1), options);
            }).find("must divide evenly by --world 3"),
            std::string::npos);
}

TEST(MixedDriverRun, ReportsTheScaleOfEveryStepAndNoneForBf16) {
  const testing::RunFn run = run_with({});
  const TrainResult f16 = run(tiny_run(DType::f16, 3));
  ASSERT_EQ(f16.steps.size(), 3u);
  for (const StepRecord& r : f16.steps) {
    EXPECT_EQ(r.loss_scale, 65536.0)
        << "step " << r.step << ": f16's default is the dynamic scale from 2^16";
    EXPECT_FALSE(r.skipped) << "step " << r.step;
    EXPECT_TRUE(std::isfinite(r.loss) && r.loss > 0) << "step " << r.step;
  }
  const TrainResult bf16 = run(tiny_run(DType::bf16, 2));
  for (const StepRecord& r : bf16.steps)
    EXPECT_EQ(r.loss_scale, 0.0) << "bf16 runs without a scale by default";
  EXPECT_NE(step_json(f16.steps[0]).find("\"loss_scale\":65536"), std::string::npos)
      << step_json(f16.steps[0]);
  EXPECT_NE(format_step(f16.steps[0], 3).find("scale 65536"), std::string::npos);
}

TEST(MixedDriverRun, AStaticScaleThatOverflowsSkipsEveryStepAndSaysSo) {
  MixedPrecisionRunOptions options;
  options.loss_scale = parse_loss_scale("1e30");  // every f16 gradient overflows
  const TrainResult run = run_with(options)(tiny_run(DType::f16, 2));
  for (const StepRecord& r : run.steps) {
    EXPECT_TRUE(r.skipped) << "step " << r.step
                           << ": a scale of 1e30 overflows f16, so the step is skipped";
    EXPECT_EQ(r.loss_scale, 1e30) << "a static scale stays where it is";
  }
  EXPECT_NE(format_summary(run).find("2 of 2 steps skipped"), std::string::npos)
      << format_summary(run);
  EXPECT_NE(step_json(run.steps[0]).find("\"skipped\":true"), std::string::npos);
}

TEST(MixedDriverRun, TwoRanksReportTheMeanOfTheirLosses) {
  if (!testing::world_fits(2)) GTEST_SKIP() << "needs 2 ranks";
  MixedPrecisionRunOptions options;
  const TrainResult one = run_with(options)(tiny_run(DType::bf16, 1));
  options.world = 2;
  const TrainResult two = run_with(options)(tiny_run(DType::bf16, 1));
  // The global batch is the same; its mean loss is the mean of the halves'.
  EXPECT_NEAR(two.steps[0].loss, one.steps[0].loss, 1e-6 * one.steps[0].loss);
  EXPECT_EQ(two.steps[0].tokens, one.steps[0].tokens) << "tokens count every rank's";
}

// bf16 and f16 training on the GPU follows the CPU's: both compute every op
// in f32 and round what they store, so they differ only where the order of
// f32 sums does (and cuBLAS's tensor cores sum in their own order). Ten steps
// of the tiny model: the losses within 2% (a wrong kernel is off by far
// more), and fp16's scale schedule the same on both.
TEST(MixedDriverRun, SixteenBitTrainingOnTheGpuFollowsTheCpu) {
  DTP_REQUIRE_GPU();
  const testing::RunFn run = run_with({});
  for (DType precision : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(precision));
    TrainConfig on_gpu = tiny_run(precision, 10);
    on_gpu.model.device = Device::cuda(0);
    const TrainResult cpu = run(tiny_run(precision, 10)), gpu = run(on_gpu);
    ASSERT_EQ(gpu.steps.size(), cpu.steps.size());
    for (std::size_t s = 0; s < cpu.steps.size(); ++s) {
      EXPECT_NEAR(gpu.steps[s].loss, cpu.steps[s].loss, 2e-2 * cpu.steps[s].loss)
          << "step " << cpu.steps[s].step << ": the GPU's loss against the CPU's";
      EXPECT_EQ(gpu.steps[s].loss_scale, cpu.steps[s].loss_scale) << "step " << cpu.steps[s].step;
      EXPECT_EQ(gpu.steps[s].skipped, cpu.steps[s].skipped) << "step " << cpu.steps[s].step;
    }
  }
}

// --- checkpoints: the masters, their optimizer state and the scaler go on ----------------

TEST(MixedDriverCheckpoints, ASlicedRunEqualsTheStraightOneThroughSkipsAndGrowth) {
  testing::TempFolder folder;
  MixedPrecisionRunOptions options;
  options.loss_scale = LossScale{LossScale::Kind::dynamic};
  // Starts too high for f16, so the first steps overflow and halve the scale;
  // then it doubles after every 2 good steps and overflows again.
  options.dynamic_scaler = ScalerConfig{1048576.0, 2.0, 0.5, 2};
  TrainConfig config = tiny_run(DType::f16, 10);
  config.optimizer = "adamw";
  for (const std::int64_t split : {2, 5, 7}) {
    const std::vector<StepRecord> straight =
        testing::expect_slices_equal_straight_run(config, split, folder, "f16", run_with(options));
    int skipped = 0, grown = 0;
    for (std::size_t s = 0; s < straight.size(); ++s) {
      skipped += straight[s].skipped;
      grown += s > 0 && straight[s].loss_scale > straight[s - 1].loss_scale;
    }
    ASSERT_GT(skipped, 0) << "the case must skip a step (2^20 overflows f16's gradients)";
    ASSERT_GT(grown, 0) << "the case must grow the scale (every 2 good steps)";
  }
}

TEST(MixedDriverCheckpoints, Bf16OnTwoRanksResumesBitForBit) {
  if (!testing::world_fits(2)) GTEST_SKIP() << "needs 2 ranks";
  testing::TempFolder folder;
  MixedPrecisionRunOptions options;
  options.world = 2;
  testing::expect_slices_equal_straight_run(tiny_run(DType::bf16, 6), 4, folder, "bf16 on 2 ranks",
                                            run_with(options));
  options.reduce_dtype = DType::bf16;
  TrainConfig other = tiny_run(DType::bf16, 6);
  other.resume_path = folder.file("slice.ckpt");
  const std::string message = error_of([&] { run_with(options)(other); });
  EXPECT_NE(message.find(
                "strategy_settings.--reduce-dtype \"f32\" in the saved run, \"bf16\" in this one"),
            std::string::npos)
      << message;
}

// --load of an f32 run's file under --precision bf16: the masters start from
// the f32 values themselves, not from their bf16 rounding. With an update
// of lr 1e-30 (SGD, no momentum) a master of magnitude above 1e-6 cannot
// move, so after one step the saved masters must equal the file's values.
TEST(MixedDriverCheckpoints, LoadingAnF32FileStartsTheMastersFromItsValues) {
  testing::TempFolder folder;
  TrainConfig pretrain = tiny_run(DType::f32, 2);
  pretrain.strategy = "single";
  pretrain.save_path = folder.file("f32.ckpt");
  train(pretrain);
  TrainConfig tune = tiny_run(DType::bf16, 1);
  tune.optimizer = "sgd";
  tune.momentum = 0;
  tune.lr = 1e-30;
  tune.grad_clip = 0;
  tune.load_path = pretrain.save_path;
  tune.save_path = folder.file("bf16.ckpt");
  run_with({})(tune);
  const Checkpoint base = read_checkpoint(pretrain.save_path);
  const Checkpoint tuned = read_checkpoint(tune.save_path);
  GPT model(tune.model);
  int compared = 0, rounded = 0;
  for (Unit* unit : model.units()) {
    const std::vector<double> master = tuned.tensor("extra/master/" + unit->name()).to_vector();
    for (const ParamView& p : unit->parameters()) {
      const std::vector<double> want =
          base.tensor("params/" + unit->name() + "." + p.name).to_vector();
      const std::vector<double> model16 =
          tuned.tensor("params/" + unit->name() + "." + p.name).to_vector();
      for (std::size_t i = 0; i < want.size(); ++i) {
        if (std::fabs(want[i]) < 1e-6) continue;
        ++compared;
        rounded += model16[i] != want[i];
        ASSERT_EQ(master[static_cast<std::size_t>(p.offset) + i], want[i])
            << unit->name() << "." << p.name << " element " << i << ": the f32 file holds "
            << want[i] << "; the master started from "
            << master[static_cast<std::size_t>(p.offset) + i]
            << (master[static_cast<std::size_t>(p.offset) + i] == model16[i]
                    ? " (its bf16 rounding)"
                    : "");
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(rounded, compared / 2)
      << "the case must hold values that bf16 rounds (else it shows nothing)";
}

}  // namespace
}  // namespace dtp::ch07
