// dtp-bench-sequence-expert: chapter 06 measured. Sequence-parallel attention
// (the reference Ulysses, ring, zigzag and hybrid) against single-device flash
// attention; what Ulysses and the ring send, on the alpha-beta clock; and how
// many tokens a mixture of experts drops at each capacity factor; and whole
// training steps of sp and ep against one device.
//   dtp-bench-sequence-expert [--only attention|tiers|moe|train] [--seqs 256,512,1024,2048]
//       [--degrees 1,2,4,8] [--methods flash,ulysses,ring,zigzag,hybrid] [--batch 1]
//       [--heads 8] [--head-dim 32] [--dtype f32|f64] [--warmup 1] [--repeats 3]
//       [--nvlink 3,450] [--infiniband 8,50] [--tier-shape 1,16,32,8192]
//       [--moe-experts 4,8] [--moe-top-k 1,2] [--moe-coefs 0,0.01] [--moe-steps 300]
//       [--train-shape 2,128,8,256,4] [--train-moe 4,2] [--train-steps 4] [--quick] [--json FILE]
// (--help lists them with their defaults.)
//
// Part 1, "sp_attention": causal attention, forward then backward, on q, k,
// v [B, T/n, H, D] shards of random data, for every T of --seqs and degree n
// of --degrees: UlyssesAttention (n must divide H), RingAttention contiguous
// and zigzag (T must divide by 2n), HybridAttention with u = n/2 (two groups;
// n >= 4). The peer, in the same run: ops::flash_attention_forward and
// _backward on the whole sequence on one rank ("flash"); every method's
// output and gradients are compared with it (max_abs_error). Per rank:
//  - time: wall time of the forward and of the backward (a barrier before
//    each), the slowest rank's, median over --repeats rounds taken
//    round-robin over the methods; and the rank's thread CPU time of both
//    (CLOCK_THREAD_CPUTIME_ID), which does not count time spent waiting or
//    descheduled. The n ranks are threads sharing this machine's cores, so
//    wall time cannot fall below (total work) / cores; the busiest rank's
//    CPU time is what n devices, one per rank, would wait for (communication
//    aside). Its prediction: the share of the causal scores the busiest rank
//    computes, times the peer's CPU time: 1/n for Ulysses and zigzag,
//    (2n - 1)/n^2 for the contiguous ring (rank n - 1 holds n - 1 full
//    blocks and the diagonal one), the ring's share over n/u groups divided
//    by u for the hybrid.
//  - memory, from the rank's MemoryTracker: peak_bytes is total_peak() over
//    the forward and backward, the rank's input shards (q, k, v, dout)
//    included: everything the rank holds at its fullest. saved_bytes is what
//    the method keeps from forward to backward: the tracker's live bytes
//    after the forward minus before it, minus the returned output; for the
//    peer, which keeps the caller's q, k, v and its output instead of
//    copies, plus their bytes. Prediction (README sections 2 and 3): q, k, v, output and two
//    row statistics per position and head, for this rank's share,
//    (4 B (T/n) H D + 2 B H (T/n)) e, for every method.
//
// Part 2, "sp_comm_tiers": the same references on a shape chosen for its
// bytes (--tier-shape B,T,H,D; the default 1,16,32,8192 in f32 makes one
// whole q 16 MiB, 1/64 of the lesson's 1 GiB: the bytes of T = 2048
// positions at the lesson's H = 32, D = 128 in bf16, but with so few
// positions that the CPU's attention is negligible), n = 2, 4, 8,
// World::cost set to each tier. attend_block charges 1 clock unit per block whatever its size, so
// this part measures the clock in femtoseconds: alpha and beta are given in
// fs, and the compute charges (at most 3 (2n + 1) units per rank) add less
// than 1e-7 of the smallest clock here. The clock so counts communication
// only, every transfer in sequence: what the lesson's section 6 calls "if
// nothing is hidden". Peers: section 6's formulas. Bytes per rank come from
// CommStats: bytes_sent of the ring's messages, collective_bytes of the
// all-to-alls (each call's whole buffer, of which (g - 1)/g leaves the rank).
//
// Part 3, "moe_capacity": a small MoE GPT (dtp::Trainer, GPTConfig experts and
// top_k, synthetic data) for every E of --moe-experts, k of --moe-top-k and
// aux_loss_coef of --moe-coefs, at init and after --moe-steps AdamW steps on
// batches of 8 x 64 tokens (trained with capacity factor 1.25, the default).
// Each block's router probabilities of one held-out batch of 16 x 64 tokens
// (drawn with another seed; every block's forward run by hand) are routed with
// dtp::moe_route at capacity factors 0.5 .. 2 and E/k: choices dropped,
// tokens that lost every choice, and the load balance max_e f_e / mean
// (E max_e f_e, before drops). Peer: a router whose choices are uniform at
// random: expert loads Binomial(N, k/E), so expected drops
// E * sum_x max(0, x - c) P(x) exactly; its load balance by simulation
// (random rows through moe_route, --moe-trials of them).
//
// Part 4, "sp_ep_train_step": whole optimizer steps of the reference's
// SequenceParallelTrainer (Ulysses, ring, zigzag, hybrid with u = n/2) and
// ExpertParallelTrainer on n = 2, 4 ranks (--degrees), a GPT with flash
// attention (--train-shape; its MoE variant --train-moe), --train-steps
// timed steps after --warmup, --repeats rounds round-robin (the ratios to
// the peers are taken within each round: this machine's speed drifts). Peers, in the
// same run: the serial Trainer on the same model for sp, and the serial MoE
// with m routing groups (moe_groups = m: what ep on m ranks equals, README
// section 7) for ep; the last step's loss is compared with the peer's. Per
// rank: the step's wall time (the slowest rank's, median) and thread CPU
// time (the busiest rank's: the ranks are threads sharing this machine's
// cores, as in part 1); the activation peak (StepRecord); the params and
// optimizer bytes live after the steps; the payload bytes its collectives
// (each call's whole buffer) and sends moved in one step. Prediction for
// the bytes: the gradient all-reduce (Psi e for sp, the replicated Psi_rep e
// for ep) plus README section 6's attention bytes per layer, or section 7's
// four exchanges of every kept choice's row (top_k rows of C per token, no
// drops); the scalar all-reduces and the routing counts are left out.
//
// Thread backend on the CPU only: every rank's numbers are written into
// memory the process shares, and the timings assume no device queue.
// The runs themselves are in bench/sp_attention.h (parts 1 and 2),
// bench/moe_capacity.h (part 3) and bench/sp_ep_training.h (part 4); this
// file prints, writes JSON, parses the command line.
#include "06_sequence_expert/sequence_expert.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/moe_routing.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"
#include "moe_capacity.h"
#include "sp_attention.h"
#include "sp_ep_training.h"

