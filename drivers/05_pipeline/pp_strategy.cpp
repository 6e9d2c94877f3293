// `dtp train --strategy pp`: the model cut into pipeline stages, one
// schedule run by the executor each step (drivers/05_pipeline/pp_strategy.h
// says how).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include <cstdio>

#include "drivers/05_pipeline/pp_strategy.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/trace.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch05 {
namespace {

int chunks_of(const PipelineOptions& options) {
  return options.schedule == ScheduleKind::interleaved ? options.chunks : 1;
}

}  // namespace

PipelineMesh make_pipeline_mesh(Comm& world, int pp) {
  DTP_CHECK(pp >= 1 && world.size() % pp == 0, "make_pipeline_mesh: a world of ", world.size(),
            " ranks does not split into ", pp, " pipeline stages of equal size");
  const int dp = world.size() / pp;
  const int w = world.rank();
  PipelineMesh mesh{world.split(w % dp, w / dp), world.split(w / dp, w % dp)};
  return mesh;
}

void validate_pipeline(const TrainConfig& config, const PipelineOptions& options) {
  DTP_CHECK(options.pp >= 1, "pp: --pp (pipeline stages) must be at least 1, got ", options.pp);
  DTP_CHECK(options.dp >= 1, "pp: --dp (pipeline replicas) must be at least 1, got ", options.dp);
  DTP_CHECK(options.microbatches >= 1, "pp: --microbatches must be at least 1, got ",
            options.microbatches);
  DTP_CHECK(config.model.experts == 0,
            "pp: --moe-experts is not supported with --strategy pp (the last stage "
            "reports the loss, and the load-balancing losses of blocks on other stages do not "
            "reach it yet)");
  DTP_CHECK(options.microbatches <= kMaxMicrobatches, "pp: --microbatches ", options.microbatches,
            " is more than the ", kMaxMicrobatches, " a message tag can name");
  DTP_CHECK(static_cast<std::int64_t>(options.pp) * chunks_of(options) <= kMaxVirtualStages,
            "pp: --pp ", options.pp, " x --chunks ", chunks_of(options),
            " virtual stages is more than the ", kMaxVirtualStages, " a message tag can name");
  const std::int64_t per_rank = config.batch / options.dp;
  DTP_CHECK(config.batch % options.dp == 0 && per_rank % options.microbatches == 0 &&
                per_rank >= options.microbatches,
            "pp: the global batch (--batch ", config.batch, ") must split into --dp ", options.dp,
            " x --microbatches ", options.microbatches, " equal non-empty micro-batches");
  const int units = config.model.layers + 2;
  const int stages = options.pp * chunks_of(options);
  DTP_CHECK(stages <= units, "pp: ", options.pp, " stages",
            chunks_of(options) > 1 ? " x --chunks " : "",
            chunks_of(options) > 1 ? std::to_string(options.chunks) : std::string(),
            " need at least ", stages, " units, but the model has ", units,
            " (embedding, --layers ", config.model.layers, " blocks, head): raise --layers");
  if (options.schedule == ScheduleKind::interleaved) {
    DTP_CHECK(options.chunks >= 2, "pp: --schedule interleaved needs --chunks >= 2, got ",
              options.chunks);
    DTP_CHECK(options.pp >= 2, "pp: --schedule interleaved needs --pp >= 2");
    DTP_CHECK(options.microbatches % options.pp == 0,
              "pp: --schedule interleaved needs --microbatches (", options.microbatches,
              ") to be a multiple of --pp (", options.pp, ")");
  }
  DTP_CHECK(!(options.fsdp && options.schedule == ScheduleKind::zb_h1),
            "pp: --fsdp cannot run --schedule zb-h1: its deferred W would need each unit's "
            "gathered parameters long "
            "after its B (use afab, 1f1b or interleaved)");
}

