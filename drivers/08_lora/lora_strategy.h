/// @file lora_strategy.h
/// @brief `dtp train --lora-rank R` (the strategy "lora"; provided, not a
/// puzzle): chapter 08's puzzles wired into the trainer.
///
/// Every rank builds `Trainer(config, rank, world)`, copies
/// config.load_path's parameters into its model (the base; without one, the
/// model's own initialization), attaches a LoraModel and trains its adapters
/// alone with the configured optimizer (8.4 averaging them over the ranks).
/// The adapters are the run's checkpoint: --save writes them
/// ("extra/block.<i>.lora": small, what --resume reads) and their optimizer
/// state; the base never changes, so --resume reads it from --load again.
/// --save-merged writes the merged model's parameters (a "model" checkpoint
/// that --load reads).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "08_lora/lora.h"
#include "drivers/strategy.h"

namespace dtp::ch08 {

/// Settings of `dtp train --lora-rank R` (the "lora" strategy).
struct LoraRunOptions {
  LoraConfig lora;  ///< --lora-rank, --lora-alpha (default 2r), --lora-targets
  int world = 1;    ///< data-parallel ranks (8.4); 1: one device
  /// --save-merged: where rank 0 writes the merged model at the end (empty:
  /// nowhere). --save (TrainConfig::save_path) writes the adapters instead.
  std::string save_merged_path;
};

/// Throws dtp::Error naming the setting that is wrong (rank, alpha, targets,
/// world and batch).
void validate_lora(const TrainConfig& config, const LoraRunOptions& options);

/// The "lora" strategy, chosen by --lora-rank R. With several ranks, a line
/// after each kept step says what the step all-reduced: the adapter
/// gradients' bytes.
class LoraStrategy : public drivers::Strategy {
 public:
  LoraStrategy() = default;
  explicit LoraStrategy(const LoraRunOptions& options) : options(options) {}

  LoraRunOptions
      options;  ///< what --lora-rank, --lora-alpha, --lora-targets, --world, --save-merged set

  std::string name() const override { return "lora"; }
  std::string title() const override { return "LoRA"; }
  std::string chapter() const override { return "08"; }
  std::string chosen_by() const override { return "--lora-rank R"; }
  bool chosen(const std::vector<drivers::GivenFlag>& given) const override;
  std::string load_note() const override { return "the frozen base"; }
  std::string save_note() const override { return "the adapters and their optimizer state"; }
  bool resume_with_load() const override { return true; }
  std::vector<std::pair<std::string, std::string>> outputs() const override {
    return {{"--save-merged", options.save_merged_path}};
  }
  void add_flags(drivers::FlagGroup& flags) override;
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override;
  void validate(const TrainConfig& config) const override { validate_lora(config, options); }
  int world_size() const override { return options.world; }
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;
  /// 8.1's adapter arithmetic and (with --save-merged) 8.2's merge, each
  /// alone: the run reaches 8.3's model (and 8.4's hooks) first.
  std::vector<drivers::PuzzleCall> puzzle_calls(const TrainConfig& config) const override;
};

}  // namespace dtp::ch08