namespace {

using namespace dtp::bench;
using namespace dtp::bench::sp;
namespace train = dtp::bench::train;
using dtp::ch06::SequenceParallelKind;
constexpr double kMiB = 1024.0 * 1024.0;

double mib(double bytes) { return bytes / kMiB; }

// --- part 1: time and memory ----------------------------------------------------------

struct AttentionOptions {
  std::vector<std::int64_t> seqs = {256, 512, 1024, 2048};
  std::vector<int> degrees = {1, 2, 4, 8};
  std::vector<Method> methods = {Method::flash, Method::ulysses, Method::ring, Method::zigzag, Method::hybrid};
  Dims dims;
  int warmup = 1, repeats = 3;
};

std::vector<Case> cases_for(const AttentionOptions& o) {
  std::vector<Case> cases;
  for (Method m : o.methods) {
    if (m == Method::flash) {
      cases.push_back({m, 1, 1});
      continue;
    }
    for (int n : o.degrees) cases.push_back({m, n, m == Method::hybrid ? std::max(1, n / 2) : 1});
  }
  return cases;
}

template <typename Get>
double slowest(const std::vector<RankNumbers>& ranks, Get get) {
  double worst = 0;
  for (const RankNumbers& r : ranks) worst = std::max(worst, static_cast<double>(get(r)));
  return worst;
}

int run_attention_part(const AttentionOptions& o, const RunContext& ctx, FILE* json) {
  const Dims& base = o.dims;
  std::printf(
      "# sp attention: %s backend on %s (%d cores), %s, B = %lld, H = %lld, D = %lld; forward + backward, "
      "median of %d rounds (round-robin) after %d warm-up pass(es)\n",
      ctx.backend.c_str(), ctx.device.c_str(), ctx.cores, dtp::dtype_name(base.dtype), static_cast<long long>(base.B),
      static_cast<long long>(base.H), static_cast<long long>(base.D), o.repeats, o.warmup);
  if (!ctx.glibc_tunables.empty()) std::printf("# GLIBC_TUNABLES=%s\n", ctx.glibc_tunables.c_str());
  std::printf(
      "# fwd, bwd: the slowest rank's wall ms. cpu max: the busiest rank's thread CPU ms (fwd + bwd); "
      "predicted: the peer's cpu x the busiest rank's share of the causal scores.\n"
      "# peak: the rank's tracker peak, input shards included (largest over ranks). saved: kept from forward "
      "to backward | formula (4 B (T/n) H D + 2 B H (T/n)) e.\n");
  std::printf("%6s %-16s %9s %9s %9s %9s %9s %9s %6s %9s %9s %9s %8s %9s\n", "T", "method", "fwd ms", "bwd ms",
              "cpu max", "predicted", "cpu sum", "x flash", "blocks", "peak MiB", "saved MiB", "formula", "comm MiB",
              "max err");
  for (std::int64_t T : o.seqs) {
    Dims d = base;
    d.T = T;
    Problem problem = make_problem(d, 1000 + static_cast<std::uint64_t>(T));
    std::vector<Case> cases;
    for (const Case& c : cases_for(o)) {
      if (const std::string why = cannot_run(c, d); !why.empty()) {
        if (c.method != Method::hybrid || c.n >= 4)  // the hybrid starts at n = 4 by design
          std::printf("# T = %lld: skipped %s (%s)\n", static_cast<long long>(T), c.label().c_str(), why.c_str());
        continue;
      }
      cases.push_back(c);
    }
    // The peer first: its results are the reference the others are checked against.
    std::stable_partition(cases.begin(), cases.end(), [](const Case& c) { return c.method == Method::flash; });
    std::vector<std::vector<RankNumbers>> results(cases.size());
    for (int round = 0; round < o.repeats; ++round)
      for (std::size_t i = 0; i < cases.size(); ++i) {
        std::vector<RankNumbers> ranks = run_attention_round(cases[i], problem, o.warmup);
        if (round == 0) {
          results[i] = std::move(ranks);
          continue;
        }
        for (std::size_t r = 0; r < ranks.size(); ++r) {
          results[i][r].forward_s.push_back(ranks[r].forward_s.back());
          results[i][r].backward_s.push_back(ranks[r].backward_s.back());
          results[i][r].cpu_s.push_back(ranks[r].cpu_s.back());
        }
      }
    double flash_cpu = NAN;  // without the peer: no prediction, no comparison
    for (std::size_t i = 0; i < cases.size(); ++i)
      if (cases[i].method == Method::flash) flash_cpu = median(results[i][0].cpu_s);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const std::vector<RankNumbers>& ranks = results[i];
      // Per round, the slowest rank; then the median over rounds.
      std::vector<double> fwd, bwd;
      for (int round = 0; round < o.repeats; ++round) {
        fwd.push_back(slowest(ranks, [&](const RankNumbers& r) { return r.forward_s[round]; }));
        bwd.push_back(slowest(ranks, [&](const RankNumbers& r) { return r.backward_s[round]; }));
      }
      // CPU time: each rank's median over the rounds.
      const double cpu_max = slowest(ranks, [](const RankNumbers& r) { return median(r.cpu_s); });
      double cpu_sum = 0;
      std::vector<std::int64_t> blocks, peaks, saved;
      std::vector<double> cpu;
      for (const RankNumbers& r : ranks) {
        cpu_sum += median(r.cpu_s);
        cpu.push_back(median(r.cpu_s));
        blocks.push_back(r.blocks);
        peaks.push_back(r.peak_bytes);
        saved.push_back(r.saved_bytes);
      }
      const double predicted = flash_cpu * busiest_share(c);
      const double peak = slowest(ranks, [](const RankNumbers& r) { return r.peak_bytes; });
      const double saved_max = slowest(ranks, [](const RankNumbers& r) { return r.saved_bytes; });
      const double comm_peak = slowest(ranks, [](const RankNumbers& r) { return r.comm_peak_bytes; });
      const double error = std::isnan(ranks[0].max_abs_error)
                               ? NAN
                               : slowest(ranks, [](const RankNumbers& r) { return r.max_abs_error; });
      const std::int64_t formula = formula_saved_bytes(d, c.n);
      std::printf("%6lld %-16s %9.1f %9.1f %9.1f %9.1f %9.1f %9.2f %6lld %9.2f %9.2f %9.2f %8.2f %9.1e\n",
                  static_cast<long long>(T), c.label().c_str(), median(fwd) * 1e3, median(bwd) * 1e3, cpu_max * 1e3,
                  predicted * 1e3, cpu_sum * 1e3, cpu_sum / flash_cpu,
                  static_cast<long long>(slowest(ranks, [](const RankNumbers& r) { return r.blocks; })), mib(peak),
                  mib(saved_max), mib(static_cast<double>(formula)), mib(comm_peak), error);
      JsonLine line;
      line.add("what", "sp_attention")
          .add("method", method_name(c.method))
          .add("layout", dtp::ch06::sequence_layout_name(c.layout()))
          .add("sp", c.n)
          .add("ulysses_size", c.method == Method::hybrid ? c.u : (c.method == Method::ulysses ? c.n : 1))
          .add("world", c.n)
          .add("dtype", dtp::dtype_name(d.dtype))
          .add("batch", d.B)
          .add("seq", d.T)
          .add("heads", d.H)
          .add("head_dim", d.D)
          .add("forward_s", median(fwd))
          .add("backward_s", median(bwd))
          .add("step_s", median(fwd) + median(bwd))
          .add("forward_s_per_round", fwd)
          .add("backward_s_per_round", bwd)
          .add("cpu_s_busiest_rank", cpu_max)
          .add("cpu_s_per_rank", cpu)
          .add("cpu_s_sum", cpu_sum)
          .add("flash_cpu_s", flash_cpu)
          .add("busiest_share_formula", busiest_share(c))
          .add("predicted_cpu_s_busiest_rank", predicted)
          .add("blocks_per_rank", blocks)
          .add("memory_source",
               "MemoryTracker of each rank: peak = total_peak() over forward + backward, input shards q, k, v, dout "
               "included; saved = live after forward - live before - returned output (the peer: + q, k, v and its "
               "output, which it keeps instead of copies)")
          .add("peak_bytes", static_cast<std::int64_t>(peak))
          .add("peak_bytes_per_rank", peaks)
          .add("input_bytes", ranks[0].input_bytes)
          .add("saved_bytes", static_cast<std::int64_t>(saved_max))
          .add("saved_bytes_per_rank", saved)
          .add("formula_saved_bytes", formula)
          .add("comm_peak_bytes", static_cast<std::int64_t>(comm_peak))
          .add("max_abs_error", error)
          .add("warmup", o.warmup)
          .add("repeats", o.repeats);
      add_context(line, ctx);
      write_line(json, line);
    }
  }
  std::printf("\n");
  return 0;
}

