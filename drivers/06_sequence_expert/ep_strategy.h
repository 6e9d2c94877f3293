/// @file ep_strategy.h
/// @brief `dtp train --strategy ep` (provided, not a puzzle): puzzle 6.7
/// trained inside the GPT.
///
/// The ranks are data parallel for everything but the experts: each takes
/// its slice of the batch, routes its own tokens, and each block's experts
/// run on the rank that holds them through ExpertParallelMoe, installed as
/// the block's MoeCore. After the backward the replicated gradients are
/// averaged over the group as in DDP; an owned expert's gradient already
/// holds every rank's tokens' share (the exchange brought them), so it is
/// only divided by the group size.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "06_sequence_expert/sequence_expert.h"
#include "drivers/strategy.h"

namespace dtp::ch06 {

/// Settings of the "ep" strategy.
struct ExpertParallelRunOptions {
  int world = 2;  ///< ranks: each holds E / world experts and 1 / world of the batch
};

/// Checks @p options against @p config: a mixture of experts (--moe-experts)
/// whose E divides over world; the global batch divides over world; one
/// routing group (each rank's tokens are its group). Each message names the
/// flag. Throws dtp::Error.
void validate_expert_parallel(const TrainConfig& config, const ExpertParallelRunOptions& options);

/// One rank of an expert-parallel group (data parallel for everything but
/// the experts): its slice of the batch, the replicated non-expert weights,
/// and experts [j E/m, (j+1) E/m) of every block, run by ExpertParallelMoe
/// (a MoeCore per block); the rank's model holds no other experts' weights
/// or gradients. Non-expert gradients are averaged over the group;
/// an owned expert's gradient (summed over every rank's tokens by the
/// exchange) is divided by m; the optimizer holds only what this rank owns.
/// Equals single-device training with config.model.moe_groups = m.
class ExpertParallelTrainer {
 public:
  /// Builds the model from @p config and one core per block; @p ep must
  /// outlive the trainer.
  ExpertParallelTrainer(const TrainConfig& config, Comm& ep);
  ~ExpertParallelTrainer();
  /// Zeroes the gradients, forward and backward of this rank's slice of the
  /// next step's batch, the gradient averaging; returns the loss averaged
  /// over the group.
  double forward_backward();
  /// forward_backward(), clipping by the global norm (owned experts' norms
  /// summed over the group), the optimizer update of what this rank owns.
  StepRecord step();
  /// The model. It holds only this rank's experts (GPTConfig::expert_shards):
  /// the others' parameters have no memory here.
  GPT& model();
  /// The Trainer under it: the model, the optimizer over what this rank
  /// updates, and the steps done.
  Trainer& trainer() { return *trainer_; }
  /// Collective over the group: writes a consolidated checkpoint to @p path
  /// (provided, ep_checkpoint.cpp). Rank 0 gathers every rank's experts and
  /// their optimizer state and writes a single-device run's layout, as ZeRO
  /// does in chapter 03.
  void save(const std::string& path, const std::vector<RunSetting>& strategy);
  /// Continues the run that saved @p path (Trainer::resume_gathered): the
  /// replicated parameters and state, and this rank's experts' own.
  void resume(const std::string& path, const std::vector<RunSetting>& strategy);
  /// This rank's sampler (its slice of each global batch).
  const BatchSampler& sampler() const { return trainer_->sampler(); }
  /// The first expert this rank holds.
  int first_expert() const { return first_; }
  /// How many experts it holds.
  int local_experts() const { return local_; }
  /// Choices dropped in the last forward (this rank's tokens, every block).
  std::int64_t dropped() const;
  /// Payload bytes this rank's collectives moved so far (each call its whole buffer).
  std::int64_t bytes_moved() const;
  /// The config as resolved.
  const TrainConfig& config() const;

 private:
  // save()'s collective part: the whole model's tensors under their
  // single-device names on rank 0, an empty list elsewhere.
  std::vector<NamedTensor> gather_checkpoint();
  struct Chunk {
    Tensor params, grads;  // views into a unit's flat buffers
  };
  Comm& ep_;
  std::unique_ptr<Trainer> trainer_;
  std::vector<std::unique_ptr<MoeCore>> cores_;  // one per block
  std::vector<Chunk> replicated_, owned_;
  int first_ = 0, local_ = 0;
};

/// The "ep" strategy. Its per-rank report (rows "r (experts a-b)"):
/// "tokens" of its slice, "dropped" choices of its tokens (every block) and
/// "moved" (the payload bytes of its collectives). --save: rank 0 gathers
/// every rank's experts and their optimizer state into a single-device
/// run's layout.
class ExpertParallelStrategy : public drivers::Strategy {
 public:
  ExpertParallelStrategy() = default;
  explicit ExpertParallelStrategy(const ExpertParallelRunOptions& options) : options(options) {}

  ExpertParallelRunOptions options;  ///< what --world sets

  std::string name() const override { return "ep"; }
  std::string title() const override { return "Expert parallel"; }
  std::string chapter() const override { return "06"; }
  std::string save_note() const override {
    return "rank 0 gathers every rank's shards into one file";
  }
  void add_flags(drivers::FlagGroup& flags) override;
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override;
  void validate(const TrainConfig& config) const override {
    validate_expert_parallel(config, options);
  }
  int world_size() const override { return options.world; }
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;
  /// 6.6's routing (route_tokens), which 6.7 routes with.
  std::vector<drivers::PuzzleCall> puzzle_calls(const TrainConfig& config) const override;
};

}  // namespace dtp::ch06
