// dtp-bench-lockstep: what chapter 11's ways out of lockstep cost and save:
// the loss against the bytes a rank communicates over a WAN, and how long a
// fault-tolerant run takes to notice and recover from a failed replica.
//   dtp-bench-lockstep [--methods ddp,local-sgd:4,local-sgd:16,ps:0,ps:2,ddp-adamw,diloco:4,
//                                 diloco:16]
//                      [--steps 192] [--world 4] [--batch 12] [--lr 0.1] [--adam-lr 0.003]
//                      [--outer-lr 0.7] [--outer-momentum 0.9] [--wan 20000,0.125]
//                      [--layers 2] [--d-model 64] [--heads 4] [--seq 64] [--vocab 256]
//                      [--dtype f64|f32]
//                      [--faults crash,hang,drop-message,slow] [--recoveries continue,restart]
//                      [--replicas 3] [--ft-steps 24] [--fault-step 13] [--fault-replica 2]
//                      [--checkpoint-every 5] [--detect 0.5] [--replica-timeout 1]
//                      [--slow-factor 2] [--json FILE]
// (--help lists them with their defaults.)
//
// Part 1, methods. Each trains the same GPT from the same seed and data for
// --steps steps, on --world rank threads (the parameter server on one more):
//   ddp            every step one all-reduce (ReduceOp::avg) per unit of the
//                  gradients (a Trainer's after-backward hook), SGD with
//                  momentum at --lr: the baseline
//   local-sgd:H    11.3 (ch11::LocalSgd), SGD as ddp, parameters averaged every H steps
//   ps:S           11.1 and 11.2 (ch11::ParameterServer::serve_bounded(S) on
//                  rank 0, ch11::PsWorker on ranks 1..W), SGD as ddp on the server
//   ddp-adamw      ddp with AdamW at --adam-lr: DiLoCo's baseline
//   diloco:H       11.4 (ch11::DiLoCo), inner AdamW at --adam-lr, outer
//                  Nesterov at --outer-lr and --outer-momentum every H steps
// Learning rates are constant. The World's alpha-beta clock is set to the
// WAN tier (link_tiers.h, one tier between every pair of ranks), so every
// collective and every message moves the clocks by its cost on that link
// and nothing else moves them: a rank's clock at the end is its
// communication time on the WAN, compute counted as free. Per method and
// step: the mean loss over the workers, and every worker's bytes moved
// (Comm::stats(): collective_bytes, each collective's buffer once, plus
// bytes_sent and bytes_received of its messages). The bytes are checked
// against this program's formulas, a difference fails the run (exit 1)
// after the tables: ddp and ddp-adamw the sum of the units' bytes every
// step; local SGD and DiLoCo that every H-th step and 0 otherwise; a
// parameter-server worker per step its pull (a request of a 5-value rpc
// header, a response of the header and every parameter), its pushes (per
// unit the header and the gradient) and their acknowledgements (a header
// each), all f64 (dtp/rpc.h), and the done request and its answer after
// the last step. Also checked: ps:0 trains exactly as ddp (the same loss
// every step, bit for bit), ddp's replicas end equal, and so do local
// SGD's and DiLoCo's when --steps is a multiple of H.
//
// Part 2, recovery. ch11::run_fault_tolerant on 1 coordinator and
// --replicas replicas (f64, the same GPT and SGD), --ft-steps steps, for
// every fault kind (dtp/fault.h: crash, hang, drop-message, slow for
// --slow-factor x --detect seconds) planned on --fault-replica at
// --fault-step, under each recovery: continue (continue_with_quorum) and
// restart (a checkpoint every --checkpoint-every steps in a temporary
// file), and once without a fault under each. Per run: the detection time
// of the failed step (QuorumStep::detection_seconds), the wall time against
// the fault-free run's of the same recovery, the steps redone after a
// restart, the survivors, and whether the final parameters equal the
// fault-free run's. Checked (exit 1 on a difference): the failure is found
// at the planned step and names the planned replica, no sooner than
// --detect; continue keeps the others to the end and redoes nothing;
// restart restarts once from the last checkpoint, redoes the steps after
// it, and ends with the fault-free run's parameters bit for bit; the two
// fault-free runs end equal. Prints two tables and appends one JSON object
// per method and per recovery run.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "bench_common.h"
#include "bench_flags.h"
#include "dtp/fault.h"
#include "dtp/launch.h"
#include "dtp/parallel.h"
#include "dtp/rpc.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"
#include "link_tiers.h"

