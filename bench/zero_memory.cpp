// dtp-bench-zero-memory: per-rank memory and step time of the ZeRO stages
// (chapter 03) against data parallelism, for a range of world sizes.
//   dtp-bench-zero-memory [--worlds 1,2,...,8] [--stages ddp,zero1,...] [--steps 6]
//                         [--layers 4] [--d-model 128] [--heads 4] [--seq 64]
//                         [--batch 2] [--optimizer adamw|sgd] [--dtype f32|f64]
//                         [--repeats 3] [--json FILE]
// (--help lists them with their defaults.)
// Stages:
//   ddp             a full replica per rank; one all_reduce(avg) per unit's
//                   flat gradient after backward (written here, chapter 02's 2.2)
//   zero1           3.1, optimizer state sharded
//   zero2           3.2, gradients sharded too
//   zero3           3.3, parameters sharded too (FSDP units, gathered on demand)
//   zero3-prefetch  3.4, the next unit's all-gather started early
//   zero1-offload   3.5, ZeRO-1 with the optimizer in host memory
// Every stage runs the reference (dtp_reference), plugged into the Trainer as
// chapters/03_zero_fsdp/zero.h shows. Each rank reads its tracker's peak bytes
// per category after every step but the first (Trainer::step() resets the
// peaks when it starts, so these are steady-state peaks) and compares them with
// the lesson's formulas, computed here from the shard lengths. Step time: the
// slowest rank's time of each step, median over the steps after two warm-up
// steps of every repeat. The stages of one world run in turn, --repeats times
// round-robin, so a machine that speeds up or slows down during the run (other
// work, frequency changes) moves every stage alike and the ratios to DDP hold.
// Prints a table and appends one JSON object per (stage, world).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "03_zero_fsdp/zero.h"
#include "bench_common.h"
#include "bench_flags.h"
#include "dtp/json.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"

