// The one run loop every strategy shares: launch the ranks, check that they
// agree, start each rank, continue a saved run, step and report, save.
#include <chrono>

#include "drivers/strategy.h"

#include "dtp/agreement.h"
#include "dtp/error.h"
#include "dtp/fault.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/train_run.h"

namespace dtp::drivers {

void RankRun::resume(const std::string& path, const std::vector<RunSetting>& settings) {
  trainer().resume(path, settings);
}

void RankRun::save(Comm& world, const std::string& path, const std::vector<RunSetting>& settings) {
  if (world.rank() == 0) trainer().save(path, settings);
}

void RankRun::report(const std::vector<RankStepRow>& rows, StepReport& report) {
  (void)rows, (void)report;
}

TrainResult run_strategy(const TrainConfig& given, const Strategy& strategy,
                         const ReportCallback& on_report) {
  TrainConfig config = given;
  config.strategy = strategy.name();
  config.validate();
  strategy.validate(config);
  const CheckpointChoice checkpoint = parse_checkpoint(config.checkpoint);
  if (checkpoint.kind != CheckpointChoice::Kind::none) {
    const std::string refusal = strategy.checkpoint_refusal(checkpoint);
    DTP_CHECK(refusal.empty(), "--checkpoint ", config.checkpoint,
              " does not run under --strategy ", strategy.name(), ": ", refusal);
    check_checkpoint_fits(config.checkpoint, config.resolved_model());
  }
  DTP_CHECK(config.resume_path.empty() || config.load_path.empty() || strategy.resume_with_load(),
            "train: --resume continues a run (its parameters and optimizer state) and --load "
            "starts a new one "
            "from saved parameters; give one, not both");
  (void)fault::plan();  // a DTP_FAULT that does not parse stops the run before it starts
  return train_with_outputs(config, [&](const StepCallback& logged) {
    const auto start = std::chrono::steady_clock::now();
    TrainResult result;
    result.peak_by_category.assign(kMemoryCategoryCount, 0);
    launch(World::from_env(strategy.world_size()), [&](Comm& world) {
      const std::vector<RunSetting> settings = strategy.settings(config);
      {
        // Before anything is built: ranks with other settings would build
        // other meshes and enter other collectives. Every rank builds the
        // same model from the seed, so its initial parameters are compared
        // too (rank 0's against each other rank's).
        const GPT probe(config.resolved_model());
        check_ranks_agree(world, run_settings(config, settings), probe);
      }
      std::unique_ptr<RankRun> rank = strategy.start(config, world);
      install_checkpointing(config.checkpoint, rank->trainer().model());
      if (!config.resume_path.empty()) rank->resume(config.resume_path, settings);
      const std::int64_t last = last_step(rank->trainer());
      if (world.rank() == 0) {
        result.parameters = rank->parameter_count();
        result.data_name = rank->trainer().sampler().data().name();
      }
      std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
      while (rank->trainer().steps_done() < last) {
        // DTP_FAULT (dtp/fault.h): a rank planned to fail at this step does so here.
        fault::at_step(world, rank->trainer().steps_done() + 1);
        StepReport report;
        report.record = rank->step();  // resets the tracker's peaks first
        const std::vector<RankStepRow> rows =
            report_group_step(world, report.record, rank->report_values(), rank->group_rule());
        if (world.rank() != 0) continue;
        result.add_step(report.record, *tracker);
        logged(report.record);
        rank->report(rows, report);
        if (on_report) on_report(report);
      }
      if (!config.save_path.empty()) rank->save(world, config.save_path, settings);  // collective
      rank->finish(world);
    });
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  });
}

void add_world_flag(FlagGroup& flags, int* world, const std::string& what) {
  flags.integer("--world", world, 1, 1024, "N", what,
                std::to_string(*world) + "; under mpiexec: the processes");
}

void default_world_to_processes(int& world, const std::vector<GivenFlag>& given, int processes) {
  if (processes > 0 && !cli::was_given(given, "--world")) world = processes;
}

}  // namespace dtp::drivers
