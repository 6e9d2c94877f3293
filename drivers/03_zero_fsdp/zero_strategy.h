/// @file zero_strategy.h
/// @brief `dtp train --strategy zero` (provided, not a puzzle): chapter 03's
/// stages wired into the trainer.
///
/// A rank builds `Trainer(config, rank, world)` (its sampler yields its
/// slice of the global batch), plugs in the stage the variant selects as
/// zero.h shows (set_optimizer, finish_backward after every backward) and
/// steps. After each step rank 0 gathers what every rank held (peaks per
/// memory category) and moved, next to what a DDP rank holds: the lesson's
/// table, measured. Its checkpoints are consolidated: rank 0 gathers the
/// shards into one file of a single-device run's layout.
#pragma once

#include <memory>
#include <string>

#include "03_zero_fsdp/zero.h"
#include "drivers/strategy.h"

namespace dtp::ch03 {

/// The five stages `dtp train --strategy zero` can run; nothing else is
/// representable (prefetch is stage 3's, offload stage 1's).
enum class ZeroVariant {
  zero1,           ///< --stage 1: Zero1 (3.1)
  zero2,           ///< --stage 2: Zero2 (3.2)
  zero3,           ///< --stage 3: Zero3 (3.3)
  zero3_prefetch,  ///< --stage 3 --prefetch: Zero3Prefetch (3.4)
  zero1_offload,   ///< --stage 1 --offload: Zero1Offload (3.5)
};

/// Every variant, in puzzle order.
inline constexpr ZeroVariant kZeroVariants[] = {ZeroVariant::zero1, ZeroVariant::zero2,
                                                ZeroVariant::zero3, ZeroVariant::zero3_prefetch,
                                                ZeroVariant::zero1_offload};

/// The variant the flags --stage S, --prefetch and --offload select; throws
/// dtp::Error for a stage outside 1-3 and for --prefetch without stage 3 or
/// --offload without stage 1, naming the flags.
ZeroVariant zero_variant(int stage, bool prefetch, bool offload);
/// The stage's name(): "zero1", "zero2", "zero3", "zero3-prefetch" or "zero1-offload".
const char* zero_variant_name(ZeroVariant variant);
/// The puzzle that implements it: "3.1" to "3.5".
const char* zero_puzzle(ZeroVariant variant);
/// Its ZeRO stage: 1, 2 or 3.
int zero_stage(ZeroVariant variant);
/// The variant's stage, built over @p model.
std::unique_ptr<ShardedOptimizer> make_zero_stage(ZeroVariant variant, Comm& comm, GPT& model,
                                                  const TrainConfig& config);

/// Settings of the "zero" strategy.
struct ZeroOptions {
  int world = 2;                             ///< data-parallel ranks (World::from_env)
  ZeroVariant variant = ZeroVariant::zero1;  ///< the stage
};

/// Checks @p options against @p config: world >= 1 and a global batch that
/// splits into equal non-empty slices (config.batch a multiple of world, at
/// least world). Each message names the flag. Throws dtp::Error.
void validate_zero(const TrainConfig& config, const ZeroOptions& options);

/// The "zero" strategy. Its step record has the loss averaged over ranks,
/// the tokens of all ranks and the slowest rank's step time. Its per-rank
/// report: each rank's peak bytes during the step per category ("params
/// peak", "grads peak", "optimizer peak"; on a GPU also "host optimizer
/// peak", what --offload moved off the device) and "moved" (the payload
/// bytes of its collectives), then a row "DDP": what a DDP rank holds of the
/// same model (every buffer whole).
class ZeroStrategy : public drivers::Strategy {
 public:
  ZeroStrategy() = default;
  explicit ZeroStrategy(const ZeroOptions& options) : options(options) {}

  ZeroOptions options;  ///< what --world, --stage, --prefetch and --offload set

  std::string name() const override { return "zero"; }
  std::string title() const override { return "ZeRO / FSDP"; }
  std::string chapter() const override { return "03"; }
  std::string save_note() const override {
    return "rank 0 gathers every rank's shards into one file";
  }
  void add_flags(drivers::FlagGroup& flags) override;
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override;
  void validate(const TrainConfig& config) const override { validate_zero(config, options); }
  int world_size() const override { return options.world; }
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;

 private:
  // The flags, read into a variant by resolve().
  int stage_flag_ = 1;
  bool prefetch_flag_ = false;
  bool offload_flag_ = false;
};

}  // namespace dtp::ch03
