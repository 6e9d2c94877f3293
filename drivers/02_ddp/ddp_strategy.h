/// @file ddp_strategy.h
/// @brief `dtp train --strategy ddp` (provided, not a puzzle): chapter 02's
/// puzzles wired into the trainer.
///
/// A rank builds `Trainer(config, rank, world)`, so its sampler yields its
/// slice of the global batch, and plugs gradient averaging in where it
/// belongs: with K = 1, Trainer::step() with on_after_backward (2.1, 2.2,
/// 2.3's finish; 2.3 also hooks the model's grad-ready callbacks); with
/// K > 1, a step written out around accumulation_step (2.4), whose one
/// synchronization per step is flat (2.2), or naive (2.1) in naive mode.
#pragma once

#include <cstdint>
#include <string>

#include "02_ddp/ddp.h"
#include "drivers/strategy.h"

namespace dtp::ch02 {

/// How `dtp train --strategy ddp` synchronizes gradients.
enum class DdpMode {
  naive,     ///< 2.1: one all-reduce per parameter
  flat,      ///< 2.2: one all-reduce per unit
  bucketed,  ///< 2.3: buckets overlapped with backward
};

/// "naive", "flat" or "bucketed".
const char* ddp_mode_name(DdpMode mode);

/// DdpOptions::bucket_bytes meaning "choose from the model" (default_bucket_bytes).
inline constexpr std::int64_t kAutoBucketBytes = -1;
/// About how many buckets the default bucket size makes of a model's gradients.
inline constexpr std::int64_t kDefaultBucketCount = 4;

/// Settings of the "ddp" strategy.
struct DdpOptions {
  int world = 2;                     ///< data-parallel ranks (World::from_env)
  DdpMode mode = DdpMode::bucketed;  ///< how gradients are averaged
  /// 2.3's bucket size in bytes; kAutoBucketBytes: default_bucket_bytes(model).
  std::int64_t bucket_bytes = kAutoBucketBytes;
  std::int64_t accumulate = 1;  ///< micro-batches per optimizer step (2.4)
};

/// The bucket size that splits @p model's gradients into about
/// kDefaultBucketCount buckets (gradient bytes / kDefaultBucketCount), so
/// that the default run overlaps communication with backward.
std::int64_t default_bucket_bytes(const GPT& model);

/// options.bucket_bytes, or default_bucket_bytes(model) for kAutoBucketBytes.
std::int64_t resolve_bucket_bytes(const DdpOptions& options, const GPT& model);

/// Checks @p options against @p config: world >= 1, accumulate >= 1,
/// bucket_bytes >= 0 or kAutoBucketBytes, and config.batch divisible by
/// world * accumulate (the message names --batch, --world and --accumulate;
/// no overflow for huge values). Throws dtp::Error.
void validate_ddp(const TrainConfig& config, const DdpOptions& options);

/// The "ddp" strategy. Every rank checks first that all ranks agree on
/// their settings and initial parameters. Its step record has the loss
/// averaged over ranks, the tokens of all ranks and the slowest rank's step
/// time (so tokens/s is global). Its per-rank report (columns "loss",
/// "all-reduces", "all-reduced", "exposed"): each rank's loss, its
/// all-reduce calls and bytes, and the time its thread waited on
/// communication (exposed, not overlapped with backward). The replicas are
/// equal, so rank 0 alone writes --save and every rank reads --resume.
class DdpStrategy : public drivers::Strategy {
 public:
  DdpStrategy() = default;
  explicit DdpStrategy(const DdpOptions& options) : options(options) {}

  DdpOptions options;  ///< what --world, --ddp-mode, --bucket-mb and --accumulate set

  std::string name() const override { return "ddp"; }
  std::string title() const override { return "Data parallel"; }
  std::string chapter() const override { return "02"; }
  void add_flags(drivers::FlagGroup& flags) override;
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override;
  void validate(const TrainConfig& config) const override { validate_ddp(config, options); }
  int world_size() const override { return options.world; }
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;
};

}  // namespace dtp::ch02
