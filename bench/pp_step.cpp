// dtp-bench-pp-step: pipeline parallelism (chapter 05), measured on this
// machine: each schedule's bubble on the simulated clock and in wall time,
// against the verifier and the lesson's formula, and what each stage keeps.
//   dtp-bench-pp-step [--pp 4] [--microbatches 4,8,16,32] [--schedules afab,1f1b,interleaved,zb-h1]
//                     [--steps 5] [--warmup 2] [--chunks 2] [--mb-size 2]
//                     [--layers 8] [--d-model 128] [--heads 4] [--seq 64]
//                     [--optimizer adamw|sgd] [--dtype f32|f64] [--balance-by-time]
//                     [--gantt-m 8] [--trace-dir DIR] [--quick] [--json FILE]
// (--help lists them with their defaults.)
//
// Every (schedule, m) is one run of the reference's PipelineTrainer (the step
// of `dtp train --strategy pp`) on p = --pp ranks of the thread backend, dp = 1,
// the World's CostModel left at zero: the simulated clock moves only by what
// StageModule charges per action (ActionCosts' defaults: F 1, B 2; split, B 1
// and W 1), so the executed clock can be compared with the verifier's. The
// batch is --mb-size x m sequences, so every micro-batch is the same size
// whatever m (a step with more micro-batches is more work).
//
// Per run, after --warmup untimed steps, --steps timed ones; rank 0 of the
// world reads PipelineTrainer::timing() after each:
// - clock bubble: timing().clock_bubble (the same every step; the last one);
// - verifier: simulate_schedule(make_schedule(...)).bubble_fraction with the
//   same ActionCosts; formula: bubble_formula() (the lesson's);
// - wall bubble: timing().wall_bubble, median over the timed steps;
// - step: the slowest rank's StepRecord::seconds, median;
// - per stage: timing().ranks[r].activation_peak (the tracker's
//   MemoryCategory::activations peak of the step; the largest over the timed
//   steps) and peak_alive (micro-batches, x chunks, holding activations), next
//   to the verifier's peak_alive.
// For each schedule at m = --gantt-m, the last timed step's executed actions
// (timing().actions: clock and wall start and end of every F, B, W) go to the
// JSON file as a "pp_actions" line (plots/pipeline.py draws its Gantt charts
// from them), and with --trace-dir the same step is traced (dtp::trace) into
// DIR/pp-trace-<schedule>.json, for Perfetto.
//
// The ranks are threads: on a machine with fewer cores than ranks they share
// cores, and the wall-time numbers include that sharing (the table's header
// says how many cores there were). The clock numbers do not depend on it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "05_pipeline/pipeline.h"
#include "bench_common.h"
#include "bench_flags.h"
#include "drivers/05_pipeline/pp_strategy.h"
#include "dtp/json.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/trace.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"

namespace {

using namespace dtp::bench;
namespace pp = dtp::ch05;
constexpr double kMiB = 1024.0 * 1024.0;

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / kMiB; }

// --- where and when ----------------------------------------------------------------

// What every JSON line says about the run.
// --- one run ------------------------------------------------------------------------

struct Options {
  std::vector<int> microbatches = {4, 8, 16, 32};
  std::vector<pp::ScheduleKind> schedules = {pp::ScheduleKind::afab, pp::ScheduleKind::one_f_one_b,
                                             pp::ScheduleKind::interleaved,
                                             pp::ScheduleKind::zb_h1};
  std::int64_t warmup = 2, steps = 5;
  int stages = 4;            // p, one rank thread each
  int chunks = 2;            // v of the interleaved schedule
  std::int64_t mb_size = 2;  // sequences per micro-batch
  int gantt_m = 8;           // the m whose actions (and traces) are kept
  bool balance_by_time = false;
  std::string trace_dir;
  dtp::TrainConfig config;
};

