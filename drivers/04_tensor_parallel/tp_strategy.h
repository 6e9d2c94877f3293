/// @file tp_strategy.h
/// @brief `dtp train --strategy tp` (provided, not a puzzle): chapter 04's
/// model trained on a dp x tp mesh.
///
/// Each rank builds the serial model (through a Trainer, which also gives it
/// the sampler of its DP slice), copies out its TP slices and releases the
/// serial weights; a step is forward, backward, finish_backward (the
/// puzzles), clipping by the norm of the whole model and an optimizer update
/// of this rank's slices.
#pragma once

#include <memory>
#include <string>

#include "04_tensor_parallel/tensor_parallel.h"
#include "drivers/strategy.h"

namespace dtp::ch04 {

/// Settings of the "tp" strategy.
struct TensorParallelRunOptions {
  int tp = 2;                      ///< ranks per tensor-parallel group
  int dp = 1;                      ///< data-parallel groups; world = dp x tp
  bool sequence_parallel = false;  ///< --sequence-parallel
};

/// Checks @p options against @p config: tp, dp >= 1; heads, vocab and the
/// MLP width divisible by tp; the global batch a multiple of dp; under
/// sequence parallelism the tokens per rank (batch / dp * seq) divisible by
/// tp. Each message names the flag. Throws dtp::Error.
void validate_tensor_parallel(const TrainConfig& config, const TensorParallelRunOptions& options);

/// One training step of a TP x DP rank: forward, backward, DP mean, clip by
/// the global norm, optimizer update; returns the loss (mean over the DP
/// group). What `dtp train --strategy tp` and the checkers run.
class TensorParallelTrainer {
 public:
  /// Builds the serial model from @p config (through a Trainer of this DP
  /// rank, which also gives the sampler of its slice; from
  /// config.load_path's parameters when set), the TP model from it,
  /// releases the serial weights, and builds the optimizer over the slices.
  /// @p mesh must outlive the trainer.
  TensorParallelTrainer(const TrainConfig& config, Mesh& mesh,
                        const TensorParallelOptions& options);
  ~TensorParallelTrainer();
  /// One step; its record has the loss averaged over the DP group.
  StepRecord step();
  /// The TP model.
  TensorParallelGPT& model() { return *model_; }
  /// The serial Trainer under it (its model released): the steps done and
  /// the optimizer over this rank's slices.
  Trainer& trainer() { return *serial_; }
  /// Collective over the world: writes a consolidated checkpoint to @p path
  /// (provided, tp_checkpoint.cpp). DP group 0's TP ranks put every sliced
  /// parameter and optimizer state tensor back together on world rank 0,
  /// which writes a single-device run's layout.
  void save(const std::string& path, const std::vector<RunSetting>& strategy);
  /// Continues the run that saved @p path: each rank cuts its slices out of
  /// the file's full tensors.
  void resume(const std::string& path, const std::vector<RunSetting>& strategy);
  /// This DP rank's sampler.
  const BatchSampler& sampler() const;
  /// The config as resolved (vocabulary and context filled in).
  const TrainConfig& config() const { return config_; }

 private:
  TrainConfig config_;
  Mesh& mesh_;
  std::unique_ptr<Trainer> serial_;  // its model's buffers are released
  std::unique_ptr<TensorParallelGPT> model_;
};

/// The "tp" strategy. Its step record has the loss averaged over the DP
/// groups and the tokens of one rank per TP group (a TP group shares its
/// slice of the batch). Its per-rank report (rows "r (tp i, dp j)"):
/// "params" (the MemoryCategory::params bytes it holds: its slices and
/// replicas), "activation peak" and "moved" (the payload bytes of its TP and
/// DP collectives in the step). --save: DP group 0's TP ranks put every
/// sliced tensor back together on world rank 0, which writes a
/// single-device run's layout.
class TensorParallelStrategy : public drivers::Strategy {
 public:
  TensorParallelStrategy() = default;
  explicit TensorParallelStrategy(const TensorParallelRunOptions& options) : options(options) {}

  TensorParallelRunOptions options;  ///< what --tp, --dp and --sequence-parallel set

  std::string name() const override { return "tp"; }
  std::string title() const override { return "Tensor parallel"; }
  std::string chapter() const override { return "04"; }
  std::string save_note() const override {
    return "rank 0 gathers every rank's shards into one file";
  }
  void add_flags(drivers::FlagGroup& flags) override;
  void validate(const TrainConfig& config) const override {
    validate_tensor_parallel(config, options);
  }
  int world_size() const override { return options.tp * options.dp; }
  std::string checkpoint_refusal(const drivers::CheckpointChoice&) const override {
    return "its blocks are chapter 04's TensorParallelBlock units, not dtp::Block, so no "
           "activation policy reaches them";
  }
  std::string world_text() const override;
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;
  /// 4.1 to 4.7, each layer alone; 4.8 is the run itself.
  std::vector<drivers::PuzzleCall> puzzle_calls(const TrainConfig& config) const override;
};

}  // namespace dtp::ch04