PipelineTrainer::PipelineTrainer(const TrainConfig& config, PipelineMesh& mesh,
                                 const PipelineOptions& options)
    : mesh_(mesh), options_(options) {
  validate_pipeline(config, options);
  DTP_CHECK(mesh.pp.size() == options.pp && mesh.dp.size() == options.dp,
            "PipelineTrainer: the mesh is ", mesh.pp.size(), " stages x ", mesh.dp.size(),
            " replicas, the options say ", options.pp, " x ", options.dp);
  serial_ = std::make_unique<Trainer>(config, mesh.dp.rank(), mesh.dp.size());
  GPT& model = serial_->model();
  // Before the model is cut: every rank reads the whole file and keeps its units.
  load_parameters(model, config);
  const int v = chunks_of(options);
  std::vector<double> costs = unit_costs_by_parameters(model);
  if (options.balance_by_time) {
    // Every rank must cut the model the same way: average the measurements.
    costs = unit_costs_by_time(model, serial_->sampler().batch(0, model.config().device));
    Tensor shared = Tensor::from_values(costs, DType::f64).to(mesh.pp.device());
    mesh.pp.all_reduce(shared, ReduceOp::avg);
    mesh.dp.all_reduce(shared, ReduceOp::avg);
    costs = shared.to_vector();
  }
  partition_ = partition_units(costs, options.pp * v);
  schedule_ = make_schedule(options.schedule, options.pp, options.microbatches, options.chunks);
  check_schedule(schedule_);
  std::vector<bool> mine(model.units().size(), false);
  for (int c = 0; c < v; ++c) {
    const UnitRange range = partition_[static_cast<std::size_t>(c * options.pp + mesh.pp.rank())];
    chunks_.push_back(std::make_unique<StageModule>(model, range, c));
    chunks_.back()->set_clock(mesh.pp, options.costs, schedule_.split_backward);
    for (int u = range.first; u < range.first + range.count; ++u)
      mine[static_cast<std::size_t>(u)] = true;
  }
  for (Unit* unit : model.units())
    if (!mine[static_cast<std::size_t>(unit->index())]) unit->set_buffers(Tensor(), Tensor());
  std::vector<ParamBuffer> buffers;
  for (auto& chunk : chunks_) {
    if (options.fsdp) {
      fsdp_.push_back(std::make_unique<PipelineFsdp>(mesh.dp, *chunk));
      PipelineFsdp& shards = *fsdp_.back();
      std::vector<Unit*> units = chunk->units();
      for (std::size_t u = 0; u < units.size(); ++u)
        buffers.push_back({units[u]->name() + " shard", shards.parameter_shards()[u],
                           shards.gradient_shards()[u]});
    } else {
      for (ParamBuffer& b : param_buffers(chunk->units())) buffers.push_back(std::move(b));
    }
  }
  serial_->set_optimizer(make_optimizer(serial_->config(), std::move(buffers)));
}

PipelineTrainer::~PipelineTrainer() = default;

std::vector<StageModule*> PipelineTrainer::chunks() {
  std::vector<StageModule*> out;
  for (auto& chunk : chunks_) out.push_back(chunk.get());
  return out;
}

PipelineFsdp* PipelineTrainer::fsdp(int chunk) {
  return fsdp_.empty() ? nullptr : fsdp_[static_cast<std::size_t>(chunk)].get();
}

GPT& PipelineTrainer::model() { return serial_->model(); }

const TrainConfig& PipelineTrainer::config() const { return serial_->config(); }

