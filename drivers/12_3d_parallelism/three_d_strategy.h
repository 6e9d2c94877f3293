/// @file three_d_strategy.h
/// @brief `dtp train --strategy 3d` (provided, not a puzzle): chapter 12's
/// step on a dp x pp x tp mesh, placed tiers first (12.1).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "12_3d_parallelism/three_d.h"
#include "drivers/strategy.h"

namespace dtp::ch12 {

/// Settings of the "3d" strategy.
struct ThreeDRunOptions {
  MeshShape shape{1, 2, 2};  ///< --dp, --pp, --tp
  ThreeDOptions
      model;  ///< --schedule, --chunks, --microbatches, --no-sequence-parallel, --recompute
};

/// Checks @p options against @p config; each message names the flag.
/// Throws dtp::Error: --save or --resume given (a rank's slices are its
/// own), zb-h1, --chunks without interleaved (or under 2 with it),
/// --microbatches not a multiple of --pp for interleaved, the batch not
/// splitting into --dp x --microbatches, layers not into --pp x --chunks,
/// heads or vocabulary not over --tp, a micro-batch's tokens not over --tp
/// under sequence parallelism.
void validate_three_d(const TrainConfig& config, const ThreeDRunOptions& options);

/// The "3d" strategy. Its record has the loss of the whole global batch;
/// its per-rank report (rows "w (dp d, pp p, tp t)"): parameter bytes,
/// activation peak, and the bytes its TP and DP collectives moved and its
/// pipeline sends carried in the step.
class ThreeDStrategy : public drivers::Strategy {
 public:
  ThreeDStrategy() = default;
  /// The strategy with @p options (the checkers' way in).
  explicit ThreeDStrategy(const ThreeDRunOptions& options) : options(options) {}
  ThreeDRunOptions options;  ///< what its flags set

  std::string name() const override { return "3d"; }
  std::string title() const override { return "3D parallel"; }
  std::string chapter() const override { return "12"; }
  void add_flags(drivers::FlagGroup& flags) override;
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override;
  void validate(const TrainConfig& config) const override { validate_three_d(config, options); }
  int world_size() const override { return options.shape.dp * options.shape.pp * options.shape.tp; }
  std::string world_text() const override;
  std::string checkpoint_refusal(const drivers::CheckpointChoice&) const override {
    return "its blocks are chapter 04's TensorParallelBlock units, not dtp::Block, so no "
           "activation policy reaches them (--recompute recomputes every block)";
  }
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;

 private:
  bool no_sequence_parallel_ = false;
};

}  // namespace dtp::ch12
