/// @file strategy.h
/// @brief How `dtp train` runs a chapter: one Strategy per driver file, one
/// shared run loop.
///
/// A Strategy says what a way of training is called, which flags it takes
/// (with their ranges and help), how they are checked, the header line it
/// prints and how one rank of it is built (a RankRun: one optimizer step at
/// a time, the numbers it reports, how it saves and resumes).
/// run_strategy() does the rest, the same for every strategy: it launches
/// the ranks, checks they agree on every setting, continues a saved run,
/// steps, gathers every rank's numbers into the step's report, writes the
/// log and the trace, and saves at the end.
///
/// Adding a strategy is its driver file (a class derived from Strategy and
/// a function `dtp::strategies::NAME()` returning it) and one line in
/// drivers/CMakeLists.txt (`dtp_strategy(NAME)`); nothing central changes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "drivers/checkpointing.h"
#include "dtp/comm.h"
#include "dtp/train_report.h"
#include "dtp/train_run.h"
#include "dtp/trainer.h"
#include "flag_group.h"

namespace dtp::drivers {

using cli::FlagGroup;
using cli::GivenFlag;
using cli::UsageError;

/// How a column of the per-rank report prints its numbers.
enum class ColumnUnit {
  count,         ///< a whole number
  mebibytes,     ///< bytes, printed in MiB
  milliseconds,  ///< seconds, printed in ms
  number,        ///< a number, 4 decimals
};

/// One column of the per-rank report.
struct ReportColumn {
  std::string heading;  ///< "params peak" (printed with its unit: "params peak MiB")
  ColumnUnit unit = ColumnUnit::count;
};

/// A step's per-rank report: a row per rank (or per group of ranks), one
/// number per column. What `dtp train` prints under a kept step line.
struct ReportTable {
  /// One row: its label (the rank, and where it sits in the mesh) and its numbers.
  struct Row {
    std::string label;           ///< "0", "1 (tp 1, dp 0)", "DDP"
    std::vector<double> values;  ///< one per column, in its unit's base (bytes, seconds); NaN: none
  };
  std::string label_heading = "rank";  ///< the heading of the labels' column
  std::vector<ReportColumn> columns;   ///< the numbers' columns
  std::vector<Row> rows;               ///< in rank order

  /// The number in row @p row under the column headed @p heading; throws
  /// dtp::Error naming what is missing.
  double at(std::size_t row, const std::string& heading) const;
  /// The table as aligned text, every line indented by four spaces and
  /// ending in a newline; empty when the table has no rows.
  std::string str() const;
};

/// What rank 0 reports after each step.
struct StepReport {
  StepRecord record;  ///< the whole group's step (global loss, tokens, slowest rank's time)
  ReportTable ranks;  ///< every rank's numbers (no rows: the strategy reports none)
  /// Lines printed under the table after a kept step ("bubble: clock 12.5%").
  std::vector<std::string> lines;
  /// Printed once per run, under the first kept step that carries it (the
  /// pipeline's Gantt chart); the same text on every step.
  std::string once;
};

/// Called on rank 0 after every step with its report.
using ReportCallback = std::function<void(const StepReport&)>;

/// One rank's part of a run: built by Strategy::start() on every rank.
class RankRun {
 public:
  virtual ~RankRun() = default;
  /// The Trainer under this rank's run: its steps done, sampler, resolved
  /// config, optimizer and checkpoints.
  virtual Trainer& trainer() = 0;
  /// One optimizer step of this rank; the record is this rank's own.
  virtual StepRecord step() = 0;
  /// Continues the run that saved @p path (its parameters, optimizer state
  /// and steps). Default: trainer().resume() (every rank holds a replica).
  virtual void resume(const std::string& path, const std::vector<RunSetting>& settings);
  /// Collective over @p world: writes the run's checkpoint to @p path.
  /// Default: rank 0 saves its trainer (the replicas are equal).
  virtual void save(Comm& world, const std::string& path, const std::vector<RunSetting>& settings);
  /// Collective over @p world: what the run writes at its very end, after
  /// --save (LoRA's merged model). Default: nothing.
  virtual void finish(Comm& world) { (void)world; }
  /// Which ranks' records make the group's step (report_group_step).
  /// Default: every rank holds a slice of the batch of its own.
  virtual GroupStepRule group_rule() const { return {}; }
  /// This rank's numbers of the last step, as many on every rank (gathered
  /// to rank 0 for report()). Default: none.
  virtual std::vector<double> report_values() { return {}; }
  /// On rank 0: fills @p report (its table, lines, once) from every rank's
  /// row of the step. Default: nothing beyond the record.
  virtual void report(const std::vector<RankStepRow>& rows, StepReport& report);
  /// The whole model's parameter count (the summary's). Default: the
  /// trainer's model's.
  virtual std::int64_t parameter_count() { return trainer().model().parameter_count(); }
};

/// One puzzle a run calls, as a call of its own on tiny inputs that throws
/// dtp::NotSolved while the puzzle is a stub.
struct PuzzleCall {
  std::string puzzle;                    ///< its id: "4.1"
  std::function<void(Comm& comm)> call;  ///< runs on one rank (@p comm), on the CPU
};

/// The model puzzle_calls() build: one block, width 8, 2 heads, vocabulary 8,
/// context 4 (small enough to cost nothing, big enough for every layer).
GPTConfig tiny_probe_config();

/// A way of training: its name, flags, checks, header and ranks.
class Strategy {
 public:
  virtual ~Strategy() = default;