StepRecord PipelineTrainer::step() {
  const StepMeter meter;
  const TrainConfig& config = serial_->config();
  StepRecord record;
  record.step = serial_->steps_done() + 1;
  const Batch batch = serial_->sampler().batch(serial_->steps_done(), config.model.device);
  const std::vector<MicroBatch> microbatches = split_microbatches(batch, options_.microbatches);
  for (auto& chunk : chunks_) {
    chunk->zero_grad();
    chunk->clear_records();
  }
  for (auto& shards : fsdp_) shards->zero_grad();

  const double loss = execute_schedule(mesh_.pp, schedule_, chunks(), microbatches);

  // The loss lives on the last stage; every rank reports the mean over replicas.
  Tensor step_loss = Tensor::from_values({loss}).to(mesh_.pp.device());  // NCCL: device memory
  mesh_.pp.broadcast(step_loss, mesh_.pp.size() - 1);
  record.loss = step_loss.item(0);
  if (mesh_.dp.size() > 1) record.loss = all_reduce_value(mesh_.dp, record.loss, ReduceOp::avg);
  DTP_CHECK(std::isfinite(record.loss), "train: the loss is ", record.loss, " at step ",
            record.step, "; try a lower --lr or a tighter --clip");
  // What this rank holds: whole gradients (averaged over the replicas here)
  // or FSDP's shards (averaged by their reduce-scatters).
  std::vector<Tensor> grads;
  for (auto& chunk : chunks_)
    for (Unit* unit : chunk->units())
      if (fsdp_.empty()) grads.push_back(unit->grads());
  for (auto& shards : fsdp_)
    for (Tensor& shard : shards->gradient_shards()) grads.push_back(shard);
  if (fsdp_.empty() && mesh_.dp.size() > 1)
    for (Tensor& g : grads) mesh_.dp.all_reduce(g, ReduceOp::avg);
  // Clip as clip_grad_norm does, by the norm of the whole model.
  double squares = 0;
  for (const Tensor& g : grads)
    for (double x : g.to_vector()) squares += x * x;
  squares = all_reduce_value(mesh_.pp, squares, ReduceOp::sum);
  if (!fsdp_.empty() && mesh_.dp.size() > 1)
    squares = all_reduce_value(mesh_.dp, squares, ReduceOp::sum);
  record.grad_norm = std::sqrt(squares);
  if (config.grad_clip > 0 && record.grad_norm > config.grad_clip &&
      std::isfinite(record.grad_norm)) {
    const double factor = config.grad_clip / (record.grad_norm + 1e-6);
    for (Tensor& g : grads) ops::scale(g, factor);
  }
  record.lr = config.schedule().at(serial_->steps_done());
  {
    trace::Scope span("optimizer step", "compute");
    serial_->optimizer().step(record.lr);
  }
  meter.finish(record, batch.inputs.numel());
  gather_timing(*current_memory_tracker());
  serial_->count_step();
  return record;
}

