// dtp-bench-tp-step: tensor parallelism (chapter 04), measured on this
// machine and, for its communication, predicted for a GPU cluster.
//   dtp-bench-tp-step [--tps 1,2,4] [--steps 10] [--warmup 2] [--repeats 3]
//                     [--layers 4] [--d-model 256] [--heads 8] [--seq 128] [--batch 8]
//                     [--optimizer adamw|sgd] [--dtype f32|f64] [--only step|tiers]
//                     [--nvlink 3,450] [--infiniband 8,50] [--quick] [--json FILE]
// (--help lists them with their defaults.)
//
// Part 1, "tp_step": the reference's TensorParallelTrainer (the step of
// `dtp train --strategy tp`) on t = 1, 2, 4 ranks, sequence parallelism off
// and on. Per rank: the parameter bytes after setup (the tracker's live
// MemoryCategory::params), the activation peak of a step
// (StepRecord::peak_activation_bytes), the bytes the TP group's collectives
// count per step (CommStats::collective_bytes, each call its whole buffer)
// and the bytes a ring sends per rank (the alpha-beta clock run with
// alpha = 0, beta = 1, so it counts bytes on the critical path); the step
// time of the slowest rank, median over the timed steps of every repeat. The
// configurations run in turn, --repeats times round-robin, so a machine that
// speeds up or slows down moves them all alike.
// Peers, in the same run: the serial Trainer (the ordinary GPT on one rank,
// what TP at t = 1 must match), and the lesson's formulas
// (chapters/04_tensor_parallel/README.md): parameters per rank
// (Psi - Psi_rep)/t + Psi_rep, the blocks' saved activations A_TP and A_SP
// (section 6) and the counted bytes per step (section 7).
//
// Part 2, "tp_comm_tiers": what the alpha-beta clock predicts for the
// communication of one GPT-2-XL-sized block (C = 1600, bf16), forward and
// backward, N = 1 x 1024 and 8 x 1024 tokens, t = 2, 4, 8, on two tiers of
// a GPU cluster: NVLink inside a node and InfiniBand across nodes. The
// collectives really run (thread backend, t threads) with World::cost set to
// the tier; the clock after them is the prediction. Peers: the ring formula
// 4 x 2(t-1)(alpha + beta S/t), and an estimate of the block's compute on an
// H100 (72 N C^2 / t flops at 400 TFLOP/s).
//
// Prints two tables and appends one JSON object per measurement to --json FILE.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "04_tensor_parallel/tensor_parallel.h"
#include "bench_common.h"
#include "bench_flags.h"
#include "drivers/04_tensor_parallel/tp_strategy.h"
#include "dtp/json.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"

namespace {

using dtp::MemoryCategory;
using namespace dtp::bench;
constexpr double kMiB = 1024.0 * 1024.0;

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / kMiB; }

// --- where and when ----------------------------------------------------------------

// What every JSON line says about the run.

// --- part 1: the lesson's formulas ----------------------------------------------------

// The serial model's parameters, split the way a TP rank holds them.
struct Census {
  dtp::TrainConfig config;      // as resolved (vocabulary and context filled in)
  std::int64_t total = 0;       // Psi
  std::int64_t replicated = 0;  // Psi_rep: every TP rank holds these whole
  std::int64_t serial_params_bytes = 0;
};

Census census_of(const dtp::TrainConfig& config) {
  Census census;
  dtp::launch(dtp::World::from_env(1), [&](dtp::Comm&) {
    dtp::Trainer serial(config);
    census.config = serial.config();
    for (dtp::Unit* unit : serial.model().units())
      for (const dtp::ParamView& p : unit->parameters()) {
        census.total += p.value.numel();
        if (dtp::ch04::is_replicated(p.name)) census.replicated += p.value.numel();
      }
    census.serial_params_bytes = dtp::current_memory_tracker()->live(MemoryCategory::params);
  });
  return census;
}