// --- part 2: the tiers -----------------------------------------------------------------

std::vector<Tier> default_tiers() { return {{"NVLink", 3e-6, 450e9}, {"InfiniBand", 8e-6, 50e9}}; }

// "ALPHA_US,GBPS" into @p tier (--nvlink, --infiniband); a bad value is an
// error that names @p flag.
void set_tier(Tier& tier, const std::string& flag, const std::string& text) {
  auto bad = [&] {
    return CLI::ValidationError(flag, "takes ALPHA_US,GBPS (two numbers), alpha >= 0 and GB/s > 0, got '" + text + "'");
  };
  const std::size_t comma = text.find(',');
  if (comma == std::string::npos) throw bad();
  auto number = [&](const std::string& part) {
    const std::optional<double> value = dtp::cli::parse_real_text(part);  // decimal and finite
    if (!value) throw bad();
    return *value;
  };
  const double alpha_us = number(text.substr(0, comma)), gbps = number(text.substr(comma + 1));
  if (alpha_us < 0 || gbps <= 0) throw bad();
  tier.alpha_s = alpha_us * 1e-6;
  tier.bandwidth_Bps = gbps * 1e9;
}

struct TierOptions {
  Dims dims{1, 16, 32, 8192, dtp::DType::f32};
  std::vector<int> degrees = {2, 4, 8};
  std::vector<Tier> tiers = default_tiers();
};