// Rank 0 of the world learns every rank's numbers (gathered over the
// pipeline, then over stage 0's replicas) and pipeline 0's actions.
void PipelineTrainer::gather_timing(const MemoryTracker& tracker) {
  enum { kStage, kDpRank, kParams, kActivationPeak, kPeakAlive, kClockBusy, kWallBusy, kCount };
  std::vector<double> mine(kCount, 0.0);
  mine[kStage] = mesh_.pp.rank();
  mine[kDpRank] = mesh_.dp.rank();
  mine[kParams] = static_cast<double>(tracker.live(MemoryCategory::params));
  mine[kActivationPeak] = static_cast<double>(tracker.peak(MemoryCategory::activations));
  // This rank's actions over all its chunks, in the order they ran (wall
  // time: the chunks' records interleave).
  std::vector<ActionRecord> ran;
  for (auto& chunk : chunks_)
    for (ActionRecord r : chunk->records()) {
      r.wall_start += chunk->wall_origin();
      r.wall_end += chunk->wall_origin();
      ran.push_back(r);
    }
  std::stable_sort(ran.begin(), ran.end(), [](const ActionRecord& a, const ActionRecord& b) {
    return a.wall_start < b.wall_start;
  });
  std::vector<Action> order;
  // Every action as 7 numbers: kind, micro-batch, chunk, clock start/end, wall start/end.
  std::vector<double> sorted;
  for (const ActionRecord& r : ran) {
    order.push_back(r.action);
    mine[kClockBusy] += r.clock_end - r.clock_start;
    mine[kWallBusy] += r.wall_end - r.wall_start;
    sorted.insert(sorted.end(),
                  {static_cast<double>(r.action.kind), static_cast<double>(r.action.microbatch),
                   static_cast<double>(r.action.chunk), r.clock_start, r.clock_end, r.wall_start,
                   r.wall_end});
  }
  mine[kPeakAlive] = peak_alive(order, schedule_.split_backward);
  const int p = mesh_.pp.size(), d = mesh_.dp.size();
  // On the communicator's device: NCCL moves device memory only.
  const Device on = mesh_.pp.device();
  Tensor row = Tensor::from_values(mine, DType::f64).to(on);
  Tensor rows = Tensor::zeros(Shape{static_cast<std::int64_t>(kCount) * p}, DType::f64, on);
  mesh_.pp.gather(row, rows, 0);
  Tensor all = Tensor::zeros(Shape{static_cast<std::int64_t>(kCount) * p * d}, DType::f64, on);
  Tensor mine_actions = Tensor::from_values(sorted, DType::f64).to(on);
  Tensor pipeline_actions =
      Tensor::zeros(Shape{static_cast<std::int64_t>(sorted.size()) * p}, DType::f64, on);
  // Every rank of a valid schedule runs the same number of actions.
  mesh_.pp.gather(mine_actions, pipeline_actions, 0);
  if (mesh_.pp.rank() != 0) return;
  mesh_.dp.gather(rows, all, 0);
  if (mesh_.dp.rank() != 0) return;
  timing_ = PipelineStepTiming{};
  const std::vector<double> v = all.to_vector();
  double busy_clock = 0, busy_wall = 0;
  for (int q = 0; q < p * d; ++q) {
    const double* at = &v[static_cast<std::size_t>(q) * kCount];
    RankPipelineStep r;
    r.stage = static_cast<int>(at[kStage]);
    r.dp_rank = static_cast<int>(at[kDpRank]);
    r.rank = r.stage * d + r.dp_rank;
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const UnitRange range =
          partition_[c * static_cast<std::size_t>(p) + static_cast<std::size_t>(r.stage)];
      r.units += (c ? "; " : "") + model().units()[static_cast<std::size_t>(range.first)]->name();
      if (range.count > 1)
        r.units += " .. " +
                   model().units()[static_cast<std::size_t>(range.first + range.count - 1)]->name();
    }
    r.params_bytes = static_cast<std::int64_t>(at[kParams]);
    r.activation_peak = static_cast<std::int64_t>(at[kActivationPeak]);
    r.peak_alive = static_cast<int>(at[kPeakAlive]);
    r.clock_busy = at[kClockBusy];
    r.wall_busy = at[kWallBusy];
    if (r.dp_rank == 0) busy_clock += r.clock_busy, busy_wall += r.wall_busy;
    timing_.ranks.push_back(r);
  }
  std::sort(timing_.ranks.begin(), timing_.ranks.end(),
            [](const RankPipelineStep& a, const RankPipelineStep& b) { return a.rank < b.rank; });
  const std::vector<double> acts = pipeline_actions.to_vector();
  double clock_first = 1e300, clock_last = -1e300, wall_first = 1e300, wall_last = -1e300;
  const std::size_t per_rank = sorted.size() / 7;
  timing_.actions.assign(static_cast<std::size_t>(p), {});
  for (int s = 0; s < p; ++s) {
    for (std::size_t i = 0; i < per_rank; ++i) {
      const double* a = &acts[(static_cast<std::size_t>(s) * per_rank + i) * 7];
      ActionRecord r;
      r.action = Action{static_cast<ActionKind>(static_cast<int>(a[0])), static_cast<int>(a[1]),
                        static_cast<int>(a[2])};
      r.clock_start = a[3];
      r.clock_end = a[4];
      r.wall_start = a[5];
      r.wall_end = a[6];
      clock_first = std::min(clock_first, r.clock_start);
      clock_last = std::max(clock_last, r.clock_end);
      wall_first = std::min(wall_first, r.wall_start);
      wall_last = std::max(wall_last, r.wall_end);
      timing_.actions[static_cast<std::size_t>(s)].push_back(r);
    }
  }
  // Both clocks relative to the step's first action.
  for (auto& list : timing_.actions)
    for (ActionRecord& r : list) {
      r.wall_start -= wall_first, r.wall_end -= wall_first;
      r.clock_start -= clock_first, r.clock_end -= clock_first;
    }
  timing_.clock_makespan = clock_last - clock_first;
  timing_.wall_makespan = wall_last - wall_first;
  timing_.clock_bubble =
      timing_.clock_makespan > 0 ? 1 - busy_clock / (p * timing_.clock_makespan) : 0;
  timing_.wall_bubble = timing_.wall_makespan > 0 ? 1 - busy_wall / (p * timing_.wall_makespan) : 0;
}