namespace {

using namespace dtp::bench;
using Clock = std::chrono::steady_clock;

constexpr const char* kProgram = "dtp-bench-lockstep";
constexpr std::size_t kLossTail = 10;  // "the loss at the end": the mean of the last steps

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// --- part 1: the methods ---------------------------------------------------------------

enum class Kind { ddp, local_sgd, diloco, ps };

struct Method {
  std::string name;
  Kind kind = Kind::ddp;
  int h = 1;          // local SGD and DiLoCo: steps between averages
  int staleness = 0;  // the parameter server's bound s
  bool adam = false;  // AdamW (ddp-adamw, DiLoCo's inner optimizer), else SGD
  std::string peer;   // the run its ratios are against
};

std::optional<int> number_after(const std::string& text, const std::string& prefix, int lo,
                                int hi) {
  if (text.rfind(prefix, 0) != 0) return std::nullopt;
  const std::optional<long double> v = dtp::cli::parse_integer_text(text.substr(prefix.size()));
  if (!v || *v < lo || *v > hi) return std::nullopt;
  return static_cast<int>(*v);
}

std::optional<Method> parse_method(const std::string& text) {
  if (text == "ddp") return Method{text, Kind::ddp, 1, 0, false, "ddp"};
  if (text == "ddp-adamw") return Method{text, Kind::ddp, 1, 0, true, "ddp-adamw"};
  if (auto h = number_after(text, "local-sgd:", 1, 1 << 20))
    return Method{text, Kind::local_sgd, *h, 0, false, "ddp"};
  if (auto h = number_after(text, "diloco:", 1, 1 << 20))
    return Method{text, Kind::diloco, *h, 0, true, "ddp-adamw"};
  if (auto s = number_after(text, "ps:", 0, 1 << 20))
    return Method{text, Kind::ps, 1, *s, false, "ddp"};
  return std::nullopt;
}

struct Options {
  int world = 4;
  std::int64_t steps = 192;
  double sgd_lr = 0.1;
  double adam_lr = 3e-3;
  dtp::ch11::OuterConfig outer;
  Tier wan = wan_tier();
};

// The trainer settings of @p m: SGD at --lr or AdamW at --adam-lr, constant.
dtp::TrainConfig method_config(const dtp::TrainConfig& base, const Method& m, const Options& o) {
  dtp::TrainConfig c = base;
  c.steps = o.steps;
  c.warmup = 0;
  c.min_lr_ratio = 1.0;
  c.optimizer = m.adam ? "adamw" : "sgd";
  c.lr = m.adam ? o.adam_lr : o.sgd_lr;
  return c;
}

// The model's units: elements of each, in model order.
std::vector<std::int64_t> unit_sizes(const dtp::TrainConfig& config) {
  dtp::Trainer trainer(config);
  std::vector<std::int64_t> sizes;
  for (dtp::Unit* unit : trainer.model().units()) sizes.push_back(unit->numel());
  return sizes;
}

// What a worker of @p m moves in step @p step (from 1), by the lesson's
// count: e n per unit when it averages (an all-reduce counts its buffer
// once); a parameter-server worker's rpc messages, 8 bytes a value: pull
// request 5, pull response 5 + P, per unit a push 5 + n_u and its
// acknowledgement 5.
std::int64_t formula_bytes(const Method& m, const std::vector<std::int64_t>& units,
                           std::int64_t element_bytes, std::int64_t step) {
  std::int64_t params = 0;
  for (std::int64_t n : units) params += n;
  const auto u = static_cast<std::int64_t>(units.size());
  constexpr std::int64_t h = dtp::rpc::kHeaderSize;
  switch (m.kind) {
    case Kind::ddp:
      return params * element_bytes;
    case Kind::local_sgd:
    case Kind::diloco:
      return step % m.h == 0 ? params * element_bytes : 0;
    case Kind::ps:
      return 8 * (h + (h + params) + (u * h + params) + u * h);
  }
  return 0;
}

// A parameter-server worker's last messages: done and its answer, headers.
constexpr std::int64_t kDoneBytes = 8 * 2 * dtp::rpc::kHeaderSize;

std::int64_t moved(const dtp::CommStats& s) {
  return s.collective_bytes + s.bytes_sent + s.bytes_received;
}

// What one run of a method measured; [step] unless said.
struct Run {
  std::vector<double> losses;                    // the workers' mean
  std::vector<std::int64_t> bytes;               // worker 0's (rank 1 under ps)
  std::vector<std::int64_t> formula;             // this program's
  std::vector<double> clock;                     // the workers' latest clock after the step
  std::vector<std::int64_t> total_bytes;         // [worker] over the run
  std::int64_t formula_total = 0;                // this program's, per worker
  std::int64_t server_bytes = 0;                 // ps: rank 0's over the run
  double comm_s = 0;                             // the latest clock at the end, any rank
  double wall_s = 0;                             // the run, ranks built and joined
  std::vector<std::vector<std::int64_t>> stale;  // ps: [worker][step] c - 1 - version
  std::vector<std::string> problems;
};

Run run_method(const dtp::TrainConfig& base, const Method& m, const Options& o) {
  const int W = o.world;
  const bool ps = m.kind == Kind::ps;
  const std::size_t K = static_cast<std::size_t>(o.steps);
  const dtp::TrainConfig config = method_config(base, m, o);
  const std::vector<std::int64_t> units = unit_sizes(config);
  const auto element_bytes = static_cast<std::int64_t>(dtp::dtype_size(config.model.dtype));

  Run run;
  for (std::int64_t s = 1; s <= o.steps; ++s)
    run.formula.push_back(formula_bytes(m, units, element_bytes, s));
  for (std::int64_t b : run.formula) run.formula_total += b;
  if (ps) run.formula_total += kDoneBytes;

  std::vector<std::vector<double>> losses(W), clocks(W), params(W);
  std::vector<std::vector<std::int64_t>> bytes(W), versions(W);
  std::vector<std::int64_t> totals(W);
  std::vector<double> end_clock(static_cast<std::size_t>(ps ? W + 1 : W));
  dtp::World world = dtp::World::from_env(ps ? W + 1 : W);
  world.cost = dtp::CostModel{o.wan.alpha_s, 1.0 / o.wan.bandwidth_Bps};
  const Clock::time_point start = Clock::now();
  dtp::launch(world, [&](dtp::Comm& comm) {
    dtp::TrainConfig c = config;
    c.model.device = comm.device();
    if (ps && comm.rank() == 0) {
      dtp::ch11::ParameterServer server(comm, c);
      server.serve_bounded(m.staleness);
      run.server_bytes = moved(comm.stats());
      end_clock[0] = comm.stats().clock;
      return;
    }
    const int w = ps ? comm.rank() - 1 : comm.rank();
    const auto r = static_cast<std::size_t>(w);
    std::optional<dtp::Trainer> trainer;
    std::optional<dtp::ch11::LocalSgd> local;
    std::optional<dtp::ch11::DiLoCo> diloco;
    std::optional<dtp::ch11::PsWorker> worker;
    std::function<double()> step;
    if (ps) {
      worker.emplace(comm, c);
      step = [&] { return worker->step(); };
    } else {
      trainer.emplace(c, w, W);
      if (m.kind == Kind::ddp) {
        trainer->on_after_backward([&] {
          for (dtp::Unit* unit : trainer->model().units())
            comm.all_reduce(unit->grads(), dtp::ReduceOp::avg);
        });
        step = [&] { return trainer->step().loss; };
      } else if (m.kind == Kind::local_sgd) {
        local.emplace(comm, *trainer, m.h);
        step = [&] { return local->step().loss; };
      } else {
        diloco.emplace(comm, *trainer, m.h, o.outer);
        step = [&] { return diloco->step().loss; };
      }
    }
    for (std::size_t s = 0; s < K; ++s) {
      const std::int64_t before = moved(comm.stats());
      losses[r].push_back(step());
      const dtp::CommStats after = comm.stats();
      bytes[r].push_back(moved(after) - before);
      clocks[r].push_back(after.clock);
    }
    if (ps) {
      worker->finish();
      versions[r] = worker->versions();
    }
    totals[r] = moved(comm.stats());
    end_clock[static_cast<std::size_t>(comm.rank())] = comm.stats().clock;
    dtp::GPT& model = ps ? worker->trainer().model() : trainer->model();
    for (dtp::Unit* unit : model.units()) {
      const std::vector<double> p = unit->params().to_vector();
      params[r].insert(params[r].end(), p.begin(), p.end());
    }
  });
  run.wall_s = seconds_since(start);

  run.total_bytes = totals;
  run.comm_s = *std::max_element(end_clock.begin(), end_clock.end());
  run.bytes = bytes[0];
  for (std::size_t s = 0; s < K; ++s) {
    double loss = 0, clock = 0;
    for (int r = 0; r < W; ++r) {
      loss += losses[r][s];
      clock = std::max(clock, clocks[r][s]);
    }
    run.losses.push_back(loss / W);
    run.clock.push_back(clock);
  }
  if (ps)
    for (int r = 0; r < W; ++r) {
      run.stale.emplace_back();
      for (std::size_t s = 0; s < K; ++s)
        run.stale.back().push_back(static_cast<std::int64_t>(s) - versions[r][s]);
    }

  // Every worker's bytes, step by step, against the formula.
  for (int r = 0; r < W; ++r) {
    const int rank = ps ? r + 1 : r;
    for (std::size_t s = 0; s < K; ++s) {
      const std::int64_t got = bytes[r][s], want = run.formula[s];
      if (got == want) continue;
      // A difference of one unit's values names that unit.
      std::string unit;
      for (std::size_t u = 0; u < units.size(); ++u)
        for (std::int64_t e : {element_bytes, std::int64_t{8}})
          if (unit.empty() && std::llabs(got - want) == units[u] * e)
            unit = "; the difference is unit " + std::to_string(u) + "'s " +
                   std::to_string(units[u]) + " values";
      char ratio[32] = "none expected";
      if (want) std::snprintf(ratio, sizeof ratio, "x %.4f", static_cast<double>(got) / want);
      char text[768];
      std::snprintf(
          text, sizeof text, "%s, step %zu, rank %d: moved %lld bytes, the formula %lld (%s%s): %s",
          m.name.c_str(), s + 1, rank, static_cast<long long>(got), static_cast<long long>(want),
          ratio, unit.c_str(),
          want == 0    ? "it communicated in a step between averages (an average every step, or "
                         "at the wrong steps)"
          : got == 0   ? "it skipped the average this step should have done"
          : got > want ? "more than the formula: a unit sent twice, or a message the protocol "
                         "does not have"
                       : "less than the formula: a unit, a header or a message left out");
      run.problems.push_back(text);
      break;  // a rank's first difference says enough
    }
    if (totals[r] != run.formula_total) {
      char text[512];
      std::snprintf(text, sizeof text,
                    "%s, rank %d: moved %lld bytes over the run, the formula %lld (the steps%s)",
                    m.name.c_str(), rank, static_cast<long long>(totals[r]),
                    static_cast<long long>(run.formula_total),
                    ps ? " and the done request with its answer, 80 bytes" : "");
      run.problems.push_back(text);
    }
  }
  // Replicas that must end equal: ddp always, local SGD and DiLoCo after an average.
  const bool averaged_last = m.kind == Kind::ddp || (m.kind != Kind::ps && K % m.h == 0);
  if (const auto d = averaged_last ? first_replica_difference(params) : std::nullopt) {
    const auto r = static_cast<std::size_t>(d->rank);
    char text[512];
    std::snprintf(text, sizeof text,
                  "%s: after step %zu (an average) rank %d's parameter %zu (flat over the "
                  "units) is %.17g, rank 0's %.17g: the ranks must hold the same mean",
                  m.name.c_str(), K, d->rank, d->index, params[r][d->index], params[0][d->index]);
    run.problems.push_back(text);
  }
  return run;
}

double mean_tail(const std::vector<double>& v) { return mean_of_last(v, kLossTail); }

// ps:0 must train as ddp: the same loss at every step, bit for bit.
void check_ps_as_ddp(const std::vector<Method>& methods, const std::vector<Run>& runs,
                     std::vector<std::string>& problems) {
  std::optional<std::size_t> ddp, ps0;
  for (std::size_t i = 0; i < methods.size(); ++i) {
    if (methods[i].name == "ddp") ddp = i;
    if (methods[i].kind == Kind::ps && methods[i].staleness == 0) ps0 = i;
  }
  if (!ddp || !ps0) return;
  const std::vector<double>&a = runs[*ddp].losses, &b = runs[*ps0].losses;
  for (std::size_t s = 0; s < a.size(); ++s)
    if (a[s] != b[s]) {
      char text[512];
      std::snprintf(text, sizeof text,
                    "%s: step %zu's loss (mean over the workers) is %.17g, ddp's %.17g: with "
                    "staleness 0 the server must apply ddp's mean gradient (workers in order, "
                    "x 1/W) and the workers compute on the same parameters",
                    methods[*ps0].name.c_str(), s + 1, b[s], a[s]);
      problems.push_back(text);
      return;
    }
}

void report_methods(const std::vector<Method>& methods, const std::vector<Run>& runs,
                    const Options& o, const dtp::TrainConfig& config, const RunContext& context,
                    FILE* json) {
  const dtp::GPTConfig model = config.resolved_model();
  const std::vector<std::int64_t> units = unit_sizes(method_config(config, methods[0], o));
  std::int64_t params = 0;
  for (std::int64_t n : units) params += n;
  const std::size_t K = static_cast<std::size_t>(o.steps);
  std::printf(
      "# beyond lockstep, %s backend on %s, %d workers, %s, %d cores, %d compute thread(s)\n",
      context.backend.c_str(), context.device.c_str(), o.world, dtp::dtype_name(model.dtype),
      context.cores, dtp::compute_threads());
  std::printf(
      "# model: d_model %d, %d layers, %d heads, vocab %d, %lld parameters in %zu units; batch "
      "%lld x seq %lld; %zu steps; SGD lr %g (momentum %g), AdamW lr %g (constant); DiLoCo outer "
      "lr %g, momentum %g\n",
      model.d_model, model.layers, model.heads, model.vocab_size, static_cast<long long>(params),
      units.size(), static_cast<long long>(config.batch), static_cast<long long>(config.seq), K,
      o.sgd_lr, config.momentum, o.adam_lr, o.outer.lr, o.outer.momentum);
  std::printf("# clock: %s between every pair of ranks, alpha %g ms, %g GB/s\n", o.wan.name.c_str(),
              o.wan.alpha_s * 1e3, o.wan.bandwidth_Bps / 1e9);
  std::printf(
      "# loss: mean over the workers, then over the last %zu steps; d loss: minus the peer's; "
      "MB: one worker's bytes moved over the run (collective buffers + messages sent and "
      "received), x: over the peer's; comm s: the latest rank's clock at the end; stale: ps "
      "workers' mean rounds behind\n",
      kLossTail);
  std::printf("%-13s %-9s %8s %8s %10s %8s %9s %8s %7s %6s\n", "method", "peer", "loss", "d loss",
              "MB", "x", "comm s", "x", "wall s", "stale");
  for (std::size_t i = 0; i < methods.size(); ++i) {
    const Method& m = methods[i];
    const Run& run = runs[i];
    std::size_t p = 0;
    while (methods[p].name != m.peer) ++p;
    const double loss = mean_tail(run.losses), peer_loss = mean_tail(runs[p].losses);
    const auto total = static_cast<double>(run.total_bytes[0]);
    const double bytes_ratio = total / static_cast<double>(runs[p].total_bytes[0]);
    const double comm_ratio = run.comm_s / runs[p].comm_s;
    double stale_sum = 0;
    std::int64_t stale_max = 0;
    for (const auto& worker : run.stale)
      for (std::int64_t x : worker) {
        stale_sum += static_cast<double>(x);
        stale_max = std::max(stale_max, x);
      }
    const double stale_mean = run.stale.empty() ? 0 : stale_sum / static_cast<double>(o.world * K);
    char stale[16] = "";
    if (m.kind == Kind::ps) std::snprintf(stale, sizeof stale, "%.2f", stale_mean);
    std::printf("%-13s %-9s %8.4f %+8.4f %10.2f %7.4fx %9.2f %7.4fx %7.1f %6s\n", m.name.c_str(),
                m.peer.c_str(), loss, loss - peer_loss, total / 1e6, bytes_ratio, run.comm_s,
                comm_ratio, run.wall_s, stale);
    if (!json) continue;
    std::vector<std::int64_t> cumulative;
    std::int64_t sum = 0;
    for (std::int64_t b : run.bytes) cumulative.push_back(sum += b);
    JsonLine line;
    line.add("what", "lockstep")
        .add("part", "methods")
        .add("method", m.name)
        .add("peer", m.peer)
        .add("kind", m.kind == Kind::ddp         ? "ddp"
                     : m.kind == Kind::local_sgd ? "local-sgd"
                     : m.kind == Kind::diloco    ? "diloco"
                                                 : "ps")
        .add("h", m.h)
        .add("staleness", m.staleness)
        .add("optimizer", m.adam ? "adamw" : "sgd")
        .add("lr", m.adam ? o.adam_lr : o.sgd_lr)
        .add("outer_lr", o.outer.lr)
        .add("outer_momentum", o.outer.momentum)
        .add("world", o.world)
        .add("ranks", m.kind == Kind::ps ? o.world + 1 : o.world)
        .add("tier", o.wan.name)
        .add("alpha_us", o.wan.alpha_s * 1e6)
        .add("bandwidth_GBps", o.wan.bandwidth_Bps / 1e9)
        .add("parameters", params)
        .add("unit_elements", units)
        .add("steps", o.steps)
        .add("losses", run.losses)
        .add("final_loss", loss)
        .add("peer_final_loss", peer_loss)
        .add("loss_minus_peer", loss - peer_loss)
        .add("bytes_per_step", run.bytes)
        .add("formula_bytes_per_step", run.formula)
        .add("cumulative_bytes", cumulative)
        .add("bytes_match_formula", run.bytes == run.formula)
        .add("total_bytes_per_worker", run.total_bytes)
        .add("formula_total_bytes", run.formula_total)
        .add("server_total_bytes", run.server_bytes)
        .add("bytes_ratio", bytes_ratio)
        .add("clock_s_per_step", run.clock)
        .add("comm_s", run.comm_s)
        .add("peer_comm_s", runs[p].comm_s)
        .add("comm_ratio", comm_ratio)
        .add("wall_s", run.wall_s)
        .add("mean_staleness", stale_mean)
        .add("max_staleness", stale_max)
        .add("compute_threads", dtp::compute_threads());
    add_shape(line, model, config.seq, config.batch);
    write_line(json, add_context(line, context));
  }
}

// --- part 2: recovery -----------------------------------------------------------------

struct FtSettings {
  int replicas = 3;
  std::int64_t steps = 24;
  std::int64_t fault_step = 13;
  int fault_replica = 2;
  std::int64_t checkpoint_every = 5;
  double detect_s = 0.5;
  double replica_timeout_s = 1.0;
  double slow_factor = 2.0;
};

using dtp::ch11::Recovery;

const char* recovery_name(Recovery r) { return r == Recovery::restart ? "restart" : "continue"; }

std::optional<dtp::fault::Kind> parse_fault(const std::string& text) {
  for (dtp::fault::Kind k : {dtp::fault::Kind::crash, dtp::fault::Kind::hang,
                             dtp::fault::Kind::drop_message, dtp::fault::Kind::slow})
    if (text == dtp::fault::kind_name(k)) return k;
  return std::nullopt;
}

struct FtRun {
  std::string fault = "none";  // a kind's name, or none
  Recovery recovery = Recovery::continue_with_quorum;
  dtp::ch11::FtResult result;
  double wall_s = 0;
  std::int64_t failed_step = 0;  // the first step with a failure (0: none)
  std::vector<int> failed;       // who, then
  double detection_s = 0;        // that step's
  std::int64_t steps_redone = 0;
};

FtRun run_recovery(const dtp::TrainConfig& config, const FtSettings& f, Recovery recovery,
                   std::optional<dtp::fault::Kind> kind, const std::string& checkpoint) {
  FtRun run;
  run.recovery = recovery;
  std::vector<dtp::fault::Fault> plan;
  if (kind) {
    run.fault = dtp::fault::kind_name(*kind);
    dtp::fault::Fault fault;
    fault.rank = f.fault_replica;
    fault.step = f.fault_step;
    fault.kind = *kind;
    fault.seconds = *kind == dtp::fault::Kind::slow ? f.slow_factor * f.detect_s : 0;
    plan.push_back(fault);
  }
  dtp::fault::set_plan(plan);
  dtp::ch11::FtOptions options;
  options.recovery = recovery;
  options.detect_seconds = f.detect_s;
  options.replica_timeout_seconds = f.replica_timeout_s;
  if (recovery == Recovery::restart) {
    options.checkpoint_every = f.checkpoint_every;
    options.checkpoint_path = checkpoint;
  }
  std::filesystem::remove(checkpoint);
  const Clock::time_point start = Clock::now();
  run.result = dtp::ch11::run_fault_tolerant(f.replicas + 1, config, options);
  run.wall_s = seconds_since(start);
  std::filesystem::remove(checkpoint);
  dtp::fault::set_plan({});
  for (const dtp::ch11::QuorumStep& q : run.result.log)
    if (!q.failed.empty()) {
      run.failed_step = q.step;
      run.failed = q.failed;
      run.detection_s = q.detection_seconds;
      break;
    }
  std::size_t restart = 0;
  for (const dtp::ch11::QuorumStep& q : run.result.log)
    if (q.restart && restart < run.result.restarted_from.size())
      run.steps_redone += q.step - 1 - run.result.restarted_from[restart++];
  return run;
}

std::string list_text(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "-" : s;
}

// The checks of one run with a fault against the planned fault and the
// fault-free run of the same recovery.
void check_recovery(const FtRun& run, const FtRun& clean, const FtSettings& f,
                    std::vector<std::string>& problems) {
  const std::string label = run.fault + " under " + recovery_name(run.recovery);
  auto fail = [&](const std::string& text) { problems.push_back(label + ": " + text); };
  const dtp::ch11::FtResult& r = run.result;
  if (run.fault == "none") {
    if (run.failed_step != 0)
      fail("step " + std::to_string(run.failed_step) + " declared replica(s) " +
           list_text(run.failed) + " failed in a run without a fault: detect_seconds too short " +
           "for this machine, or the coordinator does not wait for every live replica");
    if (static_cast<std::int64_t>(r.log.size()) != f.steps || !r.restarted_from.empty())
      fail("logged " + std::to_string(r.log.size()) + " steps and " +
           std::to_string(r.restarted_from.size()) + " restart(s), expected " +
           std::to_string(f.steps) + " and none");
    return;
  }
  if (run.failed_step != f.fault_step || run.failed != std::vector<int>{f.fault_replica}) {
    fail("the first failure is at step " + std::to_string(run.failed_step) + ", replica(s) " +
         list_text(run.failed) + "; planned: step " + std::to_string(f.fault_step) + ", replica " +
         std::to_string(f.fault_replica));
    return;
  }
  if (run.detection_s < f.detect_s)
    fail("detected after " + std::to_string(run.detection_s) + " s, before detect_seconds " +
         std::to_string(f.detect_s) + ": a live replica was declared failed too soon");
  std::vector<int> all, others;
  for (int w = 1; w <= f.replicas; ++w) {
    all.push_back(w);
    if (w != f.fault_replica) others.push_back(w);
  }
  if (run.recovery == Recovery::continue_with_quorum) {
    if (r.survivors != others)
      fail("survivors " + list_text(r.survivors) + ", expected " + list_text(others) +
           " (every replica but the failed one, to the end)");
    if (static_cast<std::int64_t>(r.log.size()) != f.steps || !r.restarted_from.empty())
      fail("logged " + std::to_string(r.log.size()) + " steps and " +
           std::to_string(r.restarted_from.size()) + " restart(s), expected " +
           std::to_string(f.steps) + " and none: continuing redoes nothing");
    return;
  }
  const std::int64_t checkpoint = (f.fault_step - 1) / f.checkpoint_every * f.checkpoint_every;
  if (r.restarted_from != std::vector<std::int64_t>{checkpoint})
    fail("restarted " + std::to_string(r.restarted_from.size()) + " time(s), first from step " +
         (r.restarted_from.empty() ? std::string("-") : std::to_string(r.restarted_from[0])) +
         "; expected once, from the checkpoint of step " + std::to_string(checkpoint));
  const auto expected_log = static_cast<std::size_t>(f.steps + run.steps_redone + 1);
  if (r.log.size() != expected_log)
    fail("logged " + std::to_string(r.log.size()) + " steps, expected " +
         std::to_string(expected_log) + " (the steps, the " + std::to_string(run.steps_redone) +
         " redone after the checkpoint, and the failed one)");
  if (r.survivors != all) fail("survivors " + list_text(r.survivors) + ", expected all");
  if (r.parameters != clean.result.parameters) {
    std::size_t i = 0;
    while (i < r.parameters.size() && i < clean.result.parameters.size() &&
           r.parameters[i] == clean.result.parameters[i])
      ++i;
    char text[512];
    std::snprintf(text, sizeof text,
                  "the final parameters differ from the fault-free run's at flat element %zu "
                  "(%.17g, fault-free %.17g): a restart from a checkpoint must train exactly as "
                  "the run that never failed",
                  i, i < r.parameters.size() ? r.parameters[i] : NAN,
                  i < clean.result.parameters.size() ? clean.result.parameters[i] : NAN);
    fail(text);
  }
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

void report_recovery(const std::vector<FtRun>& runs, const FtSettings& f,
                     const dtp::TrainConfig& config, const RunContext& context, FILE* json) {
  std::printf(
      "\n# recovery: 1 coordinator + %d replicas, %lld steps (f64, batch %lld), fault on replica "
      "%d at step %lld; detect %g s, replica timeout %g s, slow = %g s; restart: a checkpoint "
      "every %lld steps\n",
      f.replicas, static_cast<long long>(f.steps), static_cast<long long>(config.batch),
      f.fault_replica, static_cast<long long>(f.fault_step), f.detect_s, f.replica_timeout_s,
      f.slow_factor * f.detect_s, static_cast<long long>(f.checkpoint_every));
  std::printf(
      "# detect s: the failed step's detection_seconds; extra s: wall minus the fault-free run's "
      "of the same recovery; redone: steps trained again after the restart; params: equal to the "
      "fault-free run's (max |difference|)\n");
  std::printf("%-13s %-9s %6s %8s %7s %8s %7s %7s %9s %s\n", "fault", "recovery", "step",
              "detect s", "wall s", "extra s", "redone", "quorum", "restarts", "params");
  for (const FtRun& run : runs) {
    const FtRun* clean = nullptr;
    for (const FtRun& c : runs)
      if (c.fault == "none" && c.recovery == run.recovery) clean = &c;
    const double extra = run.wall_s - clean->wall_s;
    const bool equal = run.result.parameters == clean->result.parameters;
    const double diff = max_difference(run.result.parameters, clean->result.parameters);
    char params[48];
    std::snprintf(params, sizeof params, equal ? "equal" : "differ (%.2g)", diff);
    char step[16] = "-", detect[16] = "-";
    if (run.failed_step) {
      std::snprintf(step, sizeof step, "%lld", static_cast<long long>(run.failed_step));
      std::snprintf(detect, sizeof detect, "%.3f", run.detection_s);
    }
    std::printf("%-13s %-9s %6s %8s %7.2f %+8.2f %7lld %7s %9zu %s\n", run.fault.c_str(),
                recovery_name(run.recovery), step, detect, run.wall_s, extra,
                static_cast<long long>(run.steps_redone), list_text(run.result.survivors).c_str(),
                run.result.restarted_from.size(), params);
    if (!json) continue;
    std::vector<std::int64_t> quorum_sizes;
    std::vector<double> detections;
    for (const dtp::ch11::QuorumStep& q : run.result.log) {
      quorum_sizes.push_back(static_cast<std::int64_t>(q.quorum.size()));
      detections.push_back(q.detection_seconds);
    }
    std::vector<std::int64_t> survivors(run.result.survivors.begin(), run.result.survivors.end());
    JsonLine line;
    line.add("what", "lockstep")
        .add("part", "recovery")
        .add("fault", run.fault)
        .add("recovery", recovery_name(run.recovery))
        .add("replicas", f.replicas)
        .add("steps", f.steps)
        .add("fault_step", f.fault_step)
        .add("fault_replica", f.fault_replica)
        .add("slow_seconds", f.slow_factor * f.detect_s)
        .add("detect_seconds", f.detect_s)
        .add("replica_timeout_seconds", f.replica_timeout_s)
        .add("checkpoint_every",
             run.recovery == Recovery::restart ? f.checkpoint_every : std::int64_t{0})
        .add("failed_step", run.failed_step)
        .add("detection_s", run.detection_s)
        .add("wall_s", run.wall_s)
        .add("fault_free_wall_s", clean->wall_s)
        .add("extra_wall_s", extra)
        .add("steps_redone", run.steps_redone)
        .add("restarted_from", run.result.restarted_from)
        .add("survivors", survivors)
        .add("quorum_size_per_logged_step", quorum_sizes)
        .add("detection_s_per_logged_step", detections)
        .add("parameters_equal_fault_free", equal)
        .add("max_parameter_difference", diff)
        .add("events", run.result.events)
        .add("compute_threads", dtp::compute_threads());
    add_shape(line, config.model, config.seq, config.batch);
    write_line(json, add_context(line, context));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> method_names = {"ddp",  "local-sgd:4", "local-sgd:16", "ps:0",
                                           "ps:2", "ddp-adamw",   "diloco:4",     "diloco:16"};
  std::vector<std::string> fault_names = {"crash", "hang", "drop-message", "slow"};
  std::vector<std::string> recovery_names = {"continue", "restart"};
  std::string json_path;
  Options o;
  FtSettings f;
  dtp::TrainConfig config;
  config.model.layers = 2;
  config.model.d_model = 64;
  config.model.heads = 4;
  config.model.vocab_size = 256;
  config.model.dtype = dtp::DType::f64;
  config.seq = 64;
  config.batch = 12;
  config.synthetic.length = 1 << 16;
  CLI::App app{
      "What chapter 11's ways out of lockstep do, in one run. Part 1: every method trains the "
      "same GPT from the same seed on --world rank threads with the alpha-beta clock set to a "
      "WAN link: DDP (an all-reduce of the gradients every step), local SGD (11.3) and DiLoCo "
      "(11.4) averaging every H steps, the parameter server (11.1, 11.2) with staleness S. Per "
      "method: the loss against the bytes a worker moved (checked against the lesson's formulas: "
      "a difference fails the run) and the communication time on the clock. Part 2: a "
      "fault-tolerant run (11.5) per fault kind and recovery: detection time, wall time against "
      "the fault-free run, steps redone, and whether a restart ends on the fault-free "
      "parameters (a check).",
      kProgram};
  dtp::cli::add_list_option(app, "--methods", method_names,
                            "a comma list of ddp, local-sgd:H, ps:S, ddp-adamw, diloco:H; each "
                            "method's baseline (ddp, ddp-adamw for diloco) runs too; none: skip "
                            "part 1",
                            "METHOD,...")
      ->check(CLI::Validator(
          [](std::string& text) {
            return text == "none" || parse_method(text)
                       ? std::string()
                       : "expects ddp, local-sgd:H, ps:S, ddp-adamw or diloco:H (H >= 1, S >= "
                         "0), got '" +
                             text + "'";
          },
          "METHOD"))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps K of every method")
      ->check(dtp::cli::Range(std::int64_t{kLossTail}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--world", o.world, "workers (threads; the parameter server adds one rank)")
      ->check(dtp::cli::Range(1, 60))
      ->capture_default_str();
  app.add_option("--batch", config.batch,
                 "global batch (sequences per step): must divide by --world and --replicas")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--lr", o.sgd_lr, "SGD's learning rate (momentum 0.9, constant)")
      ->check(dtp::cli::Range(0.0, 1e3))
      ->capture_default_str();
  app.add_option("--adam-lr", o.adam_lr, "AdamW's learning rate (ddp-adamw, DiLoCo's inner)")
      ->check(dtp::cli::Range(0.0, 1e3))
      ->capture_default_str();
  app.add_option("--outer-lr", o.outer.lr, "DiLoCo's outer learning rate")
      ->check(dtp::cli::Range(0.0, 1e3))
      ->capture_default_str();
  app.add_option("--outer-momentum", o.outer.momentum, "DiLoCo's outer Nesterov momentum")
      ->check(dtp::cli::Range(0.0, 1.0))
      ->capture_default_str();
  {
    char text[64];
    std::snprintf(text, sizeof text, "%g,%g", o.wan.alpha_s * 1e6, o.wan.bandwidth_Bps / 1e9);
    app.add_option_function<std::string>(
           "--wan",
           [&o](const std::string& v) {
             const LinkCost link = parse_link("--wan", v);
             o.wan.alpha_s = link.alpha_s;
             o.wan.bandwidth_Bps = link.bandwidth_Bps;
             o.wan.name += " (--wan given)";
           },
           "the WAN link's alpha (us) and bandwidth (GB/s per rank) that the clock charges")
        ->type_name("ALPHA_US,GBPS")
        ->default_str(text);
  }
  add_training_shape_options(app, config, "f32 or f64 for part 1 (part 2 is f64: FtReplica's)");
  dtp::cli::add_list_option(app, "--faults", fault_names,
                            "a comma list of crash, hang, drop-message, slow; none: skip part 2",
                            "KIND,...")
      ->check(CLI::IsMember({"crash", "hang", "drop-message", "slow", "none"}))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--recoveries", recovery_names,
                            "continue (continue_with_quorum) and/or restart", "RECOVERY,...")
      ->check(CLI::IsMember({"continue", "restart"}))
      ->capture_default_str();
  app.add_option("--replicas", f.replicas, "replicas of part 2 (ranks 1..W; rank 0 coordinates)")
      ->check(dtp::cli::Range(2, 61))
      ->capture_default_str();
  app.add_option("--ft-steps", f.steps, "steps of every part-2 run")
      ->check(dtp::cli::Range(std::int64_t{2}, std::int64_t{100000}))
      ->capture_default_str();
  app.add_option("--fault-step", f.fault_step, "the step at whose start the fault fires")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{100000}))
      ->capture_default_str();
  app.add_option("--fault-replica", f.fault_replica, "the replica (world rank) that fails")
      ->check(dtp::cli::Range(1, 61))
      ->capture_default_str();
  app.add_option("--checkpoint-every", f.checkpoint_every, "restart: a checkpoint every k steps")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{100000}))
      ->capture_default_str();
  app.add_option("--detect", f.detect_s,
                 "the coordinator's detect_seconds: how long after a step's first contribution "
                 "the others may take")
      ->check(dtp::cli::Range(1e-3, 60.0))
      ->capture_default_str();
  app.add_option("--replica-timeout", f.replica_timeout_s,
                 "how long a replica waits for the mean (must exceed --detect)")
      ->check(dtp::cli::Range(1e-3, 120.0))
      ->capture_default_str();
  app.add_option("--slow-factor", f.slow_factor, "the slow fault sleeps this many x --detect")
      ->check(dtp::cli::Range(0.01, 100.0))
      ->capture_default_str();
  app.add_option("--json", json_path, "append one JSON object per method and recovery run")
      ->type_name("FILE");
  app.footer(
      "The backend's name in the results comes from DTP_BACKEND (thread; the ranks are threads "
      "of this process); DTP_THREADS sets the CPU ops' threads (default: every core).");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  std::optional<RunContext> context = context_from_env(kProgram);
  if (!context) return 2;
  const bool part1 = !(method_names.size() == 1 && method_names[0] == "none");
  const bool part2 = !(fault_names.size() == 1 && fault_names[0] == "none");
  if (part1 && config.batch % o.world != 0) {
    std::fprintf(stderr, "%s: error: --batch %lld must divide by --world %d\n", kProgram,
                 static_cast<long long>(config.batch), o.world);
    return 2;
  }
  if (part2) {
    const char* bad = nullptr;
    if (config.batch % f.replicas != 0) bad = "--batch must divide by --replicas";
    if (f.fault_replica > f.replicas) bad = "--fault-replica must be one of the replicas";
    if (f.fault_step > f.steps) bad = "--fault-step must be at most --ft-steps";
    if (f.replica_timeout_s <= f.detect_s) bad = "--replica-timeout must exceed --detect";
    if (bad) {
      std::fprintf(stderr, "%s: error: %s\n", kProgram, bad);
      return 2;
    }
  }
  config.synthetic.length = std::max<std::int64_t>(config.synthetic.length, 4 * (config.seq + 1));

