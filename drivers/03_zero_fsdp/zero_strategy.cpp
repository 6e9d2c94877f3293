// `dtp train --strategy zero`: the chapter's stages wired into the trainer
// (drivers/03_zero_fsdp/zero_strategy.h says how).
#include "drivers/03_zero_fsdp/zero_strategy.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch03 {
namespace {

// Optimizer state elements per parameter element of the optimizer the
// config builds: AdamW keeps m and v; SGD a momentum buffer unless momentum is 0.
std::int64_t optimizer_states(const TrainConfig& config) {
  if (config.optimizer == "adamw") return 2;
  return config.momentum != 0 ? 1 : 0;
}

// What rank 0 gathers from every rank after each step, beside its loss,
// seconds and tokens (reporting traffic, taken after the step was measured).
enum Gathered {
  kParamsPeak,
  kGradsPeak,
  kOptimizerPeak,
  kHostOptimizerPeak,
  kBytesMoved,
  kGatheredCount
};

// One rank: its Trainer, whose optimizer is the stage.
class ZeroRank : public drivers::RankRun {
 public:
  ZeroRank(const TrainConfig& config, ZeroVariant variant, Comm& comm)
      : comm_(comm), trainer_(config, comm.rank(), comm.size()) {
    GPT& model = trainer_.model();
    // Before the stage exists: every stage takes its shards from the full
    // parameters, and ZeRO-3 then releases them.
    load_parameters(model, config);
    std::int64_t elements = 0;
    for (const Unit* unit : model.units()) elements += unit->numel();
    ddp_bytes_ = elements * static_cast<std::int64_t>(dtype_size(trainer_.config().model.dtype));
    ddp_optimizer_bytes_ = optimizer_states(trainer_.config()) * ddp_bytes_;
    std::unique_ptr<ShardedOptimizer> zero =
        make_zero_stage(variant, comm, model, trainer_.config());
    stage_ = zero.get();
    trainer_.on_after_backward([stage = stage_] { stage->finish_backward(); });
    trainer_.set_optimizer(std::move(zero));
  }

  Trainer& trainer() override { return trainer_; }

  // Each rank keeps its shards of the consolidated file's full tensors.
  void resume(const std::string& path, const std::vector<RunSetting>& settings) override {
    stage_->restore_shards(trainer_.resume_gathered(path, settings), path);
  }

  void save(Comm& world, const std::string& path,
            const std::vector<RunSetting>& settings) override {
    std::vector<NamedTensor> gathered = stage_->gather_checkpoint();  // collective: every rank
    if (world.rank() == 0) trainer_.save_gathered(path, settings, std::move(gathered));
  }

  StepRecord step() override {
    bytes_before_ = comm_.stats().collective_bytes;
    return trainer_.step();  // resets the tracker's peaks first
  }