// Section 7: (Psi - Psi_rep)/t + Psi_rep parameters per rank.
std::int64_t formula_params_bytes(const Census& c, int t) {
  const auto e = static_cast<std::int64_t>(dtp::dtype_size(c.config.model.dtype));
  return ((c.total - c.replicated) / t + c.replicated) * e;
}

// Section 6: what the L blocks keep for backward, per rank (naive attention):
// A_TP = 4NC + 12NC/t + 4N + BHT^2/t, A_SP = 2NC + 14NC/t + 4N/t + BHT^2/t elements.
std::int64_t formula_block_activation_bytes(const dtp::TrainConfig& config, int t, bool sp) {
  const std::int64_t B = config.batch, T = config.seq, N = B * T, C = config.model.d_model;
  const std::int64_t H = config.model.heads, L = config.model.layers;
  const auto e = static_cast<std::int64_t>(dtp::dtype_size(config.model.dtype));
  const std::int64_t per_block = sp ? 2 * N * C + 14 * N * C / t + 4 * N / t + B * H * T * T / t
                                    : 4 * N * C + 12 * N * C / t + 4 * N + B * H * T * T / t;
  return L * per_block * e;
}

// Section 7, the whole step as comm.stats() counts it (each call's buffer):
// blocks 4S each (SP: 8S + the 6C replicated gradients), the embedding and
// the LM head S each (SP: 2S each, and the final LayerNorm's 2C), the loss's
// two all-reduces (N maxima, then 2N sums) and the grad norm (one f64).
std::int64_t formula_counted_bytes(const dtp::TrainConfig& config, bool sp) {
  const std::int64_t N = config.batch * config.seq, C = config.model.d_model,
                     L = config.model.layers;
  const auto e = static_cast<std::int64_t>(dtp::dtype_size(config.model.dtype));
  const std::int64_t S = N * C * e, loss = 3 * N * e, norm = 8;
  if (!sp) return L * 4 * S + 2 * S + loss + norm;
  return L * (8 * S + 6 * C * e) + 4 * S + 2 * C * e + loss + norm;
}

// --- part 1: one run ---------------------------------------------------------------

// What each rank reports (gathered to rank 0): setup and steady-state
// numbers, then the time of every step.
enum Field {
  kParams,
  kActivationPeak,
  kCounted,
  kRing,
  kAllReduces,
  kAllGathers,
  kReduceScatters,
  kFieldCount
};

struct RankResult {
  std::vector<double> fields;
  std::vector<double> step_seconds;
};

struct Run {
  std::vector<RankResult> ranks;  // filled in the process that hosted rank 0
  bool hosted_rank0 = false;
};

// One configuration: t = 0 is the serial Trainer (the peer), else TP over t ranks.
struct Setup {
  int t = 1;
  bool sp = false;
  bool serial() const { return t == 0; }
  int ranks() const { return serial() ? 1 : t; }
  std::string name() const { return serial() ? "serial" : "tp"; }
};

// A step of whichever trainer a setup uses, with the TP group's counters around it.
struct StepNumbers {
  dtp::StepRecord record;
  dtp::CommStats before, after;
};

// Rank 0 collects every rank's numbers (outside the timed steps).
void gather_to_rank0(dtp::Comm& comm, const std::vector<double>& mine,
                     const std::vector<double>& seconds, Run& run) {
  std::vector<double> values = mine;
  values.insert(values.end(), seconds.begin(), seconds.end());
  const std::vector<std::vector<double>> rows = dtp::gather_rows_to_rank0(comm, values);
  if (comm.rank() != 0) return;
  for (const std::vector<double>& row : rows)
    run.ranks.push_back({std::vector<double>(row.begin(), row.begin() + kFieldCount),
                         std::vector<double>(row.begin() + kFieldCount, row.end())});
  run.hosted_rank0 = true;
}

