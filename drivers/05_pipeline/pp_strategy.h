/// @file pp_strategy.h
/// @brief `dtp train --strategy pp` (provided, not a puzzle): the model cut
/// into pipeline stages (times dp replicas, plain or FSDP-sharded), one
/// schedule run by the executor each step.
///
/// Each rank builds the serial model, keeps its stage's units and releases
/// the others; a step is the executor (the puzzles), the DP mean, clipping
/// by the whole model's norm and an update of what the rank holds. Rank 0
/// then gathers every rank's numbers and the actions of pipeline 0, for the
/// report and the bubble on both clocks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "05_pipeline/pipeline.h"
#include "drivers/strategy.h"

namespace dtp::ch05 {

/// A mesh of world = pp x dp ranks for pipeline training. The data-parallel
/// groups are **consecutive** ranks (world rank w is DP rank w % dp of the
/// stage w / dp) because FSDP gathers every unit at every micro-batch and
/// belongs on the fastest links; a pipeline is the ranks with the same DP
/// rank, one per stage. World 4 with pp 2: stages {0,1} and {2,3};
/// pipelines {0,2} and {1,3}.
struct PipelineMesh {
  Comm pp;  ///< this rank's pipeline (rank = its stage)
  Comm dp;  ///< the ranks holding the same stage (rank = its DP rank)
};

/// Splits @p world (of pp x dp ranks) into the mesh above. Throws
/// dtp::Error naming both when world.size() is not a multiple of @p pp.
PipelineMesh make_pipeline_mesh(Comm& world, int pp);

/// How a run is split and scheduled.
struct PipelineOptions {
  int pp = 2;                                         ///< pipeline stages (ranks per pipeline)
  int dp = 1;                                         ///< data-parallel replicas of the pipeline
  int microbatches = 4;                               ///< m per step (of each DP rank's batch)
  ScheduleKind schedule = ScheduleKind::one_f_one_b;  ///< the schedule
  int chunks = 2;                                     ///< v, for the interleaved schedule
  bool fsdp = false;                                  ///< shard each stage over its DP group (5.8)
  bool balance_by_time = false;  ///< partition by measured time, not parameters
  ActionCosts costs;             ///< what each action charges on the clock
};

/// What one world rank did in one step of `dtp train --strategy pp`.
struct RankPipelineStep {
  int rank = 0;                      ///< world rank
  int stage = 0;                     ///< its pipeline rank
  int dp_rank = 0;                   ///< its DP rank
  std::string units;                 ///< "block.0 .. block.3" (every chunk's)
  std::int64_t params_bytes = 0;     ///< MemoryCategory::params it holds
  std::int64_t activation_peak = 0;  ///< highest MemoryCategory::activations bytes during the step
  int peak_alive = 0;                ///< most micro-batches (x chunks) alive at once
  double clock_busy = 0;             ///< simulated time its actions took
  double wall_busy = 0;              ///< wall seconds its actions took
};

/// A step's bubble on both clocks (rank 0 of the world knows it after step()).
struct PipelineStepTiming {
  double clock_makespan = 0;            ///< the latest simulated clock of any rank
  double clock_bubble = 0;              ///< 1 - sum(busy) / (ranks x makespan), simulated
  double wall_makespan = 0;             ///< first action's start to last action's end, seconds
  double wall_bubble = 0;               ///< the same share, in wall time
  std::vector<RankPipelineStep> ranks;  ///< every world rank (index = rank)
  /// Every action of every pipeline rank of DP group 0 (index = stage), for
  /// a Gantt chart; both clocks start at 0 at the step's first action.
  std::vector<std::vector<ActionRecord>> actions;
};

/// Checks @p options against @p config: pp, dp, m, v >= 1; the global batch
/// a multiple of dp x m; enough units for pp x v stages; the interleaved
/// schedule's conditions; no zb-h1 with fsdp. Each message names the flag.
void validate_pipeline(const TrainConfig& config, const PipelineOptions& options);

/// One rank of pipeline training: its stage's units of the serial model
/// (the others released), its DP slice of each batch, the executor, the DP
/// mean (all-reduce, or FSDP's shards), clipping by the whole model's norm
/// and the optimizer over what the rank holds.
class PipelineTrainer {
 public:
  /// Partitions the model (starting from config.load_path's parameters when
  /// set), keeps this rank's chunks, builds the schedule and the optimizer.
  /// @p mesh must outlive the trainer.
  PipelineTrainer(const TrainConfig& config, PipelineMesh& mesh, const PipelineOptions& options);
  ~PipelineTrainer();
  /// One step; the record's loss is the step's mean loss, the same on every rank.
  StepRecord step();
  /// The timing of the last step (gathered on world rank 0 only).
  const PipelineStepTiming& timing() const { return timing_; }
  /// This rank's chunks.
  std::vector<StageModule*> chunks();
  /// The FSDP shards (null without fsdp).
  PipelineFsdp* fsdp(int chunk = 0);
  /// The serial model whose units this rank's chunks hold (the others released).
  GPT& model();
  /// The schedule every step runs.
  const Schedule& schedule() const { return schedule_; }
  /// Every virtual stage's units, in order.
  const std::vector<UnitRange>& partition() const { return partition_; }
  /// The config as resolved.
  const TrainConfig& config() const;
  /// This DP rank's sampler.
  const BatchSampler& sampler() const { return serial_->sampler(); }
  /// The serial Trainer under it: the steps done and the optimizer over this
  /// rank's units (or FSDP shards).
  Trainer& trainer() { return *serial_; }
  /// Collective over the world: writes a consolidated checkpoint to @p path
  /// (provided, pp_checkpoint.cpp). Every unit's parameters and optimizer
  /// state travel to world rank 0 (first gathered over the stage's replicas
  /// under FSDP), which writes them in a single-device run's layout.
  void save(const std::string& path, const std::vector<RunSetting>& strategy);
  /// Continues the run that saved @p path: each rank copies its own units'
  /// parameters and optimizer state (or its FSDP shards of them).
  void resume(const std::string& path, const std::vector<RunSetting>& strategy);