  std::vector<double> report_values() override {
    const MemoryTracker& tracker = *current_memory_tracker();
    const DeviceKind trains_on = trainer_.config().model.device.kind;
    std::vector<double> values(kGatheredCount);
    values[kParamsPeak] = static_cast<double>(tracker.peak(MemoryCategory::params, trains_on));
    values[kGradsPeak] = static_cast<double>(tracker.peak(MemoryCategory::grads, trains_on));
    values[kOptimizerPeak] =
        static_cast<double>(tracker.peak(MemoryCategory::optimizer, trains_on));
    // On a GPU, what --offload keeps in host memory; on the CPU that is the device.
    values[kHostOptimizerPeak] =
        trains_on == DeviceKind::cpu
            ? 0.0
            : static_cast<double>(tracker.peak(MemoryCategory::optimizer, DeviceKind::cpu));
    values[kBytesMoved] = static_cast<double>(comm_.stats().collective_bytes - bytes_before_);
    return values;
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    using drivers::ColumnUnit;
    const bool on_gpu = trainer_.config().model.device.kind != DeviceKind::cpu;
    drivers::ReportTable& table = report.ranks;
    table.columns = {{"params peak", ColumnUnit::mebibytes},
                     {"grads peak", ColumnUnit::mebibytes},
                     {"optimizer peak", ColumnUnit::mebibytes}};
    if (on_gpu) table.columns.push_back({"host optimizer peak", ColumnUnit::mebibytes});
    table.columns.push_back({"moved", ColumnUnit::mebibytes});
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const std::vector<double>& e = rows[r].extra;
      std::vector<double> values = {e[kParamsPeak], e[kGradsPeak], e[kOptimizerPeak]};
      if (on_gpu) values.push_back(e[kHostOptimizerPeak]);
      values.push_back(e[kBytesMoved]);
      table.rows.push_back({std::to_string(r), values});
    }
    const double none = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> ddp = {static_cast<double>(ddp_bytes_), static_cast<double>(ddp_bytes_),
                               static_cast<double>(ddp_optimizer_bytes_)};
    if (on_gpu) ddp.push_back(none);
    ddp.push_back(none);
    table.rows.push_back({"DDP", ddp});
    // Where a stage holds more than DDP, say why (the lesson's section 2).
    const std::vector<double>& first = rows.front().extra;
    if (first[kParamsPeak] > static_cast<double>(ddp_bytes_)) {
      char text[400];
      std::snprintf(text, sizeof text,
                    "    note: the parameter peak is above DDP's: the shards plus the whole units "
                    "being gathered "
                    "(two with prefetch) outweigh one model when a unit is a large share of it "
                    "(here %d blocks); "
                    "with more blocks each unit is a smaller share (try --layers 8)\n",
                    trainer_.config().model.layers);
      report.once = text;
    } else if (first[kGradsPeak] > static_cast<double>(ddp_bytes_)) {
      report.once =
          "    note: ZeRO-1 holds more gradient bytes than DDP: the full gradient stays and the "
          "reduce-scatter writes a separate gradient shard (what ZeRO-2 saves)\n";
    }
  }

 private:
  Comm& comm_;
  Trainer trainer_;
  ShardedOptimizer* stage_ = nullptr;  // owned by the trainer
  std::int64_t ddp_bytes_ = 0;         // a DDP rank's parameters, and as many gradient bytes
  std::int64_t ddp_optimizer_bytes_ = 0;
  std::int64_t bytes_before_ = 0;
};

}  // namespace

ZeroVariant zero_variant(int stage, bool prefetch, bool offload) {
  DTP_CHECK(stage >= 1 && stage <= 3, "zero: --stage must be 1, 2 or 3, got ", stage);
  DTP_CHECK(!prefetch || stage == 3,
            "zero: --prefetch is implemented for --stage 3 (puzzle 3.4), got --stage ", stage);
  DTP_CHECK(!offload || stage == 1,
            "zero: --offload is implemented for --stage 1 (puzzle 3.5), got --stage ", stage);
  if (stage == 1) return offload ? ZeroVariant::zero1_offload : ZeroVariant::zero1;
  if (stage == 2) return ZeroVariant::zero2;
  return prefetch ? ZeroVariant::zero3_prefetch : ZeroVariant::zero3;
}

const char* zero_variant_name(ZeroVariant variant) {
  switch (variant) {
    case ZeroVariant::zero1:
      return "zero1";
    case ZeroVariant::zero2:
      return "zero2";
    case ZeroVariant::zero3:
      return "zero3";
    case ZeroVariant::zero3_prefetch:
      return "zero3-prefetch";
    case ZeroVariant::zero1_offload:
      return "zero1-offload";
  }
  return "?";
}

const char* zero_puzzle(ZeroVariant variant) {
  switch (variant) {
    case ZeroVariant::zero1:
      return "3.1";
    case ZeroVariant::zero2:
      return "3.2";
    case ZeroVariant::zero3:
      return "3.3";
    case ZeroVariant::zero3_prefetch:
      return "3.4";
    case ZeroVariant::zero1_offload:
      return "3.5";
  }
  return "?";
}

int zero_stage(ZeroVariant variant) {
  switch (variant) {
    case ZeroVariant::zero2:
      return 2;
    case ZeroVariant::zero3:
    case ZeroVariant::zero3_prefetch:
      return 3;
    default:
      return 1;
  }
}