int run_tier_part(const TierOptions& o, const RunContext& ctx, FILE* json) {
  const Dims& d = o.dims;
  const double whole = static_cast<double>(d.numel() * d.e());
  std::printf(
      "# sp comm tiers: forward + backward of the reference on B = %lld, T = %lld, H = %lld, D = %lld, %s "
      "(one whole q: %.1f MiB); the clock in fs, communication only, nothing hidden\n",
      static_cast<long long>(d.B), static_cast<long long>(d.T), static_cast<long long>(d.H),
      static_cast<long long>(d.D), dtp::dtype_name(d.dtype), mib(whole));
  for (const Tier& t : o.tiers)
    std::printf("# %s: alpha %g us, %g GB/s\n", t.name.c_str(), t.alpha_s * 1e6, t.bandwidth_Bps / 1e9);
  std::printf(
      "# sent MiB: off-rank bytes per rank, forward + backward (ring messages + (g-1)/g of each all-to-all); "
      "formula: section 6. clock: the slowest rank's, us.\n");
  std::printf("%-11s %-14s %2s %9s %9s %9s %11s %11s %11s %11s\n", "tier", "method", "n", "S MiB", "sent MiB",
              "formula", "fwd us", "formula", "fwd+bwd us", "formula");
  for (const Tier& tier : o.tiers)
    for (int n : o.degrees)
      for (Method m : {Method::ulysses, Method::ring, Method::zigzag, Method::hybrid}) {
        const Case c{m, n, m == Method::hybrid ? n / 2 : 1};
        if (!cannot_run(c, d).empty()) continue;
        const std::vector<CommNumbers> ranks = run_tier_case(c, d, tier);
        const double S = whole / n;
        const CommFormula f = comm_formula(c, S, tier);
        const int u = m == Method::ulysses ? n : (m == Method::hybrid ? c.u : 1);
        const double share = u > 1 ? (u - 1.0) / u : 0.0;
        const CommNumbers& r0 = ranks[0];
        auto sent = [&](const CommNumbers& r, bool forward) {
          return forward ? r.p2p_forward + share * r.a2a_forward : r.p2p_backward + share * r.a2a_backward;
        };
        double fwd_clock = 0, total_clock = 0, sent_max = 0;
        for (const CommNumbers& r : ranks) {
          fwd_clock = std::max(fwd_clock, r.clock_forward * kClockUnit);
          total_clock = std::max(total_clock, r.clock_total * kClockUnit);
          sent_max = std::max(sent_max, sent(r, true) + sent(r, false));
        }
        std::printf("%-11s %-14s %2d %9.2f %9.2f %9.2f %11.1f %11.1f %11.1f %11.1f\n", tier.name.c_str(),
                    c.label().c_str(), n, mib(S), mib(sent_max), mib(f.forward_bytes + f.backward_bytes),
                    fwd_clock * 1e6, f.forward_s * 1e6, total_clock * 1e6, (f.forward_s + f.backward_s) * 1e6);
        JsonLine line;
        line.add("what", "sp_comm_tiers")
            .add("tier", tier.name)
            .add("alpha_us", tier.alpha_s * 1e6)
            .add("bandwidth_GBps", tier.bandwidth_Bps / 1e9)
            .add("method", method_name(m))
            .add("layout", dtp::ch06::sequence_layout_name(c.layout()))
            .add("sp", n)
            .add("ulysses_size", u)
            .add("world", n)
            .add("dtype", dtp::dtype_name(d.dtype))
            .add("batch", d.B)
            .add("seq", d.T)
            .add("heads", d.H)
            .add("head_dim", d.D)
            .add("local_bytes", S)
            .add("p2p_bytes_forward", r0.p2p_forward)
            .add("p2p_bytes_backward", r0.p2p_backward)
            .add("all_to_all_bytes_forward", r0.a2a_forward)
            .add("all_to_all_bytes_backward", r0.a2a_backward)
            .add("messages", r0.messages)
            .add("collective_calls", r0.collectives)
            .add("sent_bytes_forward", sent(r0, true))
            .add("sent_bytes_backward", sent(r0, false))
            .add("sent_bytes_max_over_ranks", sent_max)
            .add("formula_sent_bytes_forward", f.forward_bytes)
            .add("formula_sent_bytes_backward", f.backward_bytes)
            .add("clock_forward_us", fwd_clock * 1e6)
            .add("clock_us", total_clock * 1e6)
            .add("formula_forward_us", f.forward_s * 1e6)
            .add("formula_us", (f.forward_s + f.backward_s) * 1e6)
            .add("clock_minus_formula_fs", (total_clock - f.forward_s - f.backward_s) / kClockUnit)
            .add("clock_note",
                 "communication only: clock unit 1 fs, so attend_block's 1 or 2 units per block add < 1e-7; a "
                 "send is charged when posted, so nothing overlaps");
        add_context(line, ctx);
        write_line(json, line);
      }
  std::printf("\n");
  return 0;
}

