/// @file mixed_strategy.h
/// @brief `dtp train --precision bf16|fp16` (the strategy "mixed";
/// provided, not a puzzle): chapter 07's puzzles wired into the trainer.
///
/// Each rank builds `Trainer(config, rank, world)` for its 16-bit model and
/// its slice of the batch, keeps f32 master weights and an optimizer over
/// them, and runs 7.2's step (one rank) or 7.4's (several), with 7.3's loss
/// scaler when one is asked for. A checkpoint holds the 16-bit model, the
/// f32 masters, their optimizer state and the scaler's scale and count, so
/// a resumed run goes on exactly where the saved one stopped; --load starts
/// the masters from a file of any float dtype.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "07_mixed_precision/mixed_precision.h"
#include "drivers/strategy.h"

namespace dtp::ch07 {

/// `--loss-scale`: how the loss is scaled.
struct LossScale {
  /// dynamic: GradScaler's schedule from 2^16; none: no scaling and no
  /// skipping; fixed: a static scale (steps that overflow are still skipped).
  enum class Kind { dynamic, none, fixed };
  Kind kind = Kind::none;  ///< which of the three
  double value = 0;        ///< the scale of Kind::fixed
  /// "dynamic", "none" or the fixed scale.
  std::string str() const;
};

/// Parses "dynamic", "none" or a finite number > 0; throws dtp::Error
/// naming what it accepts.
LossScale parse_loss_scale(const std::string& text);

/// How the "mixed" strategy runs: 7.2's step on one device, 7.4's on
/// --world ranks, with 7.3's scaler. The model's dtype (config.model.dtype,
/// bf16 or f16) is the precision.
struct MixedPrecisionRunOptions {
  /// --loss-scale; unset: loss_scale_for()'s default for the precision.
  std::optional<LossScale> loss_scale;
  /// The dynamic scaler's settings (initial scale, growth, backoff, interval):
  /// GradScaler's defaults unless a test or a benchmark sets them.
  ScalerConfig dynamic_scaler;
  /// The dtype the gradients are averaged in on more than one rank: f32 or
  /// the model's.
  DType reduce_dtype = DType::f32;
  int world = 1;  ///< data-parallel ranks (7.4); 1: one device (7.2)
};

/// options.loss_scale, or the default for @p precision: dynamic for f16
/// (whose gradients underflow), none for bf16 (f32's range).
LossScale loss_scale_for(const MixedPrecisionRunOptions& options, DType precision);

/// Throws dtp::Error naming the setting that is wrong.
void validate_mixed_precision(const TrainConfig& config, const MixedPrecisionRunOptions& options);

/// The "mixed" strategy, chosen by --precision bf16|fp16 (which sets the
/// model's dtype). Its step record carries the loss scale and whether the
/// update was skipped.
class MixedPrecisionStrategy : public drivers::Strategy {
 public:
  MixedPrecisionStrategy() = default;
  explicit MixedPrecisionStrategy(const MixedPrecisionRunOptions& options) : options(options) {}

  MixedPrecisionRunOptions options;  ///< what --world, --loss-scale and --reduce-dtype set

  std::string name() const override { return "mixed"; }
  std::string title() const override { return "Mixed precision"; }
  std::string chapter() const override { return "07"; }
  std::string chosen_by() const override { return "--precision bf16|fp16"; }
  bool chosen(const std::vector<drivers::GivenFlag>& given) const override;
  std::string load_note() const override {
    return "the f32 masters take them as they are, the model their rounding";
  }
  void add_flags(drivers::FlagGroup& flags) override;
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override;
  void validate(const TrainConfig& config) const override {
    validate_mixed_precision(config, options);
  }
  int world_size() const override { return options.world; }
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;
  /// On more than one rank, what 7.4's step is built of: 7.2's casts and
  /// (with a scaler) 7.3's unscale and update, each alone.
  std::vector<drivers::PuzzleCall> puzzle_calls(const TrainConfig& config) const override;

 private:
  std::string precision_ = "fp32";  // --precision
};

}  // namespace dtp::ch07