  /// `--strategy NAME` ("ddp").
  virtual std::string name() const = 0;
  /// Its --help section's title ("Data parallel").
  virtual std::string title() const = 0;
  /// The chapter it runs ("02"); empty for none.
  virtual std::string chapter() const { return ""; }
  /// How the command line chooses it: "--strategy NAME" unless the strategy
  /// is chosen by a flag of its own ("--lora-rank R").
  virtual std::string chosen_by() const { return "--strategy " + name(); }
  /// For a strategy chosen by a flag: whether @p given chooses it.
  virtual bool chosen(const std::vector<GivenFlag>& given) const {
    (void)given;
    return false;
  }

  /// Declares its flags, bound to its settings.
  virtual void add_flags(FlagGroup& flags) = 0;
  /// After its flags are set: defaults that depend on other flags, and
  /// flags this run would ignore. @p processes: how many processes mpiexec
  /// started (DTP_BACKEND=mpi), 0 outside mpiexec. Throws UsageError.
  virtual void resolve(TrainConfig& config, const std::vector<GivenFlag>& given, int processes) {
    (void)config, (void)given, (void)processes;
  }
  /// Checks its settings against @p config; throws dtp::Error naming the flag.
  virtual void validate(const TrainConfig& config) const = 0;
  /// The ranks it runs on.
  virtual int world_size() const = 0;
  /// The flags that set world_size(), for messages ("--dp 2 x --tp 2").
  virtual std::string world_text() const { return "--world " + std::to_string(world_size()); }
  /// Its settings that decide what a rank computes: every rank must share
  /// them, and a resumed run must share them with the saved one.
  virtual std::vector<RunSetting> settings(const TrainConfig& config) const = 0;
  /// What the header says of it (a line or more, no trailing newline); the
  /// ranks run on the @p backend backend ("thread" or "mpi").
  virtual std::string header(const TrainConfig& config, const std::string& backend) const = 0;
  /// Builds this rank's part of the run (from config.load_path's
  /// parameters when set). Every rank of @p world calls it.
  virtual std::unique_ptr<RankRun> start(const TrainConfig& config, Comm& world) const = 0;

  /// Why `--checkpoint @p choice` (chapter 09's activation policies) cannot
  /// run under it; empty (the default) when it can: its blocks are the
  /// trainer's model's dtp::Block objects, wherever they run.
  virtual std::string checkpoint_refusal(const CheckpointChoice& choice) const {
    (void)choice;
    return "";
  }
  /// What --load gives a run of it, for the header.
  virtual std::string load_note() const { return "a new run: fresh optimizer, step 0"; }
  /// What --save writes, for the header; empty: the model and its optimizer state.
  virtual std::string save_note() const { return ""; }
  /// Whether --resume and --load go together (LoRA: --load the base, --resume the adapters).
  virtual bool resume_with_load() const { return false; }
  /// Files it writes beside --save, --json and --trace: (flag, path).
  virtual std::vector<std::pair<std::string, std::string>> outputs() const { return {}; }
  /// The puzzles a run with @p config calls, in the chapter's order. A run
  /// reaches its puzzles in the order its code calls them (the whole model
  /// before the layers it is built of); when it stops at a stub, `dtp
  /// train` names the first of these that is a stub (first_unsolved()).
  /// Default: none (the stub the run stopped at is named).
  virtual std::vector<PuzzleCall> puzzle_calls(const TrainConfig& config) const {
    (void)config;
    return {};
  }
};

/// The strategies `dtp train` knows, in the order of drivers/CMakeLists.txt
/// (its --help lists them so).
const std::vector<Strategy*>& registered_strategies();

/// The registered strategy named @p name, or null.
Strategy* find_strategy(const std::string& name);

/// Trains @p config with @p strategy: checks both, launches
/// strategy.world_size() ranks (World::from_env), checks that every rank
/// has the same settings and initial parameters (check_ranks_agree), starts
/// each rank, continues config.resume_path's run, steps to
/// config.stop_after (or config.steps), calls @p on_report on rank 0 after
/// every step, and saves config.save_path at the end. The log and the trace
/// are written as train_with_outputs() writes them. config.strategy is
/// taken from strategy.name().
TrainResult run_strategy(const TrainConfig& config, const Strategy& strategy,
                         const ReportCallback& on_report = {});

/// What `dtp train` says when a run of @p strategy with @p config stopped
/// at a stub that threw @p stopped_at ("puzzle 4.8 tensor_parallel_gpt is
/// not solved yet"): the same words for the first of
/// strategy.puzzle_calls(config) that is a stub, where one comes before
/// the puzzle the run stopped at in the chapter's order; else @p
/// stopped_at. Each call runs alone on a one-rank thread world on the CPU;
/// a call that throws anything else counts as solved (the run reports it).
std::string first_unsolved(const Strategy& strategy, const TrainConfig& config,
                           const std::string& stopped_at);

/// Every strategy's `--world N` flag: its ranks, with @p what they are.
void add_world_flag(FlagGroup& flags, int* world, const std::string& what);
/// Under mpiexec (@p processes > 0) a --world not given is the process count.
void default_world_to_processes(int& world, const std::vector<GivenFlag>& given, int processes);

}  // namespace dtp::drivers