// --- part 3: mixture of experts --------------------------------------------------------

using MoeOptions = dtp::bench::moe::Options;

int run_moe_part(const MoeOptions& o, const RunContext& ctx, FILE* json) {
  namespace moe = dtp::bench::moe;
  std::printf(
      "# moe capacity: GPT d_model %d, %d layers, %d heads, vocabulary %d, synthetic data; router "
      "probabilities of one held-out batch of %lld x %lld tokens per block, at init and after %lld AdamW "
      "steps of %lld x %lld tokens (trained at capacity factor %g)\n",
      o.d_model, o.layers, o.heads, o.vocab, static_cast<long long>(o.probe_batch), static_cast<long long>(o.seq),
      static_cast<long long>(o.steps), static_cast<long long>(o.batch), static_cast<long long>(o.seq),
      o.train_capacity_factor);
  std::printf(
      "# drop %%: choices dropped / (N k) at each capacity factor (the last is E/k); uniform: a router choosing "
      "uniformly at random (binomial, exact). load: max_e f_e / mean (uniform: simulated, %d batches)\n",
      o.trials);
  for (std::int64_t E64 : o.experts)
    for (std::int64_t k64 : o.top_k) {
      const int E = static_cast<int>(E64), k = static_cast<int>(k64);
      if (k > E) continue;
      const std::vector<double> factors = moe::factors_for(o, E, k);
      std::printf("%-30s %5s", "E, k, coef, when", "load");
      for (double f : factors) std::printf(" %7s", ("cf " + std::to_string(f).substr(0, 4)).c_str());
      std::printf("  %s\n", "loss first -> last");
      const std::int64_t N = o.probe_batch * o.seq;
      const moe::UniformRouter uniform = moe::simulate_uniform_router(N, E, k, factors, o.trials);
      std::vector<double> exact;
      for (double f : factors) exact.push_back(moe::uniform_drop_fraction(N, E, k, dtp::moe_capacity(N, E, k, f)));
      std::printf("E %d k %d %-22s %5.2f", E, k, "uniform router", uniform.max_over_mean_load);
      for (double x : exact) std::printf(" %6.1f%%", 100 * x);
      std::printf("\n");
      for (double coef : o.coefs) {
        const moe::ModelLook look = moe::look_at_model(o, E, k, coef);
        for (int trained = 0; trained < 2; ++trained) {
          const auto& blocks = trained ? look.trained_probs : look.init_probs;
          for (std::size_t b = 0; b < blocks.size(); ++b) {
            const std::vector<double>& probs = blocks[b];
            std::vector<double> fraction, capacity, dropped, lost;
            for (double f : factors) {
              const moe::Routed r = moe::route(probs, E, k, f);
              fraction.push_back(r.drop_fraction);
              capacity.push_back(static_cast<double>(r.capacity));
              dropped.push_back(static_cast<double>(r.dropped));
              lost.push_back(static_cast<double>(r.tokens_lost));
            }
            const double load = moe::max_over_mean_load(probs, E, k);
            char label[64];
            std::snprintf(label, sizeof label, "%g %s block %zu", coef, trained ? "trained" : "init", b);
            std::printf("E %d k %d %-22s %5.2f", E, k, label, load);
            for (double x : fraction) std::printf(" %6.1f%%", 100 * x);
            if (trained && b == 0) std::printf("  %.3f -> %.3f", look.first_loss, look.last_loss);
            std::printf("\n");
            JsonLine line;
            line.add("what", "moe_capacity")
                .add("experts", E)
                .add("top_k", k)
                .add("aux_loss_coef", coef)
                .add("stage", trained ? "trained" : "init")
                .add("steps", trained ? o.steps : std::int64_t{0})
                .add("block", static_cast<int>(b))
                .add("tokens", N)
                .add("d_model", o.d_model)
                .add("layers", o.layers)
                .add("heads", o.heads)
                .add("vocab_size", o.vocab)
                .add("train_batch", o.batch)
                .add("probe_batch", o.probe_batch)
                .add("seq", o.seq)
                .add("parameters", look.parameters)
                .add("train_capacity_factor", o.train_capacity_factor)
                .add("capacity_factors", factors)
                .add("capacity", capacity)
                .add("dropped_choices", dropped)
                .add("drop_fraction", fraction)
                .add("tokens_lost", lost)
                .add("max_over_mean_load", load)
                .add("balance_loss", moe::balance_loss(probs, E, k))
                .add("uniform_drop_fraction", exact)
                .add("uniform_drop_fraction_simulated", uniform.drop_fraction)
                .add("uniform_max_over_mean_load", uniform.max_over_mean_load)
                .add("uniform_trials", o.trials)
                .add("first_loss", look.first_loss)
                .add("last_loss", look.last_loss);
            add_context(line, ctx);
            write_line(json, line);
          }
        }
      }
      std::printf("\n");
    }
  return 0;
}