namespace {

using dtp::MemoryCategory;
using namespace dtp::bench;

const char* const kStages[] = {"ddp", "zero1", "zero2", "zero3", "zero3-prefetch", "zero1-offload"};

// --- the lesson's formulas (chapters/03_zero_fsdp/README.md, section 2) -------

// Element counts of the model's units as one rank sees them.
struct ShardSizes {
  std::int64_t total = 0;         // Psi: elements of the whole model
  std::int64_t shards = 0;        // S: sum over units of this rank's chunk_range length
  std::int64_t largest_unit = 0;  // U: elements of the largest unit
  std::int64_t largest_pair = 0;  // P: the largest sum of two neighbouring units
};

ShardSizes shard_sizes(const std::vector<std::int64_t>& units, int world, int rank) {
  ShardSizes s;
  for (std::size_t u = 0; u < units.size(); ++u) {
    s.total += units[u];
    s.shards += dtp::chunk_range(units[u], world, rank).length;
    s.largest_unit = std::max(s.largest_unit, units[u]);
    s.largest_pair = std::max(s.largest_pair, units[u] + (u + 1 < units.size() ? units[u + 1] : 0));
  }
  return s;
}

// Bytes per category on the model's device, and the optimizer bytes in host
// memory where the device is a GPU (offload), as the lesson's table says.
struct Bytes {
  std::int64_t params = 0, grads = 0, optimizer = 0, host_optimizer = 0;
  std::int64_t total() const { return params + grads + optimizer; }
};

Bytes formula(const std::string& stage, const ShardSizes& z, std::int64_t states, std::int64_t e,
              bool on_gpu) {
  const std::int64_t Psi = z.total, S = z.shards, U = z.largest_unit, P = z.largest_pair;
  Bytes b;
  if (stage == "ddp")
    b = {Psi, Psi, states * Psi, 0};
  else if (stage == "zero1")
    b = {Psi, Psi + S, states * S, 0};
  else if (stage == "zero2")
    b = {Psi, S + U, states * S, 0};
  else if (stage == "zero3")
    b = {S + U, S + U, states * S, 0};
  else if (stage == "zero3-prefetch")
    b = {S + P, S + U, states * S, 0};
  else if (on_gpu)
    b = {Psi, Psi + S, 0, (states + 1) * S};  // zero1-offload: host grads S not on the device
  else
    b = {Psi, Psi + 2 * S, (states + 1) * S, 0};  // zero1-offload on the CPU: one memory
  b.params *= e;
  b.grads *= e;
  b.optimizer *= e;
  b.host_optimizer *= e;
  return b;
}

// --- one run ---------------------------------------------------------------------

// What each rank reports (gathered to rank 0 after the run): steady-state
// peak bytes (params .. host optimizer), then the last step's collective
// calls and bytes.
enum Field {
  kParams,
  kGrads,
  kOptimizer,
  kHostOptimizer,
  kAllReduces,
  kAllGathers,
  kReduceScatters,
  kCommBytes,
  kFieldCount
};

struct RankResult {
  std::vector<double> fields;
  std::vector<double> step_seconds;
};

struct Run {
  std::vector<RankResult> ranks;    // filled in the process that hosted rank 0
  std::vector<std::int64_t> units;  // elements of each unit
  bool hosted_rank0 = false;
  bool on_gpu = false;
};

Run run_stage(const std::string& stage, int world, const dtp::TrainConfig& base,
              std::int64_t steps) {
  Run run;
  dtp::launch(dtp::World::from_env(world), [&](dtp::Comm& comm) {
    dtp::TrainConfig config = base;
    config.model.device = comm.device();
    dtp::Trainer trainer(config, comm.rank(), comm.size());
    dtp::GPT& model = trainer.model();
    if (stage == "ddp") {
      trainer.on_after_backward([&comm, &model] {
        for (dtp::Unit* unit : model.units()) comm.all_reduce(unit->grads(), dtp::ReduceOp::avg);
      });
    } else {
      std::unique_ptr<dtp::ch03::ShardedOptimizer> zero;
      if (stage == "zero1")
        zero = std::make_unique<dtp::ch03::Zero1>(comm, model, trainer.config());
      else if (stage == "zero2")
        zero = std::make_unique<dtp::ch03::Zero2>(comm, model, trainer.config());
      else if (stage == "zero3")
        zero = std::make_unique<dtp::ch03::Zero3>(comm, model, trainer.config());
      else if (stage == "zero3-prefetch")
        zero = std::make_unique<dtp::ch03::Zero3Prefetch>(comm, model, trainer.config());
      else
        zero = std::make_unique<dtp::ch03::Zero1Offload>(comm, model, trainer.config());
      trainer.on_after_backward([z = zero.get()] { z->finish_backward(); });
      trainer.set_optimizer(std::move(zero));
    }

    const dtp::Device::Kind kind = comm.device().kind;
    dtp::MemoryTracker& tracker = *dtp::current_memory_tracker();
    std::vector<double> mine(kFieldCount, 0.0);
    std::vector<double> seconds;
    for (std::int64_t s = 0; s < steps; ++s) {
      const dtp::CommStats before = comm.stats();
      const dtp::StepRecord record = trainer.step();
      const dtp::CommStats after = comm.stats();
      seconds.push_back(record.seconds);
      if (s == 0) continue;  // the first step allocates what later steps reuse
      mine[kParams] =
          std::max(mine[kParams], static_cast<double>(tracker.peak(MemoryCategory::params, kind)));
      mine[kGrads] =
          std::max(mine[kGrads], static_cast<double>(tracker.peak(MemoryCategory::grads, kind)));
      mine[kOptimizer] = std::max(
          mine[kOptimizer], static_cast<double>(tracker.peak(MemoryCategory::optimizer, kind)));
      if (kind != dtp::Device::Kind::cpu)
        mine[kHostOptimizer] = std::max(
            mine[kHostOptimizer],
            static_cast<double>(tracker.peak(MemoryCategory::optimizer, dtp::Device::Kind::cpu)));
      auto calls = [&](const char* op) {
        auto count = [op](const dtp::CommStats& st) {
          auto it = st.collective_calls.find(op);
          return it == st.collective_calls.end() ? std::int64_t{0} : it->second;
        };
        return static_cast<double>(count(after) - count(before));
      };
      mine[kAllReduces] = calls("all_reduce");
      mine[kAllGathers] = calls("all_gather");
      mine[kReduceScatters] = calls("reduce_scatter");
      mine[kCommBytes] = static_cast<double>(after.collective_bytes - before.collective_bytes);
    }

    // Rank 0 collects every rank's numbers (outside the timed steps).
    std::vector<double> values = mine;
    values.insert(values.end(), seconds.begin(), seconds.end());
    const auto per_rank = static_cast<std::int64_t>(values.size());
    dtp::Tensor local = dtp::Tensor::from_values(values, dtp::DType::f64).to(comm.device());
    dtp::Tensor all =
        dtp::Tensor::zeros(dtp::Shape{per_rank * comm.size()}, dtp::DType::f64, comm.device());
    comm.gather(local, all, 0);
    if (comm.rank() != 0) return;
    const std::vector<double> v = all.to_vector();
    for (int r = 0; r < comm.size(); ++r) {
      const auto first = v.begin() + static_cast<std::ptrdiff_t>(r * per_rank);
      RankResult result;
      result.fields.assign(first, first + kFieldCount);
      result.step_seconds.assign(first + kFieldCount, first + per_rank);
      run.ranks.push_back(result);
    }
    for (dtp::Unit* unit : model.units()) run.units.push_back(unit->numel());
    run.on_gpu = comm.device().is_cuda();
    run.hosted_rank0 = true;
  });
  return run;
}

// The slowest rank's time of each step after two warm-up steps, appended to @p into.
void add_slowest_steps(const Run& run, std::vector<double>& into) {
  const std::size_t steps = run.ranks.empty() ? 0 : run.ranks[0].step_seconds.size();
  for (std::size_t s = 2; s < steps; ++s) {
    double t = 0;
    for (const RankResult& r : run.ranks) t = std::max(t, r.step_seconds[s]);
    into.push_back(t);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> worlds = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<std::string> stages(std::begin(kStages), std::end(kStages));
  std::int64_t steps = 6, per_rank_batch = 2, repeats = 3;
  std::string json_path;
  dtp::TrainConfig config;
  config.model.layers = 4;
  config.model.d_model = 128;
  config.model.heads = 4;
  config.seq = 64;
  config.optimizer = "adamw";
  config.synthetic.length = 1 << 16;
  CLI::App app{
      "Per-rank memory and step time of the ZeRO stages (chapter 03) against data parallelism, for "
      "a "
      "range of world sizes: every stage runs the reference, plugged into the Trainer; each rank's "
      "tracker peaks per category (steady state, after the first step) are compared with the "
      "lesson's "
      "formulas; step time is the slowest rank's, median over the steps after two warm-up steps of "
      "every "
      "repeat. Stages: ddp (a full replica per rank, one all_reduce per unit's flat gradient), "
      "zero1 "
      "(3.1, optimizer state sharded), zero2 (3.2, gradients too), zero3 (3.3, parameters too: "
      "FSDP "
      "units), zero3-prefetch (3.4, the next unit's all-gather started early), zero1-offload (3.5, "
      "optimizer in host memory).",
      "dtp-bench-zero-memory"};
  dtp::cli::add_list_option(app, "--worlds", worlds, "world sizes, a comma list", "N,...")
      ->check(dtp::cli::Range(1, 1024))
      ->capture_default_str();
  dtp::cli::add_list_option(
      app, "--stages", stages,
      "a comma list of stages; ddp is always run too, as the baseline of the time ratio",
      "STAGE,...")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kStages), std::end(kStages))))
      ->capture_default_str();
  app.add_option("--steps", steps,
                 "steps per run: peaks from step 2 on, times after 2 warm-up steps")
      ->check(dtp::cli::Range(std::int64_t{3}, std::int64_t{1000000}))
      ->capture_default_str();
  dtp::bench::add_model_options(app, config);
  app.add_option("--batch", per_rank_batch,
                 "sequences per rank per step (the global batch is B x world)")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--repeats", repeats,
                 "runs of every stage per world, in turn: times pooled over them")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000}))
      ->capture_default_str();
  app.add_option("--json", json_path, "append one JSON object per (stage, world) to FILE")
      ->type_name("FILE");
  app.footer("Backend and device from DTP_BACKEND and DTP_DEVICE (default thread, cpu).");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  config.steps = steps;
  const std::int64_t states = config.optimizer == "adamw" ? 2 : (config.momentum != 0 ? 1 : 0);
  const auto e = static_cast<std::int64_t>(dtp::dtype_size(config.model.dtype));
  // DDP first at every world: the baseline of the time ratio.
  std::vector<std::string> order = {"ddp"};
  for (const std::string& s : stages)
    if (s != "ddp") order.push_back(s);

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const std::string rev = git_revision();
  const std::optional<RunContext> context = context_from_env("dtp-bench-zero-memory");
  if (!context) return 2;
  const std::string backend = context->backend;
  const std::string device = context->device;
  FILE* json = nullptr;
  if (!open_json("dtp-bench-zero-memory", json_path, json)) return 2;

  bool printed_header = false;
  int mismatches = 0;
  for (int world : worlds) {
    // Every stage once per round, --repeats rounds: memory from the first
    // run (every run holds the same), times pooled over all of them.
    std::vector<Run> first(order.size());
    std::vector<std::vector<double>> times(order.size());
    for (std::int64_t round = 0; round < repeats; ++round) {
      for (std::size_t i = 0; i < order.size(); ++i) {
        dtp::TrainConfig c = config;
        c.batch = per_rank_batch * world;
        try {
          Run run = run_stage(order[i], world, c, steps);
          add_slowest_steps(run, times[i]);
          if (round == 0) first[i] = std::move(run);
        } catch (const std::exception& error) {
          std::fprintf(stderr, "dtp-bench-zero-memory: %s on %d rank(s) failed: %s\n",
                       order[i].c_str(), world, error.what());
          return 1;
        }
      }
    }
    double ddp_seconds = 0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      const std::string& stage = order[i];
      const Run& run = first[i];
      if (!run.hosted_rank0) continue;  // under mpiexec, only rank 0's process reports
      const double seconds = median(times[i]);
      if (stage == "ddp") ddp_seconds = seconds;
      if (!printed_header) {
        std::int64_t psi = 0;
        for (std::int64_t n : run.units) psi += n;
        std::printf(
            "# zero memory, %s backend on %s, %s, %s (%lld optimizer state(s) per parameter)\n",
            backend.c_str(), device.c_str(), dtp::dtype_name(config.model.dtype),
            config.optimizer.c_str(), static_cast<long long>(states));
        std::printf(
            "# model: d_model %d, %d layers, %d heads, %zu units, Psi = %lld parameters; "
            "%lld x %lld tokens per rank; median of %lld steps x %lld rounds\n",
            config.model.d_model, config.model.layers, config.model.heads, run.units.size(),
            static_cast<long long>(psi), static_cast<long long>(per_rank_batch),
            static_cast<long long>(config.seq), static_cast<long long>(steps - 2),
            static_cast<long long>(repeats));
        std::printf(
            "# peaks in KiB on the model's device; 'max' is the largest over ranks; formula for "
            "that rank\n");
        std::printf("%-15s %5s %10s %10s %10s %10s %10s %8s %10s %9s %9s\n", "stage", "world",
                    "params", "grads", "optimizer", "total", "max total", "formula", "step ms",
                    "vs ddp", "comm MiB");
        printed_header = true;
      }
      // Per rank: measured and formula; the rank with the largest total is
      // the one that limits the model size.
      std::vector<std::int64_t> params, grads, optimizer, formula_total;
      Bytes rank0_formula, max_formula;
      std::int64_t max_total = 0;
      double worst_ratio = 1.0;
      for (int r = 0; r < world; ++r) {
        const RankResult& rr = run.ranks[static_cast<std::size_t>(r)];
        const Bytes want = formula(stage, shard_sizes(run.units, world, r), states, e, run.on_gpu);
        const Bytes got{static_cast<std::int64_t>(rr.fields[kParams]),
                        static_cast<std::int64_t>(rr.fields[kGrads]),
                        static_cast<std::int64_t>(rr.fields[kOptimizer]),
                        static_cast<std::int64_t>(rr.fields[kHostOptimizer])};
        params.push_back(got.params);
        grads.push_back(got.grads);
        optimizer.push_back(got.optimizer);
        formula_total.push_back(want.total());
        if (r == 0) rank0_formula = want;
        if (got.total() > max_total) {
          max_total = got.total();
          max_formula = want;
        }
        const std::pair<std::int64_t, std::int64_t> checks[] = {
            {got.params, want.params},
            {got.grads, want.grads},
            {got.optimizer, want.optimizer},
            {got.host_optimizer, want.host_optimizer}};
        for (const auto& [g, w] : checks) {
          const double ratio =
              w > 0 ? static_cast<double>(g) / static_cast<double>(w) : (g == 0 ? 1.0 : 99.0);
          if (std::abs(ratio - 1.0) > std::abs(worst_ratio - 1.0)) worst_ratio = ratio;
        }
      }
      if (std::abs(worst_ratio - 1.0) > 1e-9) ++mismatches;
      const RankResult& r0 = run.ranks[0];
      const std::int64_t total0 = params[0] + grads[0] + optimizer[0];
      const double vs_ddp = ddp_seconds > 0 ? seconds / ddp_seconds : 0;
      std::printf("%-15s %5d %10.1f %10.1f %10.1f %10.1f %10.1f %8s %10.2f %8.2fx %9.2f\n",
                  stage.c_str(), world, params[0] / 1024.0, grads[0] / 1024.0,
                  optimizer[0] / 1024.0, total0 / 1024.0, max_total / 1024.0,
                  std::abs(worst_ratio - 1.0) <= 1e-9
                      ? "exact"
                      : (std::to_string(worst_ratio).substr(0, 6) + "x").c_str(),
                  seconds * 1e3, vs_ddp, r0.fields[kCommBytes] / (1024.0 * 1024.0));
      if (json) {
        JsonLine line;
        line.add("what", "zero_memory")
            .add("stage", stage)
            .add("backend", backend)
            .add("device", device)
            .add("world", world)
            .add("dtype", dtp::dtype_name(config.model.dtype))
            .add("optimizer", config.optimizer)
            .add("optimizer_states", states)
            .add("d_model", config.model.d_model)
            .add("layers", config.model.layers)
            .add("heads", config.model.heads)
            .add("seq", config.seq)
            .add("per_rank_batch", per_rank_batch)
            .add("unit_numel", run.units)
            .add("params_bytes", params[0])
            .add("grads_bytes", grads[0])
            .add("optimizer_bytes", optimizer[0])
            .add("host_optimizer_bytes", static_cast<std::int64_t>(r0.fields[kHostOptimizer]))
            .add("formula_params_bytes", rank0_formula.params)
            .add("formula_grads_bytes", rank0_formula.grads)
            .add("formula_optimizer_bytes", rank0_formula.optimizer)
            .add("formula_host_optimizer_bytes", rank0_formula.host_optimizer)
            .add("params_bytes_per_rank", params)
            .add("grads_bytes_per_rank", grads)
            .add("optimizer_bytes_per_rank", optimizer)
            .add("formula_total_bytes_per_rank", formula_total)
            .add("max_total_bytes", max_total)
            .add("formula_max_total_bytes", max_formula.total())
            .add("worst_ratio_to_formula", worst_ratio)
            .add("step_s", seconds)
            .add("ddp_step_s", ddp_seconds)
            .add("vs_ddp", vs_ddp)
            .add("all_reduces", static_cast<std::int64_t>(r0.fields[kAllReduces]))
            .add("all_gathers", static_cast<std::int64_t>(r0.fields[kAllGathers]))
            .add("reduce_scatters", static_cast<std::int64_t>(r0.fields[kReduceScatters]))
            .add("collective_bytes", static_cast<std::int64_t>(r0.fields[kCommBytes]))
            .add("steps", steps)
            .add("repeats", repeats)
            .add("date", date)
            .add("git", rev);
        // A failed write is reported when the file is closed (close_json).
        std::fprintf(json, "%s\n", line.str().c_str());
        std::fflush(json);
      }
    }
  }
  if (close_json(json, "dtp-bench-zero-memory", 0) != 0) return 1;
  if (printed_header && mismatches > 0)
    std::printf(
        "# %d row(s) differ from the formulas: the 'formula' column shows the worst ratio of any "
        "rank and "
        "category\n",
        mismatches);
  return 0;
}
