// `dtp train --strategy zero`: the chapter's stages wired into the trainer.
// Provided code, not a puzzle (see drivers/README.md). A rank builds
// Trainer(config, rank, world) so its sampler yields its slice of the global
// batch, plugs in the stage the options select exactly as zero.h shows
// (set_optimizer, finish_backward after every backward) and steps. After each
// step rank 0 gathers what every rank held (peaks per memory category) and
// moved, and reports it next to what a DDP rank holds: the lesson's table,
// measured. Its checkpoints (--save, --resume) are consolidated: one file in
// a single-device run's layout (sharded_checkpoint.cpp).
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "03_zero_fsdp/zero.h"
#include "dtp/agreement.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp/memory.h"

namespace dtp::ch03 {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::unique_ptr<ShardedOptimizer> make_stage(const ZeroOptions& options, Comm& comm, GPT& model,
                                             const TrainConfig& config) {
  switch (options.stage) {
    case 1:
      if (options.offload) return std::make_unique<Zero1Offload>(comm, model, config);
      return std::make_unique<Zero1>(comm, model, config);
    case 2:
      return std::make_unique<Zero2>(comm, model, config);
    default:
      if (options.prefetch) return std::make_unique<Zero3Prefetch>(comm, model, config);
      return std::make_unique<Zero3>(comm, model, config);
  }
}

// The strategy's own settings: what every rank must share beside the
// trainer's, and what a resumed run must share with the saved one.
std::vector<RunSetting> zero_own_settings(const ZeroOptions& options, int world) {
  return {{"--world", std::to_string(world)},
          {"--stage", std::to_string(options.stage)},
          {"--prefetch", options.prefetch ? "on" : "off"},
          {"--offload", options.offload ? "on" : "off"}};
}

// Optimizer state elements per parameter element of the optimizer the
// config builds: AdamW keeps m and v; SGD a momentum buffer unless momentum is 0.
std::int64_t optimizer_states(const TrainConfig& config) {
  if (config.optimizer == "adamw") return 2;
  return config.momentum != 0 ? 1 : 0;
}

// What a DDP rank holds of the same model: every buffer whole.
struct DdpFootprint {
  std::int64_t params = 0;
  std::int64_t grads = 0;
  std::int64_t optimizer = 0;
};

DdpFootprint ddp_footprint(const TrainConfig& config, const GPT& model) {
  std::int64_t elements = 0;
  for (const Unit* unit : model.units()) elements += unit->numel();
  const auto bytes = elements * static_cast<std::int64_t>(dtype_size(config.model.dtype));
  return {bytes, bytes, optimizer_states(config) * bytes};
}

// What rank 0 gathers from every rank after each step, beside its loss,
// seconds and tokens (reporting traffic, taken after the step was measured).
enum Gathered { kParamsPeak, kGradsPeak, kOptimizerPeak, kHostOptimizerPeak, kBytesMoved, kGatheredCount };

TrainResult run_zero(const TrainConfig& config, const ZeroOptions& options, const StepCallback& on_step) {
  validate_zero(config, options);
  const auto start = Clock::now();
  TrainResult result;
  result.peak_by_category.assign(kMemoryCategoryCount, 0);
  launch(World::from_env(options.world), [&](Comm& comm) {
    Trainer trainer(config, comm.rank(), comm.size());
    GPT& model = trainer.model();
    // Before the stage exists: every stage takes its shards from the full
    // parameters, and ZeRO-3 then releases them.
    load_parameters(model, config);
    const std::vector<RunSetting> own = zero_own_settings(options, comm.size());
    check_ranks_agree(comm, run_settings(config, own), model);
    const DdpFootprint ddp = ddp_footprint(trainer.config(), model);
    if (comm.rank() == 0) {
      result.parameters = model.parameter_count();
      result.data_name = trainer.sampler().data().name();
    }
    std::unique_ptr<ShardedOptimizer> zero = make_stage(options, comm, model, trainer.config());
    ShardedOptimizer& stage = *zero;
    trainer.on_after_backward([&stage] { stage.finish_backward(); });
    trainer.set_optimizer(std::move(zero));
    // Checkpoints are consolidated (sharded_checkpoint.cpp): each rank keeps
    // its shards of the full tensors.
    if (!config.resume_path.empty())
      stage.restore_shards(trainer.resume_gathered(config.resume_path, own), config.resume_path);
    const std::int64_t last = last_step(trainer);

    const DeviceKind trains_on = trainer.config().model.device.kind;
    std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
    while (trainer.steps_done() < last) {
      const std::int64_t bytes_before = comm.stats().collective_bytes;
      StepRecord record = trainer.step();  // resets the tracker's peaks first
      std::vector<double> values(kGatheredCount);
      values[kParamsPeak] = static_cast<double>(tracker->peak(MemoryCategory::params, trains_on));
      values[kGradsPeak] = static_cast<double>(tracker->peak(MemoryCategory::grads, trains_on));
      values[kOptimizerPeak] = static_cast<double>(tracker->peak(MemoryCategory::optimizer, trains_on));
      values[kHostOptimizerPeak] = trains_on == DeviceKind::cpu
                                       ? 0.0
                                       : static_cast<double>(tracker->peak(MemoryCategory::optimizer, DeviceKind::cpu));
      values[kBytesMoved] = static_cast<double>(comm.stats().collective_bytes - bytes_before);
      const std::vector<RankStepRow> rows = report_group_step(comm, record, values);
      if (comm.rank() != 0) continue;
      std::vector<RankMemoryStep> ranks(static_cast<std::size_t>(comm.size()));
      for (int r = 0; r < comm.size(); ++r) {
        const RankStepRow& row = rows[static_cast<std::size_t>(r)];
        const auto bytes = [&](Gathered what) { return static_cast<std::int64_t>(row.extra[what]); };
        RankMemoryStep& rank = ranks[static_cast<std::size_t>(r)];
        rank.rank = r;
        rank.loss = row.loss;
        rank.params_peak = bytes(kParamsPeak);
        rank.grads_peak = bytes(kGradsPeak);
        rank.optimizer_peak = bytes(kOptimizerPeak);
        rank.host_optimizer_peak = bytes(kHostOptimizerPeak);
        rank.ddp_params = ddp.params;
        rank.ddp_grads = ddp.grads;
        rank.ddp_optimizer = ddp.optimizer;
        rank.bytes_moved = bytes(kBytesMoved);
      }
      result.add_step(record, *tracker);
      if (on_step) on_step(record);
      if (options.on_memory) options.on_memory(record.step, ranks);
    }
    if (!config.save_path.empty()) {
      std::vector<NamedTensor> gathered = stage.gather_checkpoint();  // collective: every rank
      if (comm.rank() == 0) trainer.save_gathered(config.save_path, own, std::move(gathered));
    }
  });
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace

std::string zero_stage_name(const ZeroOptions& options) {
  if (options.stage == 1) return options.offload ? "zero1-offload" : "zero1";
  if (options.stage == 2) return "zero2";
  return options.prefetch ? "zero3-prefetch" : "zero3";
}

std::string zero_puzzle(const ZeroOptions& options) {
  if (options.stage == 1) return options.offload ? "3.5" : "3.1";
  if (options.stage == 2) return "3.2";
  return options.prefetch ? "3.4" : "3.3";
}

void validate_zero(const TrainConfig& config, const ZeroOptions& options) {
  DTP_CHECK(options.world >= 1, "zero: --world (ranks) must be at least 1, got ", options.world);
  DTP_CHECK(options.stage >= 1 && options.stage <= 3, "zero: --stage must be 1, 2 or 3, got ", options.stage);
  DTP_CHECK(!options.prefetch || options.stage == 3,
            "zero: --prefetch is implemented for --stage 3 (puzzle 3.4), got --stage ", options.stage);
  DTP_CHECK(!options.offload || options.stage == 1,
            "zero: --offload is implemented for --stage 1 (puzzle 3.5), got --stage ", options.stage);
  DTP_CHECK(config.batch >= options.world, "zero: the global batch (--batch ", config.batch,
            ") is smaller than the world size (--world ", options.world,
            "): every rank needs at least one sequence");
  DTP_CHECK(config.batch % options.world == 0, "zero: the global batch (--batch ", config.batch,
            ") must divide evenly by --world ", options.world, " (equal slices on every rank)");
}

void register_zero_strategy(const ZeroOptions& options) {
  register_strategy("zero", [options](const TrainConfig& config, const StepCallback& on_step) {
    return run_zero(config, options, on_step);
  });
}

}  // namespace dtp::ch03