// What rank 0 saw of one (schedule, m).
struct Run {
  pp::PipelineOptions options;
  dtp::TrainConfig config;  // as run (batch = mb_size x m)
  std::int64_t parameters = 0;
  std::vector<double> step_seconds;  // slowest rank's, timed steps
  std::vector<double> wall_bubbles;  // timed steps
  std::vector<double> wall_makespans;
  double clock_bubble = 0, clock_makespan = 0;
  double first_loss = 0, last_loss = 0;
  std::vector<std::int64_t> activation_peak;  // per stage: largest over the timed steps
  std::vector<int> peak_alive;                // per stage
  std::vector<std::int64_t> params_bytes;     // per stage
  std::vector<double> clock_busy, wall_busy;  // per stage, last timed step
  std::vector<std::string> units;             // per stage (RankPipelineStep::units)
  std::vector<std::string> partition;         // every virtual stage's units
  pp::PipelineStepTiming traced;              // the last timed step's timing (its actions)
  std::string trace_path;
};

std::string unit_span(const std::vector<dtp::Unit*>& units, const pp::UnitRange& r) {
  std::string s = units[static_cast<std::size_t>(r.first)]->name();
  if (r.count > 1) s += ".." + units[static_cast<std::size_t>(r.first + r.count - 1)]->name();
  return s;
}

Run run_one(const Options& o, pp::ScheduleKind kind, int m) {
  Run run;
  run.options.pp = o.stages;
  run.options.dp = 1;
  run.options.microbatches = m;
  run.options.schedule = kind;
  run.options.chunks = o.chunks;
  run.options.balance_by_time = o.balance_by_time;
  run.config = o.config;
  run.config.batch = o.mb_size * m;
  run.config.steps = o.warmup + o.steps;
  pp::validate_pipeline(run.config, run.options);
  const bool keep_actions = m == o.gantt_m;
  if (keep_actions && !o.trace_dir.empty())
    run.trace_path = o.trace_dir + "/pp-trace-" + pp::schedule_kind_name(kind) + ".json";

  dtp::World world =
      dtp::World::from_env(o.stages);  // CostModel{} : the clock moves only by the actions
  dtp::launch(world, [&](dtp::Comm& comm) {
    dtp::TrainConfig config = run.config;
    config.model.device = comm.device();
    pp::PipelineMesh mesh = pp::make_pipeline_mesh(comm, o.stages);
    pp::PipelineTrainer trainer(config, mesh, run.options);
    const bool root = comm.rank() == 0;
    if (root) {
      run.parameters = trainer.config().model.parameter_count();
      const std::vector<dtp::Unit*> units = trainer.model().units();
      for (const pp::UnitRange& r : trainer.partition())
        run.partition.push_back(unit_span(units, r));
      run.activation_peak.assign(o.stages, 0);
    }
    const std::int64_t total = o.warmup + o.steps;
    for (std::int64_t s = 0; s < total; ++s) {
      const bool traced = !run.trace_path.empty() && s == total - 1;
      if (traced) {
        comm.barrier();
        if (root) dtp::trace::enable();
        comm.barrier();
      }
      dtp::StepRecord record = trainer.step();
      if (traced) {
        comm.barrier();
        if (root) {
          dtp::trace::disable();
          dtp::trace::write_chrome_json(run.trace_path);
        }
      }
      // The step's wall time is its slowest rank's.
      dtp::Tensor seconds = dtp::Tensor::from_values({record.seconds});
      comm.all_reduce(seconds, dtp::ReduceOp::max);
      if (!root) continue;
      if (s == 0) run.first_loss = record.loss;
      run.last_loss = record.loss;
      if (s < o.warmup) continue;
      const pp::PipelineStepTiming& t = trainer.timing();
      run.step_seconds.push_back(seconds.item(0));
      run.wall_bubbles.push_back(t.wall_bubble);
      run.wall_makespans.push_back(t.wall_makespan);
      run.clock_bubble = t.clock_bubble;
      run.clock_makespan = t.clock_makespan;
      run.peak_alive.clear();
      run.params_bytes.clear();
      run.clock_busy.clear();
      run.wall_busy.clear();
      run.units.clear();
      for (const pp::RankPipelineStep& r : t.ranks) {
        auto& peak = run.activation_peak[static_cast<std::size_t>(r.stage)];
        peak = std::max(peak, r.activation_peak);
        run.peak_alive.push_back(r.peak_alive);
        run.params_bytes.push_back(r.params_bytes);
        run.clock_busy.push_back(r.clock_busy);
        run.wall_busy.push_back(r.wall_busy);
        run.units.push_back(r.units);
      }
      if (keep_actions && s == total - 1) run.traced = t;
    }
  });
  return run;
}