std::string executed_gantt_chart(const PipelineOptions& options, const PipelineStepTiming& timing) {
  Schedule shape =
      empty_schedule(schedule_kind_name(options.schedule), options.pp, options.microbatches,
                     chunks_of(options), options.schedule == ScheduleKind::zb_h1);
  ScheduleReport report;
  double first = 1e300;
  for (const auto& list : timing.actions)
    for (const ActionRecord& r : list) first = std::min(first, r.clock_start);
  for (const auto& list : timing.actions) {
    report.timeline.emplace_back();
    double busy = 0;
    for (const ActionRecord& r : list) {
      report.timeline.back().push_back({r.action, r.clock_start - first, r.clock_end - first});
      busy += r.clock_end - r.clock_start;
    }
    report.busy.push_back(busy);
  }
  for (const RankPipelineStep& r : timing.ranks)
    if (r.dp_rank == 0) report.peak_alive.push_back(r.peak_alive);
  report.makespan = timing.clock_makespan;
  report.bubble_fraction = timing.clock_bubble;
  return "    pipeline 0 as it ran (simulated clock):\n" + gantt_chart(shape, report);
}

namespace {

// One rank: its pipeline and DP groups, and its stage's units.
class PipelineRank : public drivers::RankRun {
 public:
  PipelineRank(const TrainConfig& config, const PipelineOptions& options, Comm& world)
      : options_(options),
        mesh_(make_pipeline_mesh(world, options.pp)),
        trainer_(config, mesh_, options) {}  // from --load's parameters, when given

  Trainer& trainer() override { return trainer_.trainer(); }
  void resume(const std::string& path, const std::vector<RunSetting>& settings) override {
    trainer_.resume(path, settings);
  }
  void save(Comm& world, const std::string& path,
            const std::vector<RunSetting>& settings) override {
    (void)world;
    trainer_.save(path, settings);  // collective
  }
  std::int64_t parameter_count() override { return trainer_.config().model.parameter_count(); }
  StepRecord step() override { return trainer_.step(); }

  // Stage 0's replicas (world ranks 0 .. dp-1) each hold a slice of the
  // batch; the step already made the loss the mean over them.
  GroupStepRule group_rule() const override {
    const int dp = options_.dp;
    return {[dp](int rank) { return rank < dp; }, false};
  }

  // Rank 0 of the world gathered every rank's numbers inside the step (timing()).
  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    (void)rows;
    using drivers::ColumnUnit;
    const PipelineStepTiming& timing = trainer_.timing();
    char line[160];
    std::snprintf(line, sizeof line, "bubble: clock %.1f%% (makespan %.6g), wall %.1f%% (%.2f ms)",
                  100.0 * timing.clock_bubble, timing.clock_makespan, 100.0 * timing.wall_bubble,
                  timing.wall_makespan * 1e3);
    report.lines.push_back(line);
    report.ranks.columns = {{"params", ColumnUnit::mebibytes},
                            {"activation peak", ColumnUnit::mebibytes},
                            {"alive", ColumnUnit::count},
                            {"busy", ColumnUnit::milliseconds}};
    for (const RankPipelineStep& r : timing.ranks)
      report.ranks.rows.push_back(
          {std::to_string(r.rank) + " (stage " + std::to_string(r.stage) + ", dp " +
               std::to_string(r.dp_rank) + ": " + r.units + ")",
           {static_cast<double>(r.params_bytes), static_cast<double>(r.activation_peak),
            static_cast<double>(r.peak_alive), r.wall_busy}});
    report.once = executed_gantt_chart(options_, timing);
  }

 private:
  PipelineOptions options_;
  PipelineMesh mesh_;  // before the trainer, which holds it
  PipelineTrainer trainer_;
};

}  // namespace