// --- part 4: training steps ----------------------------------------------------------

struct TrainOptions {
  train::Model model = default_train_model();
  std::vector<int> degrees = {2, 4};
  std::int64_t warmup = 1, steps = 4, repeats = 6;

  static train::Model default_train_model() {
    train::Model m;
    m.config.model.layers = 2;
    m.config.model.d_model = 128;
    m.config.model.heads = 8;
    m.config.seq = 256;
    m.config.batch = 4;
    return m;
  }
};

std::vector<train::Setup> train_setups(const TrainOptions& o) {
  using train::Setup;
  std::vector<Setup> setups = {Setup{Setup::dense}};
  for (int n : o.degrees) {
    for (auto kind : {SequenceParallelKind::ulysses, SequenceParallelKind::ring, SequenceParallelKind::zigzag,
                      SequenceParallelKind::hybrid}) {
      if (kind == SequenceParallelKind::hybrid && n < 4) continue;  // one group would be Ulysses alone
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
  for (std::size_t k = 0; k < mine.size() && k < peer.size(); ++k) ratios.push_back(mine[k] / peer[k]);
  return median(ratios);
}

void print_train_header(const TrainOptions& o, const RunContext& ctx) {
  const dtp::TrainConfig& cfg = o.model.config;
  std::printf(
      "# sp and ep training steps: %s backend on %s (%d cores), %s, %s; GPT d_model %d, %d layers, %d heads, "
      "flash attention, batch %lld x %lld tokens; MoE: %d experts, top %d; median of %lld steps x %lld rounds "
      "(round-robin) after %lld warm-up steps\n",
      ctx.backend.c_str(), ctx.device.c_str(), ctx.cores, dtp::dtype_name(cfg.model.dtype), cfg.optimizer.c_str(),
      cfg.model.d_model, cfg.model.layers, cfg.model.heads, static_cast<long long>(cfg.batch),
      static_cast<long long>(cfg.seq), o.model.experts, o.model.top_k, static_cast<long long>(o.steps),
      static_cast<long long>(o.repeats), static_cast<long long>(o.warmup));
  if (!ctx.glibc_tunables.empty()) std::printf("# GLIBC_TUNABLES=%s\n", ctx.glibc_tunables.c_str());
  std::printf(
      "# peer: sp against the serial dense model, ep on m ranks against the serial MoE with m routing groups "
      "(what it equals).\n"
      "# step: the slowest rank's wall ms. cpu: the busiest rank's thread CPU ms per step (what one device "
      "per rank would take, communication aside). Medians over every step; x peer: the median over rounds of "
      "the round's median over the peer's in that round; ideal 1/n.\n"
      "# act: the largest rank's activation peak. params, optim: live bytes per rank. moved: a rank's payload "
      "bytes per step (collectives whole, sends); formula: README sections 6 and 7, scalars left out.\n"
      "# loss: the last step's (the group's mean); d peer: its difference from the peer's.\n");
  std::printf("%-10s %-11s %2s %8s %6s %8s %6s %8s %6s %8s %8s %8s %8s %8s %8s\n", "model", "detail", "n", "step ms",
              "x peer", "cpu ms", "x peer", "act MiB", "x peer", "params", "optim", "moved", "formula", "loss",
              "d peer");
}

// One row of the table and one JSON line: setup @p i of @p setups, against its peer.
void report_train_setup(const std::vector<train::Setup>& setups, const std::vector<TrainResult>& results, std::size_t i,
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
      (peer >= 0 ? results[static_cast<std::size_t>(peer)].largest(&train::RankNumbers::params_bytes) : params) / e;
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
  std::printf("%-10s %-11s %2d %8.1f %6s %8.1f %6s %8.2f %6s %8.2f %8.2f %8.2f %8.2f %8.4f %8.1e\n", s.name(),
              s.detail().c_str(), s.n, step * 1e3, ratio(x_step).c_str(), cpu * 1e3, ratio(x_cpu).c_str(), mib(act),
              ratio(x_act).c_str(), mib(static_cast<double>(params)),
              mib(static_cast<double>(r.largest(&train::RankNumbers::optimizer_bytes))),
              mib(static_cast<double>(moved)), mib(static_cast<double>(formula)), r.first[0].last_loss, d_loss);
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

int run_train_part(const TrainOptions& o, const RunContext& ctx, FILE* json) {
  const std::vector<train::Setup> setups = train_setups(o);
  std::vector<TrainResult> results(setups.size());
  for (std::int64_t round = 0; round < o.repeats; ++round)
    for (std::size_t i = 0; i < setups.size(); ++i)
      add_round(train::run(o.model, setups[i], o.warmup, o.steps), results[i]);
  print_train_header(o, ctx);
  for (std::size_t i = 0; i < setups.size(); ++i) report_train_setup(setups, results, i, o, ctx, json);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  AttentionOptions attention;
  TierOptions tiers;
  MoeOptions moe;
  TrainOptions training;
  std::string json_path, only, dtype = "f32";
  bool quick = false;
  // What the command line says; applied after --quick's values, so that flags given with it win.
  std::vector<std::int64_t> seqs = attention.seqs,
                            tier_shape = {tiers.dims.B, tiers.dims.T, tiers.dims.H, tiers.dims.D};
  std::vector<int> degrees = attention.degrees;
  std::vector<std::string> methods = {"flash", "ulysses", "ring", "zigzag", "hybrid"};
  int warmup = attention.warmup, repeats = attention.repeats, moe_trials = moe.trials;
  std::int64_t moe_steps = moe.steps, train_steps = training.steps;
  const dtp::TrainConfig& tc = training.model.config;
  std::vector<std::int64_t> train_shape = {tc.model.layers, tc.model.d_model, tc.model.heads, tc.seq, tc.batch};
  std::vector<std::int64_t> train_moe = {training.model.experts, training.model.top_k};
  const std::int64_t kMaxSize = std::int64_t{1} << 20;

  CLI::App app{
      "Chapter 06 measured, in four parts. attention (sp_attention): the reference Ulysses, ring, zigzag "
      "and hybrid attention against single-device flash attention, forward and backward: time, CPU time "
      "of the busiest rank, memory, error. tiers (sp_comm_tiers): what Ulysses and the ring send, on the "
      "alpha-beta clock of NVLink and InfiniBand, against the lesson's formulas. moe (moe_capacity): how "
      "many tokens a mixture of experts drops at each capacity factor, at init and after training, "
      "against a uniform random router. train (sp_ep_train_step): whole training steps of sp and ep "
      "against one device. bench/README.md says what each number is.",
      "dtp-bench-sequence-expert"};
  app.add_option("--only", only,
                 "one part: attention (time and memory), tiers (bytes and the alpha-beta clock), moe, or train (sp "
                 "and ep training steps against one device); default all four")
      ->check(CLI::IsMember({"attention", "tiers", "moe", "train"}));
  dtp::cli::add_list_option(app, "--seqs", seqs, "sequence lengths T, a comma list", "T,...")
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize))
      ->capture_default_str();
  dtp::cli::add_list_option(
      app, "--degrees", degrees,
      "sequence-parallel degrees n, a comma list (the tiers use those >= 2, train those >= 2 with its "
      "own default 2,4)",
      "N,...")
      ->check(dtp::cli::Range(1, 64))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--methods", methods,
                 "which to run, a comma list; flash is the one-rank peer the others are checked against", "METHOD,...")
      ->check(CLI::IsMember({"flash", "ulysses", "ring", "zigzag", "hybrid"}))
      ->capture_default_str();
  app.add_option("--batch", attention.dims.B, "B of q, k, v [B, T/n, H, D]")
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize))
      ->capture_default_str();
  app.add_option("--heads", attention.dims.H, "H of q, k, v")
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize))
      ->capture_default_str();
  app.add_option("--head-dim", attention.dims.D, "D of q, k, v")
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize))
      ->capture_default_str();
  app.add_option("--dtype", dtype, "of q, k, v (and of the trained GPT)")
      ->check(CLI::IsMember({"f32", "f64"}))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "untimed passes (train: steps) per run; default 1")
      ->check(dtp::cli::Range(0, 1000));
  app.add_option("--repeats", repeats, "runs per case, round-robin; default 3, train 6")
      ->check(dtp::cli::Range(1, 1000));
  app.add_option_function<std::string>(
         "--nvlink", [&tiers](const std::string& text) { set_tier(tiers.tiers[0], "--nvlink", text); },
         "the NVLink tier's alpha (us) and bandwidth (GB/s)")
      ->type_name("US,GBPS")
      ->default_str("3,450");
  app.add_option_function<std::string>(
         "--infiniband", [&tiers](const std::string& text) { set_tier(tiers.tiers[1], "--infiniband", text); },
         "the InfiniBand tier's alpha (us) and bandwidth (GB/s)")
      ->type_name("US,GBPS")
      ->default_str("8,50");
  dtp::cli::add_list_option(app, "--tier-shape", tier_shape,
                            "B,T,H,D of the tiers part (default 1,16,32,8192: one q is 16 MiB in f32)", "B,T,H,D")
      ->expected(4)
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize));
  dtp::cli::add_list_option(app, "--moe-experts", moe.experts, "the MoE models' numbers of experts E, a comma list",
                            "E,...")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1024}))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--moe-top-k", moe.top_k, "their experts per token k, a comma list", "K,...")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1024}))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--moe-coefs", moe.coefs,
                            "their load-balancing loss weights aux_loss_coef, a comma list", "C,...")
      ->check(dtp::cli::Range(0.0, 100.0))
      ->capture_default_str();
  app.add_option("--moe-steps", moe_steps, "training steps before the second look at the router")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--moe-trials", moe_trials, "random routings behind the uniform router's load balance")
      ->check(dtp::cli::Range(1, 1000000))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--train-shape", train_shape,
                            "layers, d_model, heads, seq, batch of the trained GPT (default 2,128,8,256,4)",
                            "L,C,H,T,B")
      ->expected(5)
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 16));
  dtp::cli::add_list_option(app, "--train-moe", train_moe, "experts and top_k of its MoE variant, for ep (default 4,2)",
                            "E,K")
      ->expected(2)
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1024}));
  app.add_option("--train-steps", train_steps, "timed optimizer steps per run")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_flag("--quick", quick,
               "a smoke test: T 256,512; n 1,2,4; no warm-up, 1 repeat; tiers at D = 2048 on n 2,4; MoE 20 steps, "
               "50 trials; train 2 steps after 1, n 2,4 (flags given win)");
  app.add_option("--json", json_path, "append one JSON object per measurement to FILE")->type_name("FILE");
  app.footer("Runs on the thread backend on the CPU (DTP_BACKEND=thread, DTP_DEVICE=cpu, the defaults).");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;

  auto given = [&app](const char* flag) { return app.count(flag) > 0; };
  if (quick) {
    attention.seqs = {256, 512};
    attention.degrees = {1, 2, 4};
    attention.warmup = 0;
    attention.repeats = 1;
    tiers.dims.D = 2048;
    tiers.degrees = {2, 4};
    moe.steps = 20;
    moe.trials = 50;
    training.warmup = 1;
    training.steps = 2;
    training.repeats = 1;
  }
  if (given("--seqs")) attention.seqs = seqs;
  if (given("--degrees")) {
    attention.degrees = degrees;
    tiers.degrees.clear();
    training.degrees.clear();
    for (int n : degrees)
      if (n >= 2) tiers.degrees.push_back(n), training.degrees.push_back(n);
  }
  if (given("--methods")) {
    attention.methods.clear();
    for (const std::string& name : methods) attention.methods.push_back(parse_method(name));
  }
  attention.dims.dtype = tiers.dims.dtype = training.model.config.model.dtype = dtp::parse_dtype(dtype);
  if (given("--warmup")) attention.warmup = warmup, training.warmup = warmup;
  if (given("--repeats")) attention.repeats = repeats, training.repeats = repeats;
  if (given("--tier-shape"))
    tiers.dims.B = tier_shape[0], tiers.dims.T = tier_shape[1], tiers.dims.H = tier_shape[2],
    tiers.dims.D = tier_shape[3];
  if (given("--moe-steps")) moe.steps = moe_steps;
  if (given("--moe-trials")) moe.trials = moe_trials;
  if (given("--train-shape")) {
    dtp::TrainConfig& c = training.model.config;
    c.model.layers = static_cast<int>(train_shape[0]), c.model.d_model = static_cast<int>(train_shape[1]);
    c.model.heads = static_cast<int>(train_shape[2]), c.seq = train_shape[3], c.batch = train_shape[4];
  }
  if (given("--train-moe"))
    training.model.experts = static_cast<int>(train_moe[0]), training.model.top_k = static_cast<int>(train_moe[1]);
  if (given("--train-steps")) training.steps = train_steps;
  try {
    if (attention.seqs.empty() || attention.degrees.empty() || attention.methods.empty() || moe.experts.empty() ||
        moe.top_k.empty() || moe.coefs.empty())
      throw std::invalid_argument(
          "--seqs, --degrees, --methods, --moe-experts, --moe-top-k and --moe-coefs need "
          "at least one value");
    // A (E, k) pair with k > E is skipped; a list of only such pairs would measure nothing.
    const std::int64_t most_experts = *std::max_element(moe.experts.begin(), moe.experts.end());
    const std::int64_t fewest_k = *std::min_element(moe.top_k.begin(), moe.top_k.end());
    if ((only.empty() || only == "moe") && fewest_k > most_experts)
      throw std::invalid_argument("every --moe-top-k is above every --moe-experts (k of E experts needs k <= E)");
    if (only.empty() || only == "train") train_setups(training);  // a shape the strategies refuse, named now
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-bench-sequence-expert: error: %s (see --help)\n", e.what());
    return 2;
  }

  const std::optional<RunContext> context = context_from_env("dtp-bench-sequence-expert");
  if (!context) return 2;
  const RunContext& ctx = *context;
  if (ctx.backend != "thread" || ctx.device != "cpu") {
    std::fprintf(stderr,
                 "dtp-bench-sequence-expert: runs on the thread backend on the CPU; got DTP_BACKEND=%s, "
                 "DTP_DEVICE=%s\n",
                 ctx.backend.c_str(), ctx.device.c_str());
    return 2;
  }
  FILE* json = nullptr;
  if (!open_json("dtp-bench-sequence-expert", json_path, json)) return 2;
  int status = 0;
  try {
    if (only.empty() || only == "attention") status = run_attention_part(attention, ctx, json);
    if (status == 0 && (only.empty() || only == "tiers")) status = run_tier_part(tiers, ctx, json);
    if (status == 0 && (only.empty() || only == "moe")) status = run_moe_part(moe, ctx, json);
    if (status == 0 && (only.empty() || only == "train")) status = run_train_part(training, ctx, json);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dtp-bench-sequence-expert: %s\n", error.what());
    status = 1;
  }
  return close_json(json, "dtp-bench-sequence-expert", status);
}
