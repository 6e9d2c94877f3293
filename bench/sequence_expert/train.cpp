// Part 4, "sp_ep_train_step" (--only train): whole optimizer steps of the
// reference's SequenceParallelTrainer (Ulysses, ring, zigzag, hybrid with
// u = n/2) and ExpertParallelTrainer on n = 2, 4 ranks (--degrees), a GPT with
// flash attention (--train-shape; its MoE variant --train-moe), --train-steps
// timed steps after --warmup, --repeats rounds round-robin (the ratios to the
// peers are taken within each round: this machine's speed drifts). Peers, in
// the same run: the serial Trainer on the same model for sp, and the serial MoE
// with m routing groups (moe_groups = m: what ep on m ranks equals, README
// section 7) for ep; the last step's loss is compared with the peer's. Per
// rank: the step's wall time (the slowest rank's, median) and thread CPU time
// (the busiest rank's: the ranks are threads sharing this machine's cores, as
// in part 1); the activation peak (StepRecord); the params and optimizer bytes
// live after the steps; the payload bytes its collectives (each call's whole
// buffer) and sends moved in one step. Prediction for the bytes: the gradient
// all-reduce (Psi e for sp, the replicated Psi_rep e for ep) plus README
// section 6's attention bytes per layer, or section 7's four exchanges of every
// kept choice's row (top_k rows of C per token, no drops); the scalar
// all-reduces and the routing counts are left out.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "parts.h"