void PipelineStrategy::add_flags(drivers::FlagGroup& flags) {
  flags.integer("--pp", &options.pp, 1, 1024, "P",
                "pipeline stages; the model's units (embedding, blocks, head) are split over them");
  flags.integer("--microbatches", &options.microbatches, 1, kMaxMicrobatches, "M",
                "micro-batches per step; each data-parallel rank's batch must divide by M");
  flags.custom("--schedule", "KIND", "afab, 1f1b (default), interleaved or zb-h1",
               [this](const std::string& v) { options.schedule = parse_schedule_kind(v); });
  flags.integer("--chunks", &options.chunks, 2, 64, "V",
                "model chunks per rank for --schedule interleaved; M must be a multiple of P");
  flags.integer("--dp", &options.dp, 1, 1024, "D",
                "pipeline replicas; the world is P x D ranks, the D ranks of a stage consecutive");
  flags.toggle("--fsdp", &options.fsdp, "shard each stage over its D replicas (ZeRO-3, 5.8)");
  flags.custom(
      "--balance", "params|time",
      "split the units by parameters (default) or by their measured forward + backward time",
      [this](const std::string& v) {
        if (v != "params" && v != "time")
          throw drivers::UsageError("--balance accepts params or time, got '" + v + "'");
        options.balance_by_time = v == "time";
      });
  flags.paragraph(
      "After each kept step: the step's bubble (simulated clock and wall time), a row per rank, "
      "and "
      "on the first kept step the Gantt chart of pipeline 0 as it ran (F = 1, B = 2 on the clock; "
      "zb-h1: B = W = 1).");
}

void PipelineStrategy::resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
                               int processes) {
  (void)config, (void)processes;
  if (cli::was_given(given, "--chunks") && options.schedule != ScheduleKind::interleaved)
    throw drivers::UsageError(
        "--chunks sets v of --schedule interleaved; this run's schedule is not interleaved");
}

std::string PipelineStrategy::world_text() const {
  return "--pp " + std::to_string(options.pp) + " x --dp " + std::to_string(options.dp) + " = " +
         std::to_string(world_size()) + " ranks";
}

std::vector<RunSetting> PipelineStrategy::settings(const TrainConfig& config) const {
  (void)config;
  return {{"--pp", std::to_string(options.pp)},
          {"--dp", std::to_string(options.dp)},
          {"--microbatches", std::to_string(options.microbatches)},
          {"--schedule", schedule_kind_name(options.schedule)},
          {"--chunks", std::to_string(options.chunks)},
          {"--fsdp", options.fsdp ? "on" : "off"}};
}

std::string PipelineStrategy::header(const TrainConfig& config, const std::string& backend) const {
  const bool interleaved = options.schedule == ScheduleKind::interleaved;
  char line[400];
  std::snprintf(
      line, sizeof line,
      "pp: %d stages x %d replica(s) = %d ranks (%s backend), schedule %s%s, %d micro-batches of "
      "%lld "
      "sequences%s; units split by %s\n"
      "pp: the lesson's bubble for these settings: %.1f%%",
      options.pp, options.dp, options.pp * options.dp, backend.c_str(),
      schedule_kind_name(options.schedule),
      interleaved ? (" with " + std::to_string(options.chunks) + " chunks per rank").c_str() : "",
      options.microbatches,
      static_cast<long long>(config.batch / options.dp / options.microbatches),
      options.fsdp ? ", each stage FSDP-sharded over its replicas" : "",
      options.balance_by_time ? "measured time" : "parameters",
      100.0 * bubble_formula(options.schedule, options.pp, options.microbatches, options.chunks));
  return line;
}

std::unique_ptr<drivers::RankRun> PipelineStrategy::start(const TrainConfig& config,
                                                          Comm& world) const {
  return std::make_unique<PipelineRank>(config, options, world);
}

std::vector<drivers::PuzzleCall> PipelineStrategy::puzzle_calls(const TrainConfig& config) const {
  (void)config;
  if (!options.fsdp) return {};  // partition, schedule, executor: the chapter's order
  return {{"5.7", [](Comm& pp) {
             GPT model(drivers::tiny_probe_config());
             // The whole model as one stage, one micro-batch: F then B.
             StageModule stage(model, UnitRange{0, static_cast<int>(model.units().size())});
             Schedule schedule = empty_schedule("afab", 1, 1);
             schedule.actions[0] = {F(0), B(0)};
             const Tensor ids = Tensor::zeros(Shape{1, 4}, DType::i32);
             execute_schedule(pp, schedule, {&stage}, {MicroBatch{ids, ids}});
           }}};
}

}  // namespace dtp::ch05

namespace dtp::strategies {
drivers::Strategy& pp() {
  static ch05::PipelineStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