// Folds one step into this rank's fields (steps after the warm-up only).
void record_step(const StepNumbers& s, std::vector<double>& mine) {
  auto calls = [&](const char* op) {
    auto count = [op](const dtp::CommStats& st) {
      auto it = st.collective_calls.find(op);
      return it == st.collective_calls.end() ? std::int64_t{0} : it->second;
    };
    return static_cast<double>(count(s.after) - count(s.before));
  };
  mine[kActivationPeak] =
      std::max(mine[kActivationPeak], static_cast<double>(s.record.peak_activation_bytes));
  mine[kCounted] = static_cast<double>(s.after.collective_bytes - s.before.collective_bytes);
  mine[kRing] = s.after.clock - s.before.clock;
  mine[kAllReduces] = calls("all_reduce");
  mine[kAllGathers] = calls("all_gather");
  mine[kReduceScatters] = calls("reduce_scatter");
}

Run run_setup(const Setup& setup, const dtp::TrainConfig& base, std::int64_t warmup,
              std::int64_t steps) {
  Run run;
  dtp::World world = dtp::World::from_env(setup.ranks());
  world.cost = dtp::CostModel::bytes();  // the clock counts the bytes a ring sends per rank
  dtp::launch(world, [&](dtp::Comm& comm) {
    dtp::TrainConfig config = base;
    config.model.device = comm.device();
    config.steps = warmup + steps;
    std::vector<double> mine(kFieldCount, 0.0), seconds;
    dtp::MemoryTracker& tracker = *dtp::current_memory_tracker();
    auto run_steps = [&](auto&& one_step) {
      for (std::int64_t s = 0; s < warmup + steps; ++s) {
        const StepNumbers numbers = one_step();
        seconds.push_back(numbers.record.seconds);
        if (s >= warmup) record_step(numbers, mine);
      }
    };
    if (setup.serial()) {
      dtp::Trainer trainer(config);
      mine[kParams] = static_cast<double>(tracker.live(MemoryCategory::params));
      run_steps([&] { return StepNumbers{trainer.step(), comm.stats(), comm.stats()}; });
    } else {
      dtp::ch04::Mesh mesh = dtp::ch04::make_mesh(comm, setup.t);
      dtp::ch04::TensorParallelTrainer trainer(config, mesh,
                                               dtp::ch04::TensorParallelOptions{setup.sp});
      mine[kParams] = static_cast<double>(tracker.live(MemoryCategory::params));
      run_steps([&] {
        StepNumbers numbers;
        numbers.before = mesh.tp.stats();
        numbers.record = trainer.step();
        numbers.after = mesh.tp.stats();
        return numbers;
      });
    }
    gather_to_rank0(comm, mine, seconds, run);
  });
  return run;
}

// The slowest rank's time of each step after the warm-up, appended to @p into.
void add_slowest_steps(const Run& run, std::int64_t warmup, std::vector<double>& into) {
  const std::size_t steps = run.ranks.empty() ? 0 : run.ranks[0].step_seconds.size();
  for (auto s = static_cast<std::size_t>(warmup); s < steps; ++s) {
    double t = 0;
    for (const RankResult& r : run.ranks) t = std::max(t, r.step_seconds[s]);
    into.push_back(t);
  }
}

// --- part 1: the table ----------------------------------------------------------------

struct StepOptions {
  std::vector<int> tps = {1, 2, 4};
  std::int64_t warmup = 2, steps = 10, repeats = 3;
  dtp::TrainConfig config;
};

std::vector<std::int64_t> per_rank(const Run& run, Field field) {
  std::vector<std::int64_t> out;
  for (const RankResult& r : run.ranks) out.push_back(static_cast<std::int64_t>(r.fields[field]));
  return out;
}