 private:
  void gather_timing(const MemoryTracker& tracker);
  PipelineMesh& mesh_;
  PipelineOptions options_;
  std::unique_ptr<Trainer> serial_;
  std::vector<UnitRange> partition_;
  std::vector<std::unique_ptr<StageModule>> chunks_;
  std::vector<std::unique_ptr<PipelineFsdp>> fsdp_;
  Schedule schedule_;
  PipelineStepTiming timing_;
};

/// The ASCII Gantt chart (gantt_chart's) of pipeline 0's step as it ran on
/// the simulated clock: what `dtp train --strategy pp` prints.
std::string executed_gantt_chart(const PipelineOptions& options, const PipelineStepTiming& timing);

/// The "pp" strategy. Its step record has the step's mean loss and the
/// tokens of every replica. After each kept step it prints the bubble on
/// both clocks, a row per rank ("r (stage s, dp d: units)": "params",
/// "activation peak", "alive" micro-batches at most, "busy" wall time) and,
/// once, the Gantt chart of pipeline 0 as it ran. --save: every unit's
/// parameters and optimizer state travel to world rank 0, which writes a
/// single-device run's layout.
class PipelineStrategy : public drivers::Strategy {
 public:
  PipelineStrategy() = default;
  explicit PipelineStrategy(const PipelineOptions& options) : options(options) {}

  PipelineOptions
      options;  ///< what --pp, --dp, --microbatches, --schedule, --chunks, --fsdp, --balance set

  std::string name() const override { return "pp"; }
  std::string title() const override { return "Pipeline parallel"; }
  std::string chapter() const override { return "05"; }
  std::string save_note() const override {
    return "rank 0 gathers every rank's shards into one file";
  }
  void add_flags(drivers::FlagGroup& flags) override;
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override;
  void validate(const TrainConfig& config) const override { validate_pipeline(config, options); }
  int world_size() const override { return options.pp * options.dp; }
  std::string world_text() const override;
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;
  /// With --fsdp, 5.7's executor alone: the run builds 5.8's shards before it executes.
  std::vector<drivers::PuzzleCall> puzzle_calls(const TrainConfig& config) const override;
};

}  // namespace dtp::ch05