// --- the table and the JSON lines ---------------------------------------------------------

std::string joined(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

std::vector<std::int64_t> as_int64(const std::vector<int>& values) {
  return {values.begin(), values.end()};
}

void print_header(const Options& o, const RunContext& ctx) {
  const dtp::TrainConfig& cfg = o.config;
  const pp::ActionCosts costs;
  std::printf("# pp step: %s backend on %s, p = %d stages (one thread each) on %d cores, %s, %s\n",
              ctx.backend.c_str(), ctx.device.c_str(), o.stages, ctx.cores,
              dtp::dtype_name(cfg.model.dtype), cfg.optimizer.c_str());
  std::printf(
      "# model: GPT d_model %d, %d layers (%d units), %d heads, vocabulary %d, seq %lld; %lld "
      "sequences per "
      "micro-batch (batch = %lld x m); partition by %s; interleaved v = %d\n",
      cfg.model.d_model, cfg.model.layers, cfg.model.layers + 2, cfg.model.heads,
      cfg.model.vocab_size, static_cast<long long>(cfg.seq), static_cast<long long>(o.mb_size),
      static_cast<long long>(o.mb_size), o.balance_by_time ? "measured time" : "parameters",
      o.chunks);
  std::printf(
      "# clock: the executed run's simulated clock (F %g, B %g; split B %g + W %g); verifier: "
      "simulate_schedule; "
      "formula: bubble_formula.\n"
      "# wall: 1 - busy / (p x makespan) in wall time, median of %lld timed steps after %lld "
      "warm-up steps; "
      "%d rank threads share %d cores, so a rank's action can stall while another rank runs.\n"
      "# step: the slowest rank's step time, median. act MiB: each stage's activation peak; alive: "
      "each "
      "stage's peak micro-batches (x chunks) alive, executed (verifier's).\n",
      costs.forward, costs.backward, costs.backward_input, costs.backward_weight,
      static_cast<long long>(o.steps), static_cast<long long>(o.warmup), o.stages, ctx.cores);
  std::printf("%-11s %3s %2s %7s %8s %7s %6s %9s %9s  %-27s %-16s\n", "schedule", "m", "v", "clock",
              "verifier", "formula", "wall", "step ms", "ms/mb", "act MiB per stage",
              "alive (verifier)");
}

void report(const Options& o, const Run& run, const RunContext& ctx, FILE* json) {
  const pp::PipelineOptions& po = run.options;
  const int v = po.schedule == pp::ScheduleKind::interleaved ? po.chunks : 1;
  const pp::ActionCosts costs = po.costs;
  const pp::Schedule schedule = pp::make_schedule(po.schedule, po.pp, po.microbatches, po.chunks);
  const pp::ScheduleReport verifier = pp::simulate_schedule(schedule, costs);
  const double formula = pp::bubble_formula(po.schedule, po.pp, po.microbatches, po.chunks);
  const double wall = median(run.wall_bubbles), step = median(run.step_seconds);
  std::vector<std::string> act, alive;
  for (std::int64_t a : run.activation_peak) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", mib(a));
    act.push_back(text);
  }
  for (std::size_t s = 0; s < run.peak_alive.size(); ++s)
    alive.push_back(std::to_string(run.peak_alive[s]) + "(" +
                    std::to_string(s < verifier.peak_alive.size() ? verifier.peak_alive[s] : -1) +
                    ")");
  std::printf("%-11s %3d %2d %7.4f %8.4f %7.4f %6.3f %9.1f %9.2f  %-27s %-16s\n",
              pp::schedule_kind_name(po.schedule), po.microbatches, v, run.clock_bubble,
              verifier.bubble_fraction, formula, wall, step * 1e3, step * 1e3 / po.microbatches,
              joined(act, " ").c_str(), joined(alive, " ").c_str());
  std::fflush(stdout);

  const dtp::TrainConfig& cfg = run.config;
  std::int64_t largest_act = 0;
  for (std::int64_t a : run.activation_peak) largest_act = std::max(largest_act, a);
  JsonLine line;
  line.add("what", "pp_step")
      .add("schedule", pp::schedule_kind_name(po.schedule))
      .add("pp", po.pp)
      .add("dp", po.dp)
      .add("world", po.pp * po.dp)
      .add("microbatches", po.microbatches)
      .add("chunks", v)
      .add("split_backward", schedule.split_backward)
      .add("balance", o.balance_by_time ? "time" : "parameters")
      .add("dtype", dtp::dtype_name(cfg.model.dtype))
      .add("optimizer", cfg.optimizer)
      .add("d_model", cfg.model.d_model)
      .add("layers", cfg.model.layers)
      .add("heads", cfg.model.heads)
      .add("vocab_size", cfg.model.vocab_size)
      .add("seq", cfg.seq)
      .add("batch", cfg.batch)
      .add("microbatch_size", o.mb_size)
      .add("tokens_per_step", cfg.batch * cfg.seq)
      .add("parameters", run.parameters)
      .add("partition", run.partition)
      .add("units_per_stage", run.units)
      .add("cost_forward", costs.forward)
      .add("cost_backward", costs.backward)
      .add("cost_backward_input", costs.backward_input)
      .add("cost_backward_weight", costs.backward_weight)
      .add("clock_bubble", run.clock_bubble)
      .add("clock_makespan", run.clock_makespan)
      .add("verifier_bubble", verifier.bubble_fraction)
      .add("verifier_makespan", verifier.makespan)
      .add("formula_bubble", formula)
      .add("wall_bubble", wall)
      .add("wall_bubble_min", *std::min_element(run.wall_bubbles.begin(), run.wall_bubbles.end()))
      .add("wall_bubble_max", *std::max_element(run.wall_bubbles.begin(), run.wall_bubbles.end()))
      .add("wall_bubble_per_step", run.wall_bubbles)
      .add("wall_makespan_s", median(run.wall_makespans))
      .add("clock_busy_per_stage", run.clock_busy)
      .add("wall_busy_s_per_stage", run.wall_busy)
      .add("activation_peak_bytes", largest_act)
      .add("activation_peak_bytes_per_stage", run.activation_peak)
      .add("peak_alive_per_stage", as_int64(run.peak_alive))
      .add("verifier_peak_alive_per_stage", as_int64(verifier.peak_alive))
      .add("params_bytes_per_stage", run.params_bytes)
      .add("step_s", step)
      .add("step_s_min", *std::min_element(run.step_seconds.begin(), run.step_seconds.end()))
      .add("step_s_max", *std::max_element(run.step_seconds.begin(), run.step_seconds.end()))
      .add("step_s_per_step", run.step_seconds)
      .add("tokens_per_s", step > 0 ? static_cast<double>(cfg.batch * cfg.seq) / step : 0.0)
      .add("first_loss", run.first_loss)
      .add("last_loss", run.last_loss)
      .add("warmup", o.warmup)
      .add("steps", o.steps)
      .add("trace", run.trace_path);
  add_context(line, ctx);
  write_line(json, line);

  if (run.traced.actions.empty()) return;
  // The executed actions of the last timed step, per stage in run order:
  // [kind, micro-batch, chunk, clock start, clock end, wall start, wall end],
  // both clocks from the step's first action (wall in seconds).
  double first = 1e300;  // the clock from the step's first action, as the wall times are
  for (const auto& list : run.traced.actions)
    for (const pp::ActionRecord& r : list) first = std::min(first, r.clock_start);
  std::string stages;
  for (const auto& list : run.traced.actions) {
    std::string actions;
    for (const pp::ActionRecord& r : list) {
      actions +=
          (actions.empty() ? "[" : ",[") + dtp::json_string(pp::action_letter(r.action.kind)) +
          "," + std::to_string(r.action.microbatch) + "," + std::to_string(r.action.chunk) + "," +
          dtp::json_number(r.clock_start - first) + "," + dtp::json_number(r.clock_end - first) +
          "," + dtp::json_number(r.wall_start, 6) + "," + dtp::json_number(r.wall_end, 6) + "]";
    }
    stages += (stages.empty() ? "[" : ",[") + actions + "]";  // one list per stage
  }
  JsonLine actions;
  actions.add("what", "pp_actions")
      .add("schedule", pp::schedule_kind_name(po.schedule))
      .add("pp", po.pp)
      .add("microbatches", po.microbatches)
      .add("chunks", v)
      .add("split_backward", schedule.split_backward)
      .add("step", o.warmup + o.steps)
      .add("clock_bubble", run.traced.clock_bubble)
      .add("clock_makespan", run.traced.clock_makespan)
      .add("wall_bubble", run.traced.wall_bubble)
      .add("wall_makespan_s", run.traced.wall_makespan)
      .add("fields", std::vector<std::string>{"kind", "microbatch", "chunk", "clock_start",
                                              "clock_end", "wall_start_s", "wall_end_s"})
      .raw("actions", "[" + stages + "]")
      .add("d_model", cfg.model.d_model)
      .add("layers", cfg.model.layers)
      .add("seq", cfg.seq)
      .add("batch", cfg.batch)
      .add("dtype", dtp::dtype_name(cfg.model.dtype))
      .add("trace", run.trace_path);
  add_context(actions, ctx);
  write_line(json, actions);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  dtp::TrainConfig& config = o.config;
  config.model.layers = 8;
  config.model.d_model = 128;
  config.model.heads = 4;
  config.model.vocab_size = 256;  // synthetic data: the vocabulary comes from the model
  config.seq = 64;
  config.optimizer = "adamw";
  config.synthetic.length = 1 << 17;
  std::string json_path;
  std::vector<std::string> schedules = {"afab", "1f1b", "interleaved", "zb-h1"};
  bool quick = false;
  CLI::App app{
      "Pipeline parallelism (chapter 05) measured on this machine: for every schedule and m, one "
      "run of "
      "the reference's PipelineTrainer (the step of `dtp train --strategy pp`) on p = --pp rank "
      "threads, "
      "dp = 1. Each schedule's bubble on the simulated clock and in wall time, against the "
      "verifier and "
      "the lesson's formula, and what each stage keeps (activation peak, micro-batches alive).",
      "dtp-bench-pp-step"};
  app.add_option("--pp", o.stages, "p, pipeline stages, one rank thread each")
      ->check(dtp::cli::Range(1, 64))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--microbatches", o.microbatches, "m per step, a comma list",
                            "M,...")
      ->check(dtp::cli::Range(1, 512))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--schedules", schedules,
                            "a comma list of afab, 1f1b, interleaved, zb-h1", "KIND,...")
      ->check(CLI::IsMember({"afab", "1f1b", "interleaved", "zb-h1"}))
      ->capture_default_str();
  dtp::bench::add_step_options(app, o.steps, o.warmup);
  app.add_option("--chunks", o.chunks, "v, model chunks per rank of the interleaved schedule")
      ->check(dtp::cli::Range(2, 16))
      ->capture_default_str();
  app.add_option("--mb-size", o.mb_size, "sequences per micro-batch: the batch is mb-size x m")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  dtp::bench::add_model_options(app, config);
  app.add_flag("--balance-by-time", o.balance_by_time,
               "partition the units by measured time, not by parameters");
  app.add_option("--gantt-m", o.gantt_m,
                 "the m whose executed actions go to the JSON file (and are traced)")
      ->check(dtp::cli::Range(1, 512))
      ->capture_default_str();
  app.add_option("--trace-dir", o.trace_dir,
                 "trace one step per schedule at m = --gantt-m into DIR/pp-trace-<schedule>.json "
                 "(Perfetto)")
      ->check(CLI::Validator(CLI::ExistingDirectory).description(""))
      ->type_name("DIR");
  app.add_flag("--quick", quick,
               "a smoke test: --warmup 1 --steps 2 --microbatches 4,8 (flags given win)");
  app.add_option("--json", json_path,
                 "append one JSON object per (schedule, m), and the actions, to FILE")
      ->type_name("FILE");
  app.footer(
      "The model's vocabulary is 256 (synthetic data). The ranks are threads of the thread backend "
      "(DTP_DEVICE picks the device): with fewer cores than ranks the wall times include that "
      "sharing; the "
      "clock numbers do not depend on it.");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  if (quick) {
    if (app.count("--warmup") == 0) o.warmup = 1;
    if (app.count("--steps") == 0) o.steps = 2;
    if (app.count("--microbatches") == 0) o.microbatches = {4, 8};
  }
  try {
    o.schedules.clear();
    for (const std::string& name : schedules) o.schedules.push_back(pp::parse_schedule_kind(name));
    if (o.microbatches.empty() || o.schedules.empty())
      throw std::invalid_argument("--microbatches and --schedules need at least one value");
    const bool keeps_actions = app.count("--gantt-m") > 0 || !o.trace_dir.empty();
    if (keeps_actions &&
        std::find(o.microbatches.begin(), o.microbatches.end(), o.gantt_m) == o.microbatches.end())
      throw std::invalid_argument(
          "--gantt-m " + std::to_string(o.gantt_m) +
          " is not one of --microbatches, so no run would keep its actions or trace");
    // Every combination is checked before the first run, with validate_pipeline's messages.
    for (pp::ScheduleKind kind : o.schedules)
      for (int m : o.microbatches) {
        pp::PipelineOptions check;
        check.pp = o.stages;
        check.microbatches = m;
        check.schedule = kind;
        check.chunks = o.chunks;
        dtp::TrainConfig c = config;
        c.batch = o.mb_size * m;
        pp::validate_pipeline(c, check);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-bench-pp-step: error: %s (see --help)\n", e.what());
    return 2;
  }

  const std::optional<RunContext> context = context_from_env("dtp-bench-pp-step");
  if (!context) return 2;
  const RunContext& ctx = *context;
  FILE* json = nullptr;
  if (!open_json("dtp-bench-pp-step", json_path, json)) return 2;
  int status = 0;
  try {
    print_header(o, ctx);
    std::map<int, std::vector<std::string>> partitions;  // v -> every virtual stage's units
    for (pp::ScheduleKind kind : o.schedules)
      for (int m : o.microbatches) {
        const Run run = run_one(o, kind, m);
        report(o, run, ctx, json);
        partitions[run.options.schedule == pp::ScheduleKind::interleaved ? o.chunks : 1] =
            run.partition;
      }
    for (const auto& [v, stages] : partitions)
      std::printf("# virtual stages, v = %d: %s\n", v, joined(stages, " | ").c_str());
    std::printf("\n");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dtp-bench-pp-step: %s\n", error.what());
    status = 1;
  }
  return close_json(json, "dtp-bench-pp-step", status);
}