  // The baselines first, then the methods in the order given.
  std::vector<Method> methods;
  auto add = [&methods](const Method& m) {
    for (const Method& x : methods)
      if (x.name == m.name) return;
    methods.push_back(m);
  };
  if (part1) {
    add(*parse_method("ddp"));
    for (const std::string& name : method_names) add(*parse_method(parse_method(name)->peer));
    for (const std::string& name : method_names) add(*parse_method(name));
  }

  FILE* json = nullptr;
  if (!open_json(kProgram, json_path, json)) return 2;
  std::vector<std::string> problems;
  const std::string checkpoint = (std::filesystem::temp_directory_path() /
                                  ("dtp-bench-lockstep-" + std::to_string(getpid()) + ".ckpt"))
                                     .string();
  try {
    if (part1) {
      std::vector<Run> runs;
      for (const Method& m : methods) {
        runs.push_back(run_method(config, m, o));
        problems.insert(problems.end(), runs.back().problems.begin(), runs.back().problems.end());
      }
      check_ps_as_ddp(methods, runs, problems);
      report_methods(methods, runs, o, config, *context, json);
    }
    if (part2) {
      dtp::TrainConfig ft = method_config(config, *parse_method("ddp"), o);
      ft.model.dtype = dtp::DType::f64;
      ft.steps = f.steps;
      std::vector<Recovery> recoveries;
      for (const std::string& name : recovery_names)
        recoveries.push_back(name == "restart" ? Recovery::restart
                                               : Recovery::continue_with_quorum);
      std::vector<FtRun> runs;
      for (Recovery recovery : recoveries) {
        runs.push_back(run_recovery(ft, f, recovery, std::nullopt, checkpoint));
        check_recovery(runs.back(), runs.back(), f, problems);
        const FtRun clean = runs.back();
        for (const std::string& name : fault_names) {
          runs.push_back(run_recovery(ft, f, recovery, parse_fault(name), checkpoint));
          check_recovery(runs.back(), clean, f, problems);
        }
      }
      // Checkpoints change nothing a run computes: the fault-free runs end equal.
      const FtRun* first = nullptr;
      for (const FtRun& run : runs)
        if (run.fault == "none") {
          if (first && run.result.parameters != first->result.parameters)
            problems.push_back(std::string("the fault-free runs under ") +
                               recovery_name(first->recovery) + " and " +
                               recovery_name(run.recovery) +
                               " end with different parameters: saving checkpoints must not "
                               "change what a run computes");
          first = &run;
        }
      report_recovery(runs, f, ft, *context, json);
    }
  } catch (const std::exception& e) {  // a run that failed, or a JSON line that was not written
    std::filesystem::remove(checkpoint);
    std::fprintf(stderr, "%s: error: %s\n", kProgram, e.what());
    close_json(json, kProgram, 1);
    return 1;
  }
  return finish_checked_run(
      json, kProgram, problems,
      "bytes differ from the lesson's formulas, ps:0 does not train as ddp, replicas differ, or a "
      "recovery did not do what its contract says",
      "every step's bytes equal the formula on every worker, ps:0 trains as ddp bit for bit, the "
      "replicas agree, and every recovery did what its contract says");
}