namespace dtp::bench::sequence_expert {

using dtp::ch06::SequenceParallelKind;

std::vector<train::Setup> train_setups(const TrainOptions& o) {
  using train::Setup;
  std::vector<Setup> setups = {Setup{Setup::dense}};
  for (int n : o.degrees) {
    for (auto kind : {SequenceParallelKind::ulysses, SequenceParallelKind::ring,
                      SequenceParallelKind::zigzag, SequenceParallelKind::hybrid}) {
      if (kind == SequenceParallelKind::hybrid && n < 4)
        continue;  // one group would be Ulysses alone
      setups.push_back(Setup{Setup::sp, n, kind, kind == SequenceParallelKind::hybrid ? n / 2 : 1});
    }
  }
  setups.push_back(Setup{Setup::moe, 1});
  for (int n : o.degrees) {
    setups.push_back(Setup{Setup::moe, n});
    setups.push_back(Setup{Setup::ep, n});
  }
  for (const Setup& s : setups) train::validate(o.model, s);
  return setups;
}

namespace {

// The numbers of one setup over every round: the slowest rank's wall time and
// the busiest rank's CPU time of each step, and their medians per round;
// memory and bytes from the first round.
struct TrainResult {
  std::vector<double> seconds, cpu_seconds;
  std::vector<double> round_seconds, round_cpu_seconds;
  std::vector<train::RankNumbers> first;
  std::int64_t largest(std::int64_t train::RankNumbers::*field) const {
    std::int64_t worst = 0;
    for (const train::RankNumbers& r : first) worst = std::max(worst, r.*field);
    return worst;
  }
};

void add_round(const std::vector<train::RankNumbers>& ranks, TrainResult& into) {
  std::vector<double> walls, cpus;
  for (std::size_t step = 0; step < ranks[0].seconds.size(); ++step) {
    double wall = 0, cpu = 0;
    for (const train::RankNumbers& r : ranks)
      wall = std::max(wall, r.seconds[step]), cpu = std::max(cpu, r.cpu_seconds[step]);
    walls.push_back(wall);
    cpus.push_back(cpu);
  }
  into.seconds.insert(into.seconds.end(), walls.begin(), walls.end());
  into.cpu_seconds.insert(into.cpu_seconds.end(), cpus.begin(), cpus.end());
  into.round_seconds.push_back(median(walls));
  into.round_cpu_seconds.push_back(median(cpus));
  if (into.first.empty()) into.first = ranks;
}

// The median over rounds of a setup's round median over its peer's in the
// same round: this machine's speed drifts over minutes (bench/README.md),
// and a round's runs are seconds apart.
double median_ratio(const std::vector<double>& mine, const std::vector<double>& peer) {
  std::vector<double> ratios;
  for (std::size_t k = 0; k < mine.size() && k < peer.size(); ++k)
    ratios.push_back(mine[k] / peer[k]);
  return median(ratios);
}

void print_train_header(const TrainOptions& o, const RunContext& ctx) {
  const dtp::TrainConfig& cfg = o.model.config;
  std::printf(
      "# sp and ep training steps: %s backend on %s (%d cores), %s, %s; GPT d_model %d, %d layers, "
      "%d heads, "
      "flash attention, batch %lld x %lld tokens; MoE: %d experts, top %d; median of %lld steps x "
      "%lld rounds "
      "(round-robin) after %lld warm-up steps\n",
      ctx.backend.c_str(), ctx.device.c_str(), ctx.cores, dtp::dtype_name(cfg.model.dtype),
      cfg.optimizer.c_str(), cfg.model.d_model, cfg.model.layers, cfg.model.heads,
      static_cast<long long>(cfg.batch), static_cast<long long>(cfg.seq), o.model.experts,
      o.model.top_k, static_cast<long long>(o.steps), static_cast<long long>(o.repeats),
      static_cast<long long>(o.warmup));
  if (!ctx.glibc_tunables.empty()) std::printf("# GLIBC_TUNABLES=%s\n", ctx.glibc_tunables.c_str());
  std::printf(
      "# peer: sp against the serial dense model, ep on m ranks against the serial MoE with m "
      "routing groups "
      "(what it equals).\n"
      "# step: the slowest rank's wall ms. cpu: the busiest rank's thread CPU ms per step (what "
      "one device "
      "per rank would take, communication aside). Medians over every step; x peer: the median over "
      "rounds of "
      "the round's median over the peer's in that round; ideal 1/n.\n"
      "# act: the largest rank's activation peak. params, optim: live bytes per rank. moved: a "
      "rank's payload "
      "bytes per step (collectives whole, sends); formula: README sections 6 and 7, scalars left "
      "out.\n"
      "# loss: the last step's (the group's mean); d peer: its difference from the peer's.\n");
  std::printf("%-10s %-11s %2s %8s %6s %8s %6s %8s %6s %8s %8s %8s %8s %8s %8s\n", "model",
              "detail", "n", "step ms", "x peer", "cpu ms", "x peer", "act MiB", "x peer", "params",
              "optim", "moved", "formula", "loss", "d peer");
}

// One row of the table and one JSON line: setup @p i of @p setups, against its peer.
void report_train_setup(const std::vector<train::Setup>& setups,
                        const std::vector<TrainResult>& results, std::size_t i,
                        const TrainOptions& o, const RunContext& ctx, FILE* json) {
  const dtp::TrainConfig& cfg = o.model.config;
  const train::Setup& s = setups[i];
  const TrainResult& r = results[i];
  const int peer = s.peer_in(setups);
  const double step = median(r.seconds), cpu = median(r.cpu_seconds);
  const auto act = static_cast<double>(r.largest(&train::RankNumbers::activation_peak));
  const std::int64_t params = r.largest(&train::RankNumbers::params_bytes);
  const std::int64_t moved = r.largest(&train::RankNumbers::bytes_per_step);
  // Psi of this setup's model: the serial run of the same model holds every parameter once.
  const std::int64_t e = static_cast<std::int64_t>(dtp::dtype_size(cfg.model.dtype));
  const std::int64_t psi =
      (peer >= 0
           ? results[static_cast<std::size_t>(peer)].largest(&train::RankNumbers::params_bytes)
           : params) /
      e;
  const std::int64_t formula = train::formula_bytes(o.model, s, psi);
  double x_step = 0, x_cpu = 0, x_act = 0, d_loss = 0;
  if (peer >= 0) {
    const TrainResult& p = results[static_cast<std::size_t>(peer)];
    x_step = median_ratio(r.round_seconds, p.round_seconds);
    x_cpu = median_ratio(r.round_cpu_seconds, p.round_cpu_seconds);
    x_act = act / static_cast<double>(p.largest(&train::RankNumbers::activation_peak));
    d_loss = std::abs(r.first[0].last_loss - p.first[0].last_loss);
  }
  auto ratio = [&](double x) {
    char text[16];
    std::snprintf(text, sizeof text, "%.3f", x);
    return peer >= 0 ? std::string(text) : std::string("-");
  };
  std::printf("%-10s %-11s %2d %8.1f %6s %8.1f %6s %8.2f %6s %8.2f %8.2f %8.2f %8.2f %8.4f %8.1e\n",
              s.name(), s.detail().c_str(), s.n, step * 1e3, ratio(x_step).c_str(), cpu * 1e3,
              ratio(x_cpu).c_str(), mib(act), ratio(x_act).c_str(),
              mib(static_cast<double>(params)),
              mib(static_cast<double>(r.largest(&train::RankNumbers::optimizer_bytes))),
              mib(static_cast<double>(moved)), mib(static_cast<double>(formula)),
              r.first[0].last_loss, d_loss);
  std::vector<std::int64_t> act_per_rank, moved_per_rank;
  for (const train::RankNumbers& rank : r.first) {
    act_per_rank.push_back(rank.activation_peak);
    moved_per_rank.push_back(rank.bytes_per_step);
  }
  JsonLine line;
  line.add("what", "sp_ep_train_step")
      .add("model", s.name())
      .add("detail", s.detail())
      .add("world", s.ranks())
      .add("n", s.n)
      .add("peer", peer >= 0 ? std::string(setups[static_cast<std::size_t>(peer)].name()) + " " +
                                   setups[static_cast<std::size_t>(peer)].detail()
                             : std::string("-"))
      .add("dtype", dtp::dtype_name(cfg.model.dtype))
      .add("optimizer", cfg.optimizer)
      .add("d_model", cfg.model.d_model)
      .add("layers", cfg.model.layers)
      .add("heads", cfg.model.heads)
      .add("seq", cfg.seq)
      .add("batch", cfg.batch)
      .add("experts", s.mixture() ? o.model.experts : 0)
      .add("top_k", s.mixture() ? o.model.top_k : 0)
      .add("parameters", psi)
      .add("step_s", step)
      .add("step_vs_peer", x_step)
      .add("cpu_s_busiest", cpu)
      .add("cpu_vs_peer", x_cpu)
      .add("activation_peak_bytes", static_cast<std::int64_t>(act))
      .add("activation_peak_bytes_per_rank", act_per_rank)
      .add("activations_vs_peer", x_act)
      .add("params_bytes", params)
      .add("grads_bytes", r.largest(&train::RankNumbers::grads_bytes))
      .add("optimizer_bytes", r.largest(&train::RankNumbers::optimizer_bytes))
      .add("moved_bytes", moved)
      .add("moved_bytes_per_rank", moved_per_rank)
      .add("formula_moved_bytes", formula)
      .add("last_loss", r.first[0].last_loss)
      .add("loss_vs_peer", d_loss)
      .add("step_s_all", r.seconds)
      .add("step_s_per_round", r.round_seconds)
      .add("cpu_s_per_round", r.round_cpu_seconds)
      .add("warmup", o.warmup)
      .add("steps", o.steps)
      .add("repeats", o.repeats);
  add_context(line, ctx);
  write_line(json, line);
}

}  // namespace

int run_train_part(const TrainOptions& o, const RunContext& ctx, FILE* json) {
  const std::vector<train::Setup> setups = train_setups(o);
  std::vector<TrainResult> results(setups.size());
  for (std::int64_t round = 0; round < o.repeats; ++round)
    for (std::size_t i = 0; i < setups.size(); ++i)
      add_round(train::run(o.model, setups[i], o.warmup, o.steps), results[i]);
  print_train_header(o, ctx);
  for (std::size_t i = 0; i < setups.size(); ++i)
    report_train_setup(setups, results, i, o, ctx, json);
  std::printf("\n");
  return 0;
}

}  // namespace dtp::bench::sequence_expert