std::int64_t largest(const std::vector<std::int64_t>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

void print_step_header(const StepOptions& o, const Census& c, const RunContext& ctx) {
  const dtp::TrainConfig& cfg = c.config;
  std::printf("# tp step: %s backend on %s (%d cores), %s, %s\n", ctx.backend.c_str(),
              ctx.device.c_str(), ctx.cores, dtp::dtype_name(cfg.model.dtype),
              cfg.optimizer.c_str());
  std::printf(
      "# model: GPT d_model %d, %d layers, %d heads, vocabulary %d, Psi = %lld parameters (%lld "
      "replicated); "
      "batch %lld x %lld tokens on every rank of the TP group; median of %lld steps x %lld rounds "
      "after %lld "
      "warm-up steps\n",
      cfg.model.d_model, cfg.model.layers, cfg.model.heads, cfg.model.vocab_size,
      static_cast<long long>(c.total), static_cast<long long>(c.replicated),
      static_cast<long long>(cfg.batch), static_cast<long long>(cfg.seq),
      static_cast<long long>(o.steps), static_cast<long long>(o.repeats),
      static_cast<long long>(o.warmup));
  std::printf(
      "# per rank, the largest over ranks. params: live after setup | formula (Psi - Psi_rep)/t + "
      "Psi_rep.\n"
      "# act peak: the step's activation peak | blocks A: the L blocks' saved activations, A_TP or "
      "A_SP (README "
      "section 6).\n"
      "# counted: collective_bytes of one step (each call its whole buffer) | formula (section 7). "
      "ring: bytes a "
      "ring sends per rank (clock, alpha 0 beta 1).\n"
      "# step: the slowest rank's, median. x t=1: against t = 1 with the same SP setting.\n");
  std::printf("%-6s %2s %3s %10s %8s %6s %9s %8s %6s %9s %8s %8s %9s %6s\n", "model", "t", "SP",
              "params MiB", "formula", "x t=1", "act MiB", "blocks A", "x t=1", "counted",
              "formula", "ring MiB", "step ms", "x t=1");
}

struct Baseline {
  double params = 0, activations = 0, seconds = 0;
};

// @p times: the slowest rank's step times of every round, the rounds one after the other.
void report_setup(const Setup& setup, const Run& run, const std::vector<double>& times,
                  const StepOptions& o, const Census& c, const Baseline& base,
                  const RunContext& ctx, FILE* json) {
  const dtp::TrainConfig& cfg = c.config;
  const int t = setup.ranks();
  const std::vector<std::int64_t> params = per_rank(run, kParams),
                                  act = per_rank(run, kActivationPeak),
                                  counted = per_rank(run, kCounted), ring = per_rank(run, kRing);
  const double seconds = median(times);
  const std::int64_t want_params =
      setup.serial() ? c.serial_params_bytes : formula_params_bytes(c, t);
  const std::int64_t want_act = formula_block_activation_bytes(cfg, t, setup.sp);
  const std::int64_t want_counted = setup.serial() ? 0 : formula_counted_bytes(cfg, setup.sp);
  auto ratio = [](double value, double to) { return to > 0 ? value / to : 0.0; };
  const double x_params = ratio(static_cast<double>(largest(params)), base.params);
  const double x_act = ratio(static_cast<double>(largest(act)), base.activations);
  const double x_time = ratio(seconds, base.seconds);
  std::vector<double> round_medians;  // drift shows here
  const auto per_round = static_cast<std::ptrdiff_t>(o.steps);
  for (auto first = times.begin(); times.end() - first >= per_round; first += per_round)
    round_medians.push_back(median(std::vector<double>(first, first + per_round)));
  std::printf("%-6s %2s %3s %10.2f %8.2f %6.2f %9.2f %8.2f %6.2f %9.2f %8.2f %8.2f %9.1f %6.2f\n",
              setup.name().c_str(), setup.serial() ? "-" : std::to_string(t).c_str(),
              setup.serial() ? "-" : (setup.sp ? "on" : "off"), mib(largest(params)),
              mib(want_params), x_params, mib(largest(act)), mib(want_act), x_act,
              mib(largest(counted)), mib(want_counted), mib(largest(ring)), seconds * 1e3, x_time);
  JsonLine line;
  line.add("what", "tp_step")
      .add("model", setup.name())
      .add("world", t)
      .add("tp", t)
      .add("dp", 1)
      .add("sequence_parallel", setup.sp)
      .add("dtype", dtp::dtype_name(cfg.model.dtype))
      .add("optimizer", cfg.optimizer)
      .add("d_model", cfg.model.d_model)
      .add("layers", cfg.model.layers)
      .add("heads", cfg.model.heads)
      .add("vocab_size", cfg.model.vocab_size)
      .add("seq", cfg.seq)
      .add("batch", cfg.batch)
      .add("tokens_per_step", cfg.batch * cfg.seq)
      .add("parameters", c.total)
      .add("replicated_parameters", c.replicated)
      .add("params_bytes", largest(params))
      .add("params_bytes_per_rank", params)
      .add("formula_params_bytes", want_params)
      .add("activation_peak_bytes", largest(act))
      .add("activation_peak_bytes_per_rank", act)
      .add("formula_block_activation_bytes", want_act)
      .add("collective_bytes", largest(counted))
      .add("collective_bytes_per_rank", counted)
      .add("formula_collective_bytes", want_counted)
      .add("ring_bytes", largest(ring))
      .add("all_reduces", static_cast<std::int64_t>(run.ranks[0].fields[kAllReduces]))
      .add("all_gathers", static_cast<std::int64_t>(run.ranks[0].fields[kAllGathers]))
      .add("reduce_scatters", static_cast<std::int64_t>(run.ranks[0].fields[kReduceScatters]))
      .add("step_s", seconds)
      .add("step_s_min", times.empty() ? 0.0 : *std::min_element(times.begin(), times.end()))
      .add("step_s_max", times.empty() ? 0.0 : *std::max_element(times.begin(), times.end()))
      .add("step_s_per_round", round_medians)
      .add("tokens_per_s", seconds > 0 ? static_cast<double>(cfg.batch * cfg.seq) / seconds : 0.0)
      .add("params_vs_t1", x_params)
      .add("activations_vs_t1", x_act)
      .add("step_vs_t1", x_time)
      .add("warmup", o.warmup)
      .add("steps", o.steps)
      .add("repeats", o.repeats);
  add_context(line, ctx);
  write_line(json, line);
}

// The serial peer, then every t with SP off and on (t = 1 with SP on is the
// same model; it is the baseline of the SP rows), run round-robin.
int run_step_part(const StepOptions& o, const RunContext& ctx, FILE* json) {
  std::vector<Setup> setups = {Setup{0, false}};
  for (int t : o.tps)
    for (bool sp : {false, true}) {
      dtp::ch04::validate_tensor_parallel(o.config, dtp::ch04::TensorParallelRunOptions{t, 1, sp});
      setups.push_back(Setup{t, sp});
    }
  const Census census = census_of(o.config);
  std::vector<Run> first(setups.size());
  std::vector<std::vector<double>> times(setups.size());
  for (std::int64_t round = 0; round < o.repeats; ++round)
    for (std::size_t i = 0; i < setups.size(); ++i) {
      Run run = run_setup(setups[i], census.config, o.warmup, o.steps);
      add_slowest_steps(run, o.warmup, times[i]);
      if (round == 0) first[i] = std::move(run);
    }
  if (!first[0].hosted_rank0) return 0;  // under mpiexec, only rank 0's process reports
  print_step_header(o, census, ctx);
  for (std::size_t i = 0; i < setups.size(); ++i) {
    Baseline base;  // t = 1 with the same SP setting (the serial peer: against t = 1 without SP)
    for (std::size_t j = 0; j < setups.size(); ++j)
      if (setups[j].t == 1 && setups[j].sp == setups[i].sp) {
        base.params = static_cast<double>(largest(per_rank(first[j], kParams)));
        base.activations = static_cast<double>(largest(per_rank(first[j], kActivationPeak)));
        base.seconds = median(times[j]);
      }
    report_setup(setups[i], first[i], times[i], o, census, base, ctx, json);
  }
  std::printf("\n");
  return 0;
}

// --- part 2: the tiers -------------------------------------------------------------------

struct Tier {
  std::string name;
  double alpha_s;        // per message
  double bandwidth_Bps;  // per direction per GPU: beta = 1 / bandwidth
  std::string note;
};

// The defaults; --nvlink and --infiniband replace a tier's numbers.
std::vector<Tier> default_tiers() {
  return {{"NVLink (one node)", 3e-6, 450e9,
           "GB/s per direction per GPU (H100 NVLink 4; a ring gets less)"},
          {"InfiniBand (across nodes)", 8e-6, 50e9, "GB/s per GPU (one 400 Gb/s NDR HCA per GPU)"}};
}

// "ALPHA_US,GBPS" into @p tier (--nvlink, --infiniband); the note then says
// only what was given. A bad value is an error that names @p flag.
void set_tier(Tier& tier, const std::string& flag, const std::string& text) {
  const LinkCost link = parse_link(flag, text);
  tier.alpha_s = link.alpha_s;
  tier.bandwidth_Bps = link.bandwidth_Bps;
  tier.note = "GB/s per direction per GPU (given on the command line)";
}

constexpr int kBlockWidth = 1600;         // C of GPT-2 XL
constexpr std::int64_t kBlockSeq = 1024;  // T
constexpr double kH100Flops =
    400e12;  // an estimate of bf16 dense matmuls achieved on an H100 SXM (peak 989)

// One block's TP communication, forward and backward, on [N, C] bf16
// activations: plain TP 4 all-reduces of S = N C e bytes (attention and MLP,
// one each way); SP the same S as 4 all-gathers and 4 reduce-scatters. The
// thread backend reduces bf16 on the CPU (through float), so the buffers have
// the real element type and byte count. Zeros: the sums stay exact.
void block_collectives(dtp::Comm& comm, std::int64_t tokens, bool sp) {
  const std::int64_t numel = tokens * kBlockWidth;
  dtp::Tensor full = dtp::Tensor::zeros(dtp::Shape{numel}, dtp::DType::bf16, comm.device());
  if (!sp) {
    for (int i = 0; i < 4; ++i) comm.all_reduce(full);
    return;
  }
  const dtp::ChunkRange mine = dtp::chunk_range(numel, comm.size(), comm.rank());
  dtp::Tensor shard = dtp::Tensor::zeros(dtp::Shape{mine.length}, dtp::DType::bf16, comm.device());
  for (int i = 0; i < 4; ++i) {
    comm.all_gather(shard, full);
    comm.reduce_scatter(full, shard);
  }
}

struct TierResult {
  double clock_s = 0;
  std::int64_t counted = 0;
  std::int64_t calls = 0;
  bool hosted_rank0 = false;  // false in the processes of other ranks (mpi)
};

// The clock of the block's collectives on t ranks, for every (tokens, SP):
// rank 0's (the collectives leave every rank's clock at the same time).
std::vector<TierResult> run_tier(const Tier& tier, int t,
                                 const std::vector<std::int64_t>& token_counts) {
  std::vector<TierResult> results(token_counts.size() * 2);
  dtp::World world = dtp::World::from_env(t);
  world.cost = dtp::CostModel{tier.alpha_s, 1.0 / tier.bandwidth_Bps};
  dtp::launch(world, [&](dtp::Comm& comm) {
    for (std::size_t i = 0; i < token_counts.size(); ++i)
      for (int sp = 0; sp < 2; ++sp) {
        comm.reset_stats();
        block_collectives(comm, token_counts[i], sp == 1);
        const dtp::CommStats st = comm.stats();
        if (comm.rank() == 0)
          results[2 * i + static_cast<std::size_t>(sp)] = {st.clock, st.collective_bytes,
                                                           st.total_collective_calls(), true};
      }
  });
  return results;
}

int run_tier_part(const std::vector<Tier>& tiers, bool quick, const RunContext& ctx, FILE* json) {
  const std::vector<std::int64_t> batches =
      quick ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{1, 8};
  std::vector<std::int64_t> token_counts;
  for (std::int64_t b : batches) token_counts.push_back(b * kBlockSeq);
  const std::int64_t e = 2;  // bf16
  std::printf(
      "# tp comm tiers: the alpha-beta clock of one transformer block's TP collectives, forward + "
      "backward\n");
  std::printf(
      "# block: C = %d (GPT-2 XL), T = %lld, bf16; S = N C e bytes; TP: 4 all-reduces of S; TP + "
      "SP: 4 "
      "all-gathers + 4 reduce-scatters of S\n",
      kBlockWidth, static_cast<long long>(kBlockSeq));
  for (const Tier& tier : tiers)
    std::printf("# %s: alpha %g us, %g %s\n", tier.name.c_str(), tier.alpha_s * 1e6,
                tier.bandwidth_Bps / 1e9, tier.note.c_str());
  std::printf(
      "# ring: the formula 4 x 2(t-1)(alpha + beta S/t). compute: 72 N C^2 / t flops at %.0f "
      "TFLOP/s, an H100 "
      "estimate (attention's T^2 part left out)\n",
      kH100Flops / 1e12);
  std::printf("%-26s %5s %7s %2s %10s %10s %10s %11s %8s\n", "tier", "N", "S MiB", "t", "TP us",
              "TP+SP us", "ring us", "compute us", "comm/cmp");
  for (const Tier& tier : tiers)
    for (int t : {2, 4, 8}) {
      const std::vector<TierResult> results = run_tier(tier, t, token_counts);
      if (!results[0].hosted_rank0) continue;  // under mpiexec, only rank 0's process reports
      for (std::size_t i = 0; i < token_counts.size(); ++i) {
        const std::int64_t N = token_counts[i], S = N * kBlockWidth * e;
        const double beta = 1.0 / tier.bandwidth_Bps;
        const double formula =
            4 * 2.0 * (t - 1) * (tier.alpha_s + beta * static_cast<double>(S) / t);
        const double flops = 72.0 * static_cast<double>(N) * kBlockWidth * kBlockWidth / t;
        const double compute = flops / kH100Flops;
        const TierResult& tp = results[2 * i];
        const TierResult& sp = results[2 * i + 1];
        std::printf("%-26s %5lld %7.2f %2d %10.1f %10.1f %10.1f %11.1f %8.2f\n", tier.name.c_str(),
                    static_cast<long long>(N), static_cast<double>(S) / kMiB, t, tp.clock_s * 1e6,
                    sp.clock_s * 1e6, formula * 1e6, compute * 1e6, tp.clock_s / compute);
        for (int mode = 0; mode < 2; ++mode) {
          const TierResult& r = mode ? sp : tp;
          JsonLine line;
          line.add("what", "tp_comm_tiers")
              .add("tier", tier.name)
              .add("alpha_us", tier.alpha_s * 1e6)
              .add("bandwidth_GBps", tier.bandwidth_Bps / 1e9)
              .add("world", t)
              .add("tp", t)
              .add("dp", 1)
              .add("sequence_parallel", mode == 1)
              .add("d_model", kBlockWidth)
              .add("seq", kBlockSeq)
              .add("batch", N / kBlockSeq)
              .add("tokens", N)
              .add("dtype", "bf16")
              .add("message_bytes", S)
              .add("collective_calls", r.calls)
              .add("collective_bytes", r.counted)
              .add("clock_us", r.clock_s * 1e6)
              .add("formula_us", formula * 1e6)
              .add("compute_flops", flops)
              .add("compute_TFLOPs", kH100Flops / 1e12)
              .add("compute_us_estimate", compute * 1e6)
              .add("comm_over_compute", r.clock_s / compute);
          add_context(line, ctx);
          write_line(json, line);
        }
      }
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  StepOptions o;
  dtp::TrainConfig& config = o.config;
  config.model.layers = 4;
  config.model.d_model = 256;
  config.model.heads = 8;
  config.model.vocab_size = 256;  // synthetic data: the vocabulary comes from the model
  config.seq = 128;
  config.batch = 8;
  config.optimizer = "adamw";
  config.synthetic.length = 1 << 17;
  std::string json_path, only;
  bool quick = false;
  std::vector<Tier> tiers = default_tiers();
  CLI::App app{
      "Tensor parallelism (chapter 04) measured on this machine and, for its communication, "
      "predicted "
      "for a GPU cluster. Part 1, tp_step: the reference's TensorParallelTrainer (the step of `dtp "
      "train "
      "--strategy tp`) on t ranks, sequence parallelism off and on: parameter bytes, activation "
      "peak, "
      "bytes counted and sent per step, step time; against the serial Trainer and the lesson's "
      "formulas. "
      "Part 2, tp_comm_tiers: the alpha-beta clock of one GPT-2-XL block's TP collectives on "
      "NVLink and "
      "InfiniBand.",
      "dtp-bench-tp-step"};
  dtp::cli::add_list_option(app, "--tps", o.tps,
                            "tensor-parallel sizes t, a comma list; each runs with SP off and on",
                            "T,...")
      ->check(dtp::cli::Range(1, 64))
      ->capture_default_str();
  dtp::bench::add_step_options(app, o.steps, o.warmup);
  app.add_option("--repeats", o.repeats,
                 "runs of every configuration, in turn: times pooled over them")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000}))
      ->capture_default_str();
  dtp::bench::add_model_options(app, config);
  app.add_option("--batch", config.batch,
                 "sequences per step, the same on every rank of the TP group")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--only", only,
                 "run one part: step (the measured TP step) or tiers (the predicted communication "
                 "of a GPT-2-XL "
                 "block on NVLink and InfiniBand); default both")
      ->check(CLI::IsMember({"step", "tiers"}));
  app.add_option_function<std::string>(
         "--nvlink", [&tiers](const std::string& text) { set_tier(tiers[0], "--nvlink", text); },
         "the NVLink tier's alpha (us) and bandwidth (GB/s per direction per GPU)")
      ->type_name("US,GBPS")
      ->default_str("3,450");
  app.add_option_function<std::string>(
         "--infiniband",
         [&tiers](const std::string& text) { set_tier(tiers[1], "--infiniband", text); },
         "the InfiniBand tier's alpha (us) and bandwidth (GB/s per GPU)")
      ->type_name("US,GBPS")
      ->default_str("8,50");
  app.add_flag(
      "--quick", quick,
      "a smoke test: --warmup 1 --steps 2 --repeats 1 (flags given win), tiers for N = 1024 only");
  app.add_option("--json", json_path, "append one JSON object per measurement to FILE")
      ->type_name("FILE");
  app.footer(
      "The model's vocabulary is 256 (synthetic data). Backend and device from DTP_BACKEND and "
      "DTP_DEVICE "
      "(default thread, cpu).");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  if (quick) {
    if (app.count("--warmup") == 0) o.warmup = 1;
    if (app.count("--steps") == 0) o.steps = 2;
    if (app.count("--repeats") == 0) o.repeats = 1;
  }
  // Every t against the model before anything runs or a --json file is made.
  for (int t : o.tps) {
    try {
      dtp::ch04::validate_tensor_parallel(o.config,
                                          dtp::ch04::TensorParallelRunOptions{t, 1, false});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dtp-bench-tp-step: error: --tps %d: %s (see --help)\n", t, e.what());
      return 2;
    }
  }

  const std::optional<RunContext> context = context_from_env("dtp-bench-tp-step");
  if (!context) return 2;
  const RunContext& ctx = *context;
  FILE* json = nullptr;
  if (!open_json("dtp-bench-tp-step", json_path, json)) return 2;
  int status = 0;
  try {
    if (only.empty() || only == "step") status = run_step_part(o, ctx, json);
    if (status == 0 && (only.empty() || only == "tiers"))
      status = run_tier_part(tiers, quick, ctx, json);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dtp-bench-tp-step: %s\n", error.what());
    status = 1;
  }
  return close_json(json, "dtp-bench-tp-step", status);
}
