/// @file sp_strategy.h
/// @brief `dtp train --strategy sp` (provided, not a puzzle): chapter 06's
/// attention puzzles trained inside the GPT.
///
/// Every rank holds the whole model and the whole batch, and runs it on its
/// positions of every sequence: the embedding adds the positions' own rows,
/// everything but attention acts on one position at a time, and each
/// block's attention reaches the other ranks' positions through the puzzle
/// class installed as its AttentionCore. The gradients are averaged over
/// the group as in DDP.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "06_sequence_expert/sequence_expert.h"
#include "drivers/strategy.h"

namespace dtp::ch06 {

/// Which attention a sequence-parallel run computes with.
enum class SequenceParallelKind {
  ulysses,  ///< 6.1, contiguous positions
  ring,     ///< 6.2 and 6.3, contiguous positions
  zigzag,   ///< 6.4: ring attention on the zigzag layout
  hybrid,   ///< 6.5: Ulysses inside groups, ring across them
};
/// "ulysses", "ring", "zigzag" or "hybrid".
const char* sequence_parallel_kind_name(SequenceParallelKind kind);
/// Parses one of those names; dtp::Error listing the four otherwise.
SequenceParallelKind parse_sequence_parallel_kind(const std::string& name);

/// Settings of the "sp" strategy.
struct SequenceParallelRunOptions {
  int sp = 2;  ///< ranks in the sequence-parallel group (the whole world)
  SequenceParallelKind kind = SequenceParallelKind::ulysses;  ///< --sp-kind
  int ulysses = 2;  ///< --sp-ulysses: ranks per Ulysses group of the hybrid
};

/// Checks @p options against @p config: sp >= 1; seq divisible by sp (2 sp
/// for zigzag); heads divisible by sp (ulysses) or by the Ulysses group
/// (hybrid, whose group must divide sp); no mixture of experts (each rank
/// would route a different share of the tokens). Each message names the
/// flag. Throws dtp::Error.
void validate_sequence_parallel(const TrainConfig& config,
                                const SequenceParallelRunOptions& options);

/// One rank of a sequence-parallel group: the whole model (replicated), the
/// whole batch, and this rank's positions of every sequence. Each block's
/// attention runs through the chosen puzzle class (an AttentionCore per
/// block); the loss is the mean over this rank's positions, and the
/// gradients are averaged over the group (so they are the gradients of the
/// mean over every position, as on one device).
class SequenceParallelTrainer {
 public:
  /// Builds the model from @p config (every rank the same) and one attention
  /// core per block. @p sp must outlive the trainer.
  SequenceParallelTrainer(const TrainConfig& config, Comm& sp,
                          const SequenceParallelRunOptions& options);
  ~SequenceParallelTrainer();
  /// Zeroes the gradients, runs forward and backward of the next step's
  /// batch on this rank's positions and averages the gradients over the
  /// group; returns the loss averaged over the group (the global mean).
  double forward_backward();
  /// forward_backward(), clipping by the global norm, the optimizer update.
  StepRecord step();
  /// The model (every parameter replicated over the group).
  GPT& model();
  /// The Trainer under it: the model, the optimizer and the steps done,
  /// which checkpoints save and resume (rank 0's, as under DDP).
  Trainer& trainer() { return *trainer_; }
  /// The sampler (every rank's: the whole batch).
  const BatchSampler& sampler() const { return trainer_->sampler(); }
  /// The positions of every sequence this rank holds.
  const std::vector<PositionRange>& positions() const { return positions_; }
  /// Payload bytes this rank's collectives and sends moved so far (the
  /// hybrid's sub-groups included).
  std::int64_t bytes_moved() const;
  /// The config as resolved (vocabulary and context filled in).
  const TrainConfig& config() const;

 private:
  Comm& sp_;
  std::unique_ptr<Trainer> trainer_;
  std::vector<std::unique_ptr<AttentionCore>> cores_;  // one per block
  std::vector<PositionRange> positions_;
};

/// The "sp" strategy. Every rank holds the whole batch: its step record
/// counts rank 0's tokens, and the loss is the group's mean. Its per-rank
/// report (rows "r [start, end)": the positions it holds): "activation
/// peak", "moved" (the payload bytes of its collectives and messages) and,
/// for the ring kinds, "attention blocks" (attend_block calls in the step).
/// Rank 0's checkpoint is the run's, as under DDP.
class SequenceParallelStrategy : public drivers::Strategy {
 public:
  SequenceParallelStrategy() = default;
  explicit SequenceParallelStrategy(const SequenceParallelRunOptions& options) : options(options) {}

  SequenceParallelRunOptions options;  ///< what --sp, --sp-kind and --sp-ulysses set

  std::string name() const override { return "sp"; }
  std::string title() const override { return "Sequence parallel"; }
  std::string chapter() const override { return "06"; }
  void add_flags(drivers::FlagGroup& flags) override;
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override;
  void validate(const TrainConfig& config) const override {
    validate_sequence_parallel(config, options);
  }
  int world_size() const override { return options.sp; }
  std::string checkpoint_refusal(const drivers::CheckpointChoice& choice) const override {
    return choice.kind == drivers::CheckpointChoice::Kind::selective
               ? "the attention probabilities live in the sequence-parallel attention core, not "
                 "in the block, so there are none to drop (full and every:K run)"
               : "";
  }
  std::string world_text() const override {
    return "--sp " + std::to_string(options.sp) + " ranks";
  }
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;
  /// The hybrid's pieces: 6.1's two halves and the ring (6.2, 6.3), each alone.
  std::vector<drivers::PuzzleCall> puzzle_calls(const TrainConfig& config) const override;
};

}  // namespace dtp::ch06