std::unique_ptr<ShardedOptimizer> make_zero_stage(ZeroVariant variant, Comm& comm, GPT& model,
                                                  const TrainConfig& config) {
  switch (variant) {
    case ZeroVariant::zero1:
      return std::make_unique<Zero1>(comm, model, config);
    case ZeroVariant::zero2:
      return std::make_unique<Zero2>(comm, model, config);
    case ZeroVariant::zero3:
      return std::make_unique<Zero3>(comm, model, config);
    case ZeroVariant::zero3_prefetch:
      return std::make_unique<Zero3Prefetch>(comm, model, config);
    case ZeroVariant::zero1_offload:
      return std::make_unique<Zero1Offload>(comm, model, config);
  }
  return nullptr;
}

void validate_zero(const TrainConfig& config, const ZeroOptions& options) {
  DTP_CHECK(options.world >= 1, "zero: --world (ranks) must be at least 1, got ", options.world);
  DTP_CHECK(config.batch >= options.world, "zero: the global batch (--batch ", config.batch,
            ") is smaller than the world size (--world ", options.world,
            "): every rank needs at least one sequence");
  DTP_CHECK(config.batch % options.world == 0, "zero: the global batch (--batch ", config.batch,
            ") must divide evenly by --world ", options.world, " (equal slices on every rank)");
}

void ZeroStrategy::add_flags(drivers::FlagGroup& flags) {
  drivers::add_world_flag(flags, &options.world, "data-parallel ranks");
  flags.integer("--stage", &stage_flag_, 1, 3, "S",
                "what each rank keeps only a 1/N shard of: 1 the optimizer state (3.1), 2 also the "
                "gradients (3.2), "
                "3 also the parameters (3.3, FSDP)");
  flags.toggle(
      "--prefetch", &prefetch_flag_,
      "with --stage 3: gather the next unit's parameters while the current one computes (3.4)");
  flags.toggle("--offload", &offload_flag_,
               "with --stage 1: keep the optimizer state and its update in host memory (3.5)");
  flags.paragraph(
      "After each kept step, a row per rank: its peak memory per category during the step and the "
      "bytes its collectives moved; then what a DDP rank holds.");
}

void ZeroStrategy::resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
                           int processes) {
  (void)config;
  drivers::default_world_to_processes(options.world, given, processes);
  try {
    options.variant = zero_variant(stage_flag_, prefetch_flag_, offload_flag_);
  } catch (const dtp::Error& e) {
    throw drivers::UsageError(e.what());
  }
}

std::vector<RunSetting> ZeroStrategy::settings(const TrainConfig& config) const {
  (void)config;
  const ZeroVariant v = options.variant;
  return {{"--world", std::to_string(options.world)},
          {"--stage", std::to_string(zero_stage(v))},
          {"--prefetch", v == ZeroVariant::zero3_prefetch ? "on" : "off"},
          {"--offload", v == ZeroVariant::zero1_offload ? "on" : "off"}};
}

std::string ZeroStrategy::header(const TrainConfig& config, const std::string& backend) const {
  const ZeroVariant v = options.variant;
  const char* sharded[] = {"", "optimizer state", "gradients and optimizer state",
                           "parameters, gradients and optimizer state"};
  char line[400];
  std::snprintf(
      line, sizeof line,
      "zero: %d ranks (%s backend), stage %d%s (%s, puzzle %s): %s sharded%s; %lld sequences per "
      "rank\n"
      "zero: after each kept step, per rank: peak MiB per category during the step and the MiB its "
      "collectives moved; then a DDP rank's",
      options.world, backend.c_str(), zero_stage(v),
      v == ZeroVariant::zero3_prefetch  ? " with prefetch"
      : v == ZeroVariant::zero1_offload ? " with offload"
                                        : "",
      zero_variant_name(v), zero_puzzle(v), sharded[zero_stage(v)],
      v == ZeroVariant::zero1_offload ? ", in host memory" : "",
      static_cast<long long>(config.batch / options.world));
  return line;
}

std::unique_ptr<drivers::RankRun> ZeroStrategy::start(const TrainConfig& config,
                                                      Comm& world) const {
  return std::make_unique<ZeroRank>(config, options.variant, world);
}

}  // namespace dtp::ch03

namespace dtp::strategies {
drivers::Strategy& zero() {
  static ch03::ZeroStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
