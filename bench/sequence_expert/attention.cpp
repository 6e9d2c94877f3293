// Part 1, "sp_attention" (--only attention): causal attention, forward then
// backward, on q, k, v [B, T/n, H, D] shards of random data, for every T of
// --seqs and degree n of --degrees: UlyssesAttention (n must divide H),
// RingAttention contiguous and zigzag (T must divide by 2n), HybridAttention
// with u = n/2 (two groups; n >= 4). The peer, in the same run:
// ops::flash_attention_forward and _backward on the whole sequence on one rank
// ("flash"); every method's output and gradients are compared with it
// (max_abs_error). Per rank:
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
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "parts.h"

namespace dtp::bench::sequence_expert {
namespace {

using namespace dtp::bench::sp;

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

}  // namespace

int run_attention_part(const AttentionOptions& o, const RunContext& ctx, FILE* json) {
  const Dims& base = o.dims;
  std::printf(
      "# sp attention: %s backend on %s (%d cores), %s, B = %lld, H = %lld, D = %lld; forward + "
      "backward, "
      "median of %d rounds (round-robin) after %d warm-up pass(es)\n",
      ctx.backend.c_str(), ctx.device.c_str(), ctx.cores, dtp::dtype_name(base.dtype),
      static_cast<long long>(base.B), static_cast<long long>(base.H),
      static_cast<long long>(base.D), o.repeats, o.warmup);
  if (!ctx.glibc_tunables.empty()) std::printf("# GLIBC_TUNABLES=%s\n", ctx.glibc_tunables.c_str());
  std::printf(
      "# fwd, bwd: the slowest rank's wall ms. cpu max: the busiest rank's thread CPU ms (fwd + "
      "bwd); "
      "predicted: the peer's cpu x the busiest rank's share of the causal scores.\n"
      "# peak: the rank's tracker peak, input shards included (largest over ranks). saved: kept "
      "from forward "
      "to backward | formula (4 B (T/n) H D + 2 B H (T/n)) e.\n");
  std::printf("%6s %-16s %9s %9s %9s %9s %9s %9s %6s %9s %9s %9s %8s %9s\n", "T", "method",
              "fwd ms", "bwd ms", "cpu max", "predicted", "cpu sum", "x flash", "blocks",
              "peak MiB", "saved MiB", "formula", "comm MiB", "max err");
  for (std::int64_t T : o.seqs) {
    Dims d = base;
    d.T = T;
    Problem problem = make_problem(d, 1000 + static_cast<std::uint64_t>(T));
    std::vector<Case> cases;
    for (const Case& c : cases_for(o)) {
      if (const std::string why = cannot_run(c, d); !why.empty()) {
        if (c.method != Method::hybrid || c.n >= 4)  // the hybrid starts at n = 4 by design
          std::printf("# T = %lld: skipped %s (%s)\n", static_cast<long long>(T), c.label().c_str(),
                      why.c_str());
        continue;
      }
      cases.push_back(c);
    }
    // The peer first: its results are the reference the others are checked against.
    std::stable_partition(cases.begin(), cases.end(),
                          [](const Case& c) { return c.method == Method::flash; });
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
      const double comm_peak =
          slowest(ranks, [](const RankNumbers& r) { return r.comm_peak_bytes; });
      const double error =
          std::isnan(ranks[0].max_abs_error)
              ? NAN
              : slowest(ranks, [](const RankNumbers& r) { return r.max_abs_error; });
      const std::int64_t formula = formula_saved_bytes(d, c.n);
      std::printf(
          "%6lld %-16s %9.1f %9.1f %9.1f %9.1f %9.1f %9.2f %6lld %9.2f %9.2f %9.2f %8.2f %9.1e\n",
          static_cast<long long>(T), c.label().c_str(), median(fwd) * 1e3, median(bwd) * 1e3,
          cpu_max * 1e3, predicted * 1e3, cpu_sum * 1e3, cpu_sum / flash_cpu,
          static_cast<long long>(slowest(ranks, [](const RankNumbers& r) { return r.blocks; })),
          mib(peak), mib(saved_max), mib(static_cast<double>(formula)), mib(comm_peak), error);
      JsonLine line;
      line.add("what", "sp_attention")
          .add("method", method_name(c.method))
          .add("layout", dtp::ch06::sequence_layout_name(c.layout()))
          .add("sp", c.n)
          .add("ulysses_size",
               c.method == Method::hybrid ? c.u : (c.method == Method::ulysses ? c.n : 1))
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
               "MemoryTracker of each rank: peak = total_peak() over forward + backward, input "
               "shards q, k, v, dout "
               "included; saved = live after forward - live before - returned output (the peer: + "
               "q, k, v and its "
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

}  // namespace dtp::bench::sequence_expert
