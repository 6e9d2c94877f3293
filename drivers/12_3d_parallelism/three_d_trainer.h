/// @file three_d_trainer.h
/// @brief Chapter 12's training step on a dp x pp x tp mesh (provided, not
/// a puzzle): what `dtp train --strategy 3d` and the checkers run.
///
/// Each rank builds the serial model (through a Trainer of its DP replica,
/// which also gives the sampler of its rows), copies out its stages' TP
/// slices and releases the serial weights. A step zeroes the gradients,
/// runs three_d_step (12.2), clips by the global norm (12.3) and updates
/// this rank's slices.
#pragma once

#include <memory>

#include "12_3d_parallelism/three_d.h"
#include "dtp/trainer.h"

namespace dtp::ch12 {

/// One rank of a 3D run.
class ThreeDTrainer {
 public:
  /// Builds the model from @p config (from config.load_path's parameters
  /// when set) on @p mesh, which must outlive the trainer. Throws
  /// dtp::Error when the global batch does not split into the DP replicas.
  ThreeDTrainer(const TrainConfig& config, Mesh& mesh, const ThreeDOptions& options);
  ~ThreeDTrainer();
  /// One step. Its record holds the loss of the whole global batch and the
  /// global gradient norm, the same on every rank.
  StepRecord step();
  /// This rank's part of the model.
  ThreeDModel& model() { return *model_; }
  /// The serial Trainer under it (its model released): steps done, the
  /// optimizer over this rank's slices, the sampler of its DP replica.
  Trainer& trainer() { return *serial_; }
  /// The config as resolved (vocabulary and context filled in).
  const TrainConfig& config() const { return config_; }

 private:
  TrainConfig config_;
  Mesh& mesh_;
  std::unique_ptr<Trainer> serial_;  // its model's buffers are released
  std::unique_ptr<ThreeDModel> model_;
};

}  // namespace dtp::ch12
