// dtp-bench-compression: what chapter 10's compressors do to the loss, the
// bytes and the step time of data-parallel training over a slow link.
//   dtp-bench-compression [--methods ddp,sign,int8,int4,powersgd:1,powersgd:4,ddp-adamw,1bit-adam,
//                                    zero3,zero++]
//                         [--steps 60] [--repeats 3] [--world 4] [--node-ranks 2] [--batch 8]
//                         [--lr 0.1]
//                         [--adam-lr 0.003] [--onebit-warmup 20] [--block 256]
//                         [--tier ethernet] [--ethernet 50,1.25] [--wan 20000,0.125]
//                         [--infiniband 8,50] [--nvlink 3,450] [--layers 4] [--d-model 128]
//                         [--heads 4] [--seq 64] [--vocab 256] [--dtype f32|f64] [--json FILE]
// (--help lists them with their defaults.)
// Methods, each on --world rank threads from the same seed and data:
//   ddp          chapter 02's 2.2 (one all-reduce per unit; `dtp train --strategy
//                ddp --ddp-mode flat`), SGD with momentum: the baseline
//   sign         10.2, int8 and int4 10.5 (quantized reduce-scatter, 8-bit
//   int8, int4   all-gather), powersgd:R 10.4: `dtp train --strategy compress
//   powersgd:R   --compress ...`'s ranks (drivers/10_compression), SGD as ddp
//   ddp-adamw    2.2 with AdamW (beta2 0.999, no clipping): 1-bit Adam's baseline
//   1bit-adam    10.3 through the compress strategy, --onebit-warmup exact steps
//   zero3        ZeRO-3 (every unit gathered before its forward and its
//                backward, its gradient reduce-scattered), SGD as ddp:
//                `--compress zero++ --zeropp none`, ZeRO++'s baseline
//   zero++       the same with qwZ, hpZ over --node-ranks and qgZ (4 bits)
// The World's alpha-beta clock is set to the --tier's link between nodes of
// --node-ranks consecutive ranks and to NVLink inside a node
// (CostModel::with_nodes), so each collective moves every rank's clock by
// its algorithm's cost on its link (Comm::stats().clock; nothing else moves
// it): only hpZ's backward gather stays inside a node. Per step the program reads
// every rank's collective bytes (Comm::stats(), each call's buffer) and
// compares them with this program's count from the lesson's formulas; a
// difference fails the run (exit 1) after the table. Compute: each rank's
// wall time of the step minus its wall time inside collectives (trace spans
// of category "comm"), the slowest rank's; the time of a step over the tier
// is that compute plus the clock's communication (nothing overlaps: every
// method averages after backward). The methods run in turn, --repeats
// times round-robin; losses come from the first round (the later ones must
// repeat them bit for bit), compute is the median over the steps after two
// warm-up steps of every round. Prints a table and appends one JSON object
// per method.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "10_compression/compression.h"
#include "bench_common.h"
#include "bench_flags.h"
#include "drivers/02_ddp/ddp_strategy.h"
#include "drivers/10_compression/compress_strategy.h"
#include "dtp/launch.h"
#include "dtp/parallel.h"
#include "dtp/trace.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"
#include "link_tiers.h"

namespace {

using namespace dtp::bench;

constexpr const char* kProgram = "dtp-bench-compression";
constexpr std::size_t kWarmup = 2;    // untimed steps at the start of every run
constexpr std::size_t kLossTail = 5;  // "the loss at the end": the mean of the last steps
constexpr const char* kStepSpan = "bench step";

// --- methods ------------------------------------------------------------------------

struct Method {
  std::string name;
  bool compressed = false;  // through the compress strategy, else ddp's 2.2
  bool adam = false;        // AdamW (ddp-adamw) or 1-bit Adam, else SGD
  int powersgd_rank = 0;
  std::string peer;  // the uncompressed run its ratios are against
  bool sharded() const { return name == "zero3" || name == "zero++"; }
};

std::optional<Method> parse_method(const std::string& text) {
  if (text == "ddp") return Method{text, false, false, 0, "ddp"};
  if (text == "ddp-adamw") return Method{text, false, true, 0, "ddp-adamw"};
  if (text == "sign" || text == "int8" || text == "int4")
    return Method{text, true, false, 0, "ddp"};
  if (text == "1bit-adam") return Method{text, true, true, 0, "ddp-adamw"};
  if (text == "zero3" || text == "zero++") return Method{text, true, false, 0, "zero3"};
  if (text.rfind("powersgd:", 0) == 0) {
    const std::optional<long double> r = dtp::cli::parse_integer_text(text.substr(9));
    if (r && *r >= 1 && *r <= 1024) return Method{text, true, false, static_cast<int>(*r), "ddp"};
  }
  return std::nullopt;
}

// Chapter 10's section 1: the project's tiers (link_tiers.h) by --tier name.
std::map<std::string, Tier> default_tiers() {
  return {{"nvlink", nvlink_tier()},
          {"infiniband", infiniband_tier()},
          {"ethernet", ethernet_tier()},
          {"wan", wan_tier()}};
}

// --- the lesson's bytes, counted here -------------------------------------------------

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Bytes of n b-bit codes packed into 32-bit words: 4 ceil(n b / 32).
std::int64_t code_bytes(std::int64_t n, int bits) { return 4 * ceil_div(n * bits, 32); }

// What one rank's collectives count (each call's buffer) to average one
// unit's gradient of @p n values of @p e bytes on @p N ranks, per the
// lesson: an all-reduce counts its buffer, e n (chapter 02's 2.2); sign
// all-gathers every rank's signs and scale, N (4 ceil(n/32) + e) (section
// 3); int8/int4 count, per all_to_all_v, this rank's codes and scales of
// every chunk L_j, and per all-gather everyone's 8-bit codes and scales:
// sum_j [4 ceil(L_j b/32) + ceil(L_j/B) e] + sum_r [4 ceil(L_r/4) + ceil(L_r/B) e]
// (section 6, the chunks L_j of dtp::chunk_range).
std::int64_t sign_bytes(std::int64_t n, std::int64_t e, int N) {
  return N * (code_bytes(n, 1) + e);
}

std::int64_t quantized_bytes(std::int64_t n, std::int64_t e, int N, int bits, std::int64_t block) {
  std::int64_t total = 0;
  for (int j = 0; j < N; ++j) {
    const std::int64_t L = dtp::chunk_range(n, N, j).length;
    total += code_bytes(L, bits) + ceil_div(L, block) * e;  // reduce-scatter's all-to-all
    total += code_bytes(L, 8) + ceil_div(L, block) * e;     // the all-gather, 8 bits
  }
  return total;
}

// PowerSGD (section 5): P [out, r] and Q [in, r] of every 2-D parameter,
// every other parameter whole.
std::int64_t powersgd_bytes(const dtp::Unit& unit, std::int64_t e, int r) {
  std::int64_t values = 0;
  for (const dtp::ParamView& p : unit.parameters())
    values += p.shape.ndim() == 2 ? r * (p.shape[0] + p.shape[1]) : p.shape.numel();
  return values * e;
}

// The formula's bytes of step @p step (from 1) of @p m on the world's
// communicator, for every unit of @p model. ZeRO-3 (section 7) gathers each
// unit twice and reduce-scatters it, 3 n e; ZeRO++ gathers it once in 8
// bits (qwZ) and reduce-scatters it in 4 (qgZ): quantized_bytes(n, 4); both
// add the gradient norm's all-reduce of one f64 (8 bytes).
std::int64_t formula_bytes(const Method& m, const dtp::GPT& model, int N, int onebit_warmup,
                           std::int64_t block, std::int64_t step) {
  std::int64_t total = m.sharded() ? 8 : 0;
  const auto e = static_cast<std::int64_t>(dtp::dtype_size(model.config().dtype));
  for (const dtp::Unit* unit : model.units()) {
    const std::int64_t n = unit->numel();
    if (m.name == "zero3")
      total += 3 * n * e;
    else if (m.name == "zero++")
      total += quantized_bytes(n, e, N, 4, block);
    else if (m.name == "sign" || (m.name == "1bit-adam" && step > onebit_warmup))
      total += sign_bytes(n, e, N);
    else if (m.name == "int8" || m.name == "int4")
      total += quantized_bytes(n, e, N, m.name == "int8" ? 8 : 4, block);
    else if (m.powersgd_rank > 0)
      total += powersgd_bytes(*unit, e, m.powersgd_rank);
    else
      total += n * e;  // an all-reduce per unit: ddp, ddp-adamw, 1-bit Adam's warm-up
  }
  return total;
}

// What ZeRO++'s hpZ gathers inside a node per step: every unit's weights
// once, unquantized, n e (nothing for the other methods).
std::int64_t formula_node_bytes(const Method& m, const dtp::GPT& model) {
  if (m.name != "zero++") return 0;
  std::int64_t total = 0;
  for (const dtp::Unit* unit : model.units())
    total += unit->numel() * static_cast<std::int64_t>(dtp::dtype_size(model.config().dtype));
  return total;
}

// --- one run ----------------------------------------------------------------------------

struct Options {
  int world = 4;
  std::int64_t steps = 60;
  double sgd_lr = 0.1;
  double adam_lr = 3e-3;
  int onebit_warmup = 20;
  std::int64_t block = 256;
  int node_ranks = 2;  // ranks per node: NVLink inside, the tier between
  Tier tier;           // between nodes
  Tier inside;         // inside a node (--nvlink)
};

// What one run of a method measured; [step] unless said.
struct Run {
  std::vector<double> losses;                 // the ranks' mean
  std::vector<double> comm_s;                 // the clock's advance (the same on every rank)
  std::vector<double> compute_s;              // the slowest rank's wall time outside collectives
  std::vector<std::int64_t> bytes;            // rank 0's collective bytes
  std::vector<std::int64_t> formula;          // this program's
  std::vector<std::int64_t> node_bytes;       // rank 0's inside its hpZ node (zero++)
  std::int64_t node_formula = 0;              // this program's, every step
  std::map<std::string, std::int64_t> calls;  // rank 0's collective calls over the run
  std::vector<std::string> problems;
};

// The trainer settings of @p m: SGD at --lr, or AdamW / 1-bit Adam at
// --adam-lr with beta2 0.999 and no clipping (1-bit Adam does not clip);
// a constant learning rate, as 1-bit Adam keeps its own.
dtp::TrainConfig method_config(const dtp::TrainConfig& base, const Method& m, const Options& o) {
  dtp::TrainConfig c = base;
  c.steps = o.steps;
  c.warmup = 0;
  c.min_lr_ratio = 1.0;
  c.optimizer = m.adam ? "adamw" : "sgd";
  c.lr = m.adam ? o.adam_lr : o.sgd_lr;
  if (m.adam) {
    c.beta2 = 0.999;
    c.grad_clip = 0;
  }
  return c;
}

std::unique_ptr<dtp::drivers::Strategy> make_strategy(const Method& m, const Options& o) {
  if (!m.compressed) {
    dtp::ch02::DdpOptions ddp;
    ddp.world = o.world;
    ddp.mode = dtp::ch02::DdpMode::flat;
    return std::make_unique<dtp::ch02::DdpStrategy>(ddp);
  }
  auto s = std::make_unique<dtp::ch10::CompressStrategy>();
  s->options.world = o.world;
  s->options.compressor = m.name;
  s->options.powersgd_rank = m.powersgd_rank;
  s->options.onebit_warmup = o.onebit_warmup;
  s->options.block = o.block;
  if (m.sharded()) {
    s->options.compressor = "zero++";
    s->options.zeropp = m.name == "zero3" ? "none" : "qwz,hpz,qgz";
    s->options.node_ranks = o.node_ranks;
  }
  return s;
}

// Seconds of [start, end) covered by @p intervals (sorted by start).
double covered(const std::vector<std::pair<double, double>>& intervals, double start, double end) {
  double total = 0, reach = start;
  for (const auto& [a, b] : intervals) {
    const double lo = std::max(a, reach), hi = std::min(b, end);
    if (hi > lo) {
      total += hi - lo;
      reach = hi;
    }
  }
  return total * 1e-6;
}

Run run_method(const dtp::TrainConfig& base, const Method& m, const Options& o,
               const std::string& label) {
  const int N = o.world;
  const std::size_t K = static_cast<std::size_t>(o.steps);
  dtp::TrainConfig config = method_config(base, m, o);
  std::unique_ptr<dtp::drivers::Strategy> strategy = make_strategy(m, o);
  strategy->resolve(config, {}, 0);
  strategy->validate(config);

  Run run;
  std::vector<std::vector<double>> losses(N), clocks(N);
  std::vector<std::vector<std::int64_t>> bytes(N);
  std::vector<std::vector<double>> params(N);
  std::int64_t whole = 0;  // the bytes of uncompressed all-reduces, for the messages
  dtp::World world = dtp::World::from_env(N);
  const Tier& inside = o.inside;
  world.cost = dtp::CostModel{o.tier.alpha_s, 1.0 / o.tier.bandwidth_Bps}.with_nodes(
      o.node_ranks, inside.alpha_s, 1.0 / inside.bandwidth_Bps);
  dtp::trace::enable();
  dtp::launch(world, [&](dtp::Comm& comm) {
    const std::size_t r = static_cast<std::size_t>(comm.rank());
    dtp::TrainConfig c = config;
    c.model.device = comm.device();
    std::unique_ptr<dtp::drivers::RankRun> rank = strategy->start(c, comm);
    if (r == 0) {
      whole = formula_bytes(*parse_method("ddp"), rank->trainer().model(), N, 0, o.block, 1);
      for (std::int64_t s = 1; s <= o.steps; ++s)
        run.formula.push_back(
            formula_bytes(m, rank->trainer().model(), N, o.onebit_warmup, o.block, s));
      run.node_formula = formula_node_bytes(m, rank->trainer().model());
    }
    const dtp::CommStats start = comm.stats();
    for (std::size_t s = 0; s < K; ++s) {
      const dtp::CommStats before = comm.stats();
      dtp::StepRecord record;
      {
        dtp::trace::Scope span(kStepSpan, "bench");
        record = rank->step();
      }
      const dtp::CommStats after = comm.stats();
      losses[r].push_back(record.loss);
      clocks[r].push_back(after.clock - before.clock);
      bytes[r].push_back(after.collective_bytes - before.collective_bytes);
      // The compress strategy's third value under zero++: the node's bytes.
      if (r == 0 && m.name == "zero++")
        run.node_bytes.push_back(static_cast<std::int64_t>(rank->report_values().at(2)));
    }
    if (r == 0) {
      const dtp::CommStats end = comm.stats();
      for (const auto& [kind, count] : end.collective_calls)
        run.calls[kind] =
            count - (start.collective_calls.count(kind) ? start.collective_calls.at(kind) : 0);
    }
    // A ZeRO rank holds shards, not a replica (tests/drivers/zero_plus_plus_test.cpp
    // checks what its ranks must agree on).
    if (m.sharded()) return;
    for (dtp::Unit* unit : rank->trainer().model().units()) {
      const std::vector<double> p = unit->params().to_vector();
      params[r].insert(params[r].end(), p.begin(), p.end());
    }
  });
  dtp::trace::disable();

  // Per rank: its step spans and its collectives' spans (its own thread).
  std::vector<std::vector<std::pair<double, double>>> steps(N), comm(N);
  for (const dtp::trace::Span& span : dtp::trace::take_spans()) {
    if (span.rank < 0 || span.rank >= N || span.lane != 0) continue;
    if (span.name == kStepSpan) steps[span.rank].push_back({span.start_us, span.end_us});
    if (span.category == "comm") comm[span.rank].push_back({span.start_us, span.end_us});
  }
  for (int r = 0; r < N; ++r) {
    std::sort(steps[r].begin(), steps[r].end());
    std::sort(comm[r].begin(), comm[r].end());
    DTP_CHECK(steps[r].size() == K, label, ": rank ", r, " traced ", steps[r].size(),
              " steps, ran ", K);
  }
  std::vector<bool> reported(static_cast<std::size_t>(N), false);
  for (std::size_t s = 0; s < K; ++s) {
    double loss = 0, compute = 0;
    for (int r = 0; r < N; ++r) {
      loss += losses[r][s];
      const auto [a, b] = steps[r][s];
      compute = std::max(compute, (b - a) * 1e-6 - covered(comm[r], a, b));
    }
    run.losses.push_back(loss / N);
    run.compute_s.push_back(compute);
    run.comm_s.push_back(clocks[0][s]);
    run.bytes.push_back(bytes[0][s]);
    for (int r = 0; r < N; ++r) {
      const std::int64_t got = bytes[r][s], want = run.formula[s];
      if (got == want || reported[r]) continue;  // a rank's first difference says enough
      reported[r] = true;
      char text[768];
      std::snprintf(
          text, sizeof text,
          "%s, step %zu, rank %d: its collectives counted %lld bytes, the lesson's formula %lld "
          "(x %.4f; uncompressed all-reduces would count %lld): %s",
          label.c_str(), s + 1, r, static_cast<long long>(got), static_cast<long long>(want),
          static_cast<double>(got) / static_cast<double>(want), static_cast<long long>(whole),
          got == whole ? "as many as uncompressed all-reduces: the gradients went whole"
          : got > want ? "more than the formula: more bits per code, more scales, or a unit or "
                         "collective sent twice"
                       : "less than the formula: a unit, chunk or scale left out, or fewer bits "
                         "per code than the contract says");
      run.problems.push_back(text);
    }
    if (!run.node_bytes.empty() && run.node_bytes[s] != run.node_formula) {
      char text[512];
      std::snprintf(text, sizeof text,
                    "%s, step %zu, rank 0: its hpZ node's collectives counted %lld bytes, the "
                    "lesson's formula %lld (every unit's weights gathered once inside the node)",
                    label.c_str(), s + 1, static_cast<long long>(run.node_bytes[s]),
                    static_cast<long long>(run.node_formula));
      run.problems.push_back(text);
    }
  }
  if (const auto d = first_replica_difference(params)) {
    const auto r = static_cast<std::size_t>(d->rank);
    char text[512];
    std::snprintf(text, sizeof text,
                  "%s: after step %zu rank %d's parameter %zu (flat over the units) is %.17g, "
                  "rank 0's %.17g: the replicas drifted apart (every rank must apply the same "
                  "average)",
                  label.c_str(), K, d->rank, d->index, params[r][d->index], params[0][d->index]);
    run.problems.push_back(text);
  }
  return run;
}

double mean_tail(const std::vector<double>& v) { return mean_of_last(v, kLossTail); }

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

template <typename T>
double mean_of(const std::vector<T>& v, std::size_t from, std::size_t to) {
  double sum = 0;
  for (std::size_t i = from; i < to; ++i) sum += static_cast<double>(v[i]);
  return to > from ? sum / static_cast<double>(to - from) : 0;
}

// Prints the table and appends a JSON line per method; appends to
// @p problems what the first round's runs found.
void report(const std::vector<Method>& methods, const std::vector<Run>& first,
            const std::vector<std::vector<double>>& compute, const Options& o,
            const dtp::TrainConfig& config, std::int64_t repeats, const RunContext& context,
            FILE* json, std::vector<std::string>& problems) {
  const dtp::GPTConfig model = config.resolved_model();
  const std::int64_t params = model.parameter_count();
  const std::size_t K = static_cast<std::size_t>(o.steps);
  std::printf("# compression, %s backend on %s, %d ranks, %s, %d cores, %d compute thread(s)\n",
              context.backend.c_str(), context.device.c_str(), o.world,
              dtp::dtype_name(model.dtype), context.cores, dtp::compute_threads());
  std::printf(
      "# model: d_model %d, %d layers, %d heads, vocab %d, %lld parameters; batch %lld x seq "
      "%lld; %lld steps x %lld rounds; SGD lr %g, Adam lr %g (constant), 1-bit Adam warm-up %d, "
      "block %lld\n",
      model.d_model, model.layers, model.heads, model.vocab_size, static_cast<long long>(params),
      static_cast<long long>(config.batch), static_cast<long long>(config.seq),
      static_cast<long long>(K), static_cast<long long>(repeats), o.sgd_lr, o.adam_lr,
      o.onebit_warmup, static_cast<long long>(o.block));
  const Tier& inside = o.inside;
  std::printf(
      "# tier: %s between nodes of %d ranks, alpha %g us, %g GB/s per rank; %s inside a node, "
      "alpha %g us, %g GB/s\n",
      o.tier.name.c_str(), o.node_ranks, o.tier.alpha_s * 1e6, o.tier.bandwidth_Bps / 1e9,
      inside.name.c_str(), inside.alpha_s * 1e6, inside.bandwidth_Bps / 1e9);
  std::printf(
      "# loss: mean of the last %zu steps; d loss: minus the peer's (ddp, ddp-adamw for "
      "1bit-adam, zero3 for zero++); bytes: rank's collective buffers on the world per step (mean "
      "over the steps; zero++'s node bytes are in the JSON), x: over the peer's; comm: the clock "
      "per step; compute: median of the slowest rank's; step = compute + "
      "comm\n",
      kLossTail);
  std::printf("%-11s %-9s %8s %8s %12s %12s %7s %9s %9s %9s %7s\n", "method", "peer", "loss",
              "d loss", "bytes", "formula", "x", "comm ms", "compute", "step ms", "time x");
  std::vector<double> step_s(methods.size()), comm_mean(methods.size()), bytes_mean(methods.size());
  for (std::size_t i = 0; i < methods.size(); ++i) {
    comm_mean[i] = mean(first[i].comm_s);
    bytes_mean[i] = mean_of(first[i].bytes, 0, K);
    step_s[i] = median(compute[i]) + comm_mean[i];
  }
  for (std::size_t i = 0; i < methods.size(); ++i) {
    const Method& m = methods[i];
    const Run& run = first[i];
    problems.insert(problems.end(), run.problems.begin(), run.problems.end());
    std::size_t p = 0;
    while (methods[p].name != m.peer) ++p;
    const double loss = mean_tail(run.losses), peer_loss = mean_tail(first[p].losses);
    const double formula_mean = mean_of(run.formula, 0, K);
    const double bytes_ratio = bytes_mean[i] / bytes_mean[p];
    const double time_ratio = step_s[i] / step_s[p];
    const double compute_s = median(compute[i]);
    std::printf("%-11s %-9s %8.4f %+8.4f %12.0f %12.0f %6.4fx %9.3f %9.2f %9.2f %6.3fx\n",
                m.name.c_str(), m.peer.c_str(), loss, loss - peer_loss, bytes_mean[i], formula_mean,
                bytes_ratio, comm_mean[i] * 1e3, compute_s * 1e3, step_s[i] * 1e3, time_ratio);
    if (!json) continue;
    // 1-bit Adam's two phases, apart.
    const std::size_t w = std::min<std::size_t>(static_cast<std::size_t>(o.onebit_warmup), K);
    JsonLine call_counts;
    for (const auto& [kind, count] : run.calls)
      call_counts.add(kind, static_cast<double>(count) / static_cast<double>(K));
    JsonLine line;
    line.add("what", "compression")
        .add("method", m.name)
        .add("peer", m.peer)
        .add("optimizer", m.adam ? (m.compressed ? "1bit-adam" : "adamw") : "sgd")
        .add("lr", m.adam ? o.adam_lr : o.sgd_lr)
        .add("world", o.world)
        .add("tier", o.tier.name)
        .add("node_ranks", o.node_ranks)
        .add("node_tier", inside.name)
        .add("node_bytes_per_step", run.node_bytes)
        .add("node_formula_bytes_per_step", run.node_formula)
        .add("alpha_us", o.tier.alpha_s * 1e6)
        .add("bandwidth_GBps", o.tier.bandwidth_Bps / 1e9)
        .add("parameters", params)
        .add("block", o.block)
        .add("onebit_warmup", o.onebit_warmup)
        .add("steps", o.steps)
        .add("losses", run.losses)
        .add("final_loss", loss)
        .add("peer_final_loss", peer_loss)
        .add("loss_minus_peer", loss - peer_loss)
        .add("bytes_per_step", run.bytes)
        .add("formula_bytes_per_step", run.formula)
        .add("mean_bytes_per_step", bytes_mean[i])
        .add("bytes_ratio", bytes_ratio)
        .add("bytes_match_formula", run.bytes == run.formula)
        .add("warmup_phase_bytes_per_step", mean_of(run.bytes, 0, m.name == "1bit-adam" ? w : K))
        .add("compressed_phase_bytes_per_step",
             mean_of(run.bytes, m.name == "1bit-adam" ? w : 0, K))
        .raw("collective_calls_per_step", call_counts.str())
        .add("comm_s_per_step", run.comm_s)
        .add("mean_comm_s", comm_mean[i])
        .add("compute_s", compute_s)
        .add("compute_s_samples", compute[i])
        .add("step_s", step_s[i])
        .add("peer_step_s", step_s[p])
        .add("time_ratio", time_ratio)
        .add("repeats", repeats)
        .add("warmup", static_cast<std::int64_t>(kWarmup))
        .add("compute_threads", dtp::compute_threads());
    add_shape(line, model, config.seq, config.batch);
    write_line(json, add_context(line, context));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> method_names = {"ddp",        "sign",       "int8",      "int4",
                                           "powersgd:1", "powersgd:4", "ddp-adamw", "1bit-adam",
                                           "zero3",      "zero++"};
  std::int64_t repeats = 3;
  std::string json_path, tier_name = "ethernet";
  std::map<std::string, Tier> tiers = default_tiers();
  Options o;
  dtp::TrainConfig config;
  config.model.layers = 4;
  config.model.d_model = 128;
  config.model.heads = 4;
  config.model.vocab_size = 256;
  config.seq = 64;
  config.batch = 8;
  config.synthetic.length = 1 << 16;
  CLI::App app{
      "What chapter 10's compressors do to data-parallel training over a slow link: every method "
      "trains the same GPT from the same seed on --world rank threads, with the alpha-beta clock "
      "set to the --tier's link. Per method: the loss curve and the loss at the end (mean of the "
      "last 5 steps), each rank's collective bytes per step (checked against the lesson's "
      "formulas: a difference fails the run), the communication time on the clock and the "
      "step's compute, against uncompressed DDP (2.2) in the same run. Methods: ddp, sign "
      "(10.2), int8 and int4 (10.5), powersgd:R (10.4) with SGD; ddp-adamw and 1bit-adam "
      "(10.3); zero3 and zero++ (ZeRO-3 and ZeRO++, 10.5) with SGD.",
      kProgram};
  dtp::cli::add_list_option(app, "--methods", method_names,
                            "a comma list of ddp, sign, int8, int4, powersgd:R, ddp-adamw, "
                            "1bit-adam, zero3, zero++; each method's baseline (ddp, ddp-adamw for "
                            "1bit-adam, zero3 for zero++) runs too",
                            "METHOD,...")
      ->check(CLI::Validator(
          [](std::string& text) {
            return parse_method(text) ? std::string()
                                      : "expects ddp, sign, int8, int4, powersgd:R (R from 1 to "
                                        "1024), ddp-adamw, 1bit-adam, zero3 or zero++, got '" +
                                            text + "'";
          },
          "METHOD"))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps K of every run")
      ->check(dtp::cli::Range(std::int64_t{kWarmup + 1}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--repeats", repeats, "runs of every method, in turn: compute times pooled")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000}))
      ->capture_default_str();
  app.add_option("--world", o.world, "data-parallel ranks (threads)")
      ->check(dtp::cli::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--node-ranks", o.node_ranks,
                 "ranks per node: the clock charges NVLink inside a node and the --tier between "
                 "nodes; zero++'s hpZ keeps its secondary shards in a node (must divide --world)")
      ->check(dtp::cli::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--batch", config.batch, "global batch (sequences per step)")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--lr", o.sgd_lr, "SGD's learning rate (constant)")
      ->check(dtp::cli::Range(0.0, 1e3))
      ->capture_default_str();
  app.add_option("--adam-lr", o.adam_lr, "AdamW's and 1-bit Adam's learning rate (constant)")
      ->check(dtp::cli::Range(0.0, 1e3))
      ->capture_default_str();
  app.add_option("--onebit-warmup", o.onebit_warmup, "1-bit Adam's exact steps")
      ->check(dtp::cli::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--block", o.block, "values per quantization block (int8, int4, zero++)")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--tier", tier_name, "the link the clock charges")
      ->check(CLI::IsMember({"nvlink", "infiniband", "ethernet", "wan"}))
      ->capture_default_str();
  for (const char* name : {"ethernet", "wan", "infiniband", "nvlink"}) {
    const std::string flag = std::string("--") + name;
    Tier& tier = tiers.at(name);
    char text[64];
    std::snprintf(text, sizeof text, "%g,%g", tier.alpha_s * 1e6, tier.bandwidth_Bps / 1e9);
    app.add_option_function<std::string>(
           flag,
           [&tier, flag](const std::string& v) {
             const LinkCost link = parse_link(flag, v);
             tier.alpha_s = link.alpha_s;
             tier.bandwidth_Bps = link.bandwidth_Bps;
             tier.name += " (" + flag + " given)";
           },
           "the " + tier.name + " tier's alpha (us) and bandwidth (GB/s per rank)")
        ->type_name("ALPHA_US,GBPS")
        ->default_str(text);
  }
  add_training_shape_options(app, config, "f32 or f64");
  app.add_option("--json", json_path, "append one JSON object per method to FILE")
      ->type_name("FILE");
  app.footer(
      "The backend's name in the results comes from DTP_BACKEND (thread; the ranks are threads "
      "of this process); DTP_THREADS sets the CPU ops' threads (default: every core).");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  std::optional<RunContext> context = context_from_env(kProgram);
  if (!context) return 2;
  o.tier = tiers.at(tier_name);
  o.inside = tiers.at("nvlink");
  if (o.world % o.node_ranks != 0) {
    std::fprintf(stderr, "%s: error: --node-ranks %d must divide --world %d into whole nodes\n",
                 kProgram, o.node_ranks, o.world);
    return 2;
  }
  config.synthetic.length = std::max<std::int64_t>(config.synthetic.length, 4 * (config.seq + 1));

  // The baselines first, then the methods in the order given.
  std::vector<Method> methods;
  auto add = [&methods](const Method& m) {
    for (const Method& x : methods)
      if (x.name == m.name) return;
    methods.push_back(m);
  };
  add(*parse_method("ddp"));
  for (const std::string& name : method_names) add(*parse_method(parse_method(name)->peer));
  for (const std::string& name : method_names) add(*parse_method(name));

  FILE* json = nullptr;
  if (!open_json(kProgram, json_path, json)) return 2;
  std::vector<Run> first(methods.size());
  std::vector<std::vector<double>> compute(methods.size());
  std::vector<std::string> problems;
  try {
    for (std::int64_t round = 0; round < repeats; ++round)
      for (std::size_t i = 0; i < methods.size(); ++i) {
        const std::string label = methods[i].name + ", round " + std::to_string(round + 1);
        Run run = run_method(config, methods[i], o, label);
        compute[i].insert(compute[i].end(), run.compute_s.begin() + kWarmup, run.compute_s.end());
        if (round > 0 && run.losses != first[i].losses) {
          std::size_t s = 0;
          while (run.losses[s] == first[i].losses[s]) ++s;
          char text[512];
          std::snprintf(text, sizeof text,
                        "%s: step %zu's loss is %.17g, round 1's %.17g: the same run did not "
                        "repeat bit for bit",
                        label.c_str(), s + 1, run.losses[s], first[i].losses[s]);
          problems.push_back(text);
        }
        if (round == 0)
          first[i] = std::move(run);
        else
          problems.insert(problems.end(), run.problems.begin(), run.problems.end());
      }

    report(methods, first, compute, o, config, repeats, *context, json, problems);
  } catch (const std::exception& e) {  // a run that failed, or a JSON line that was not written
    std::fprintf(stderr, "%s: error: %s\n", kProgram, e.what());
    close_json(json, kProgram, 1);
    return 1;
  }
  return finish_checked_run(
      json, kProgram, problems,
      "the bytes differ from the lesson's formulas, the replicas differ, or a run did not repeat",
      "every step's bytes equal the lesson's formula on every rank, the replicas agree, and every "
      "round repeated the first bit for bit");
}
