// Part 2, "sp_comm_tiers" (--only tiers): the same references on a shape chosen
// for its bytes (--tier-shape B,T,H,D; the default 1,16,32,8192 in f32 makes
// one whole q 16 MiB, 1/64 of the lesson's 1 GiB: the bytes of T = 2048
// positions at the lesson's H = 32, D = 128 in bf16, but with so few positions
// that the CPU's attention is negligible), n = 2, 4, 8, World::cost set to each
// tier. attend_block charges 1 clock unit per block whatever its size, so this
// part measures the clock in femtoseconds: alpha and beta are given in fs, and
// the compute charges (at most 3 (2n + 1) units per rank) add less than 1e-7 of
// the smallest clock here. The clock so counts communication only, every
// transfer in sequence: what the lesson's section 6 calls "if nothing is
// hidden". Peers: section 6's formulas. Bytes per rank come from CommStats:
// bytes_sent of the ring's messages, collective_bytes of the all-to-alls (each
// call's whole buffer, of which (g - 1)/g leaves the rank).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "parts.h"

namespace dtp::bench::sequence_expert {

using namespace dtp::bench::sp;

int run_tier_part(const TierOptions& o, const RunContext& ctx, FILE* json) {
  const Dims& d = o.dims;
  const double whole = static_cast<double>(d.numel() * d.e());
  std::printf(
      "# sp comm tiers: forward + backward of the reference on B = %lld, T = %lld, H = %lld, D = "
      "%lld, %s "
      "(one whole q: %.1f MiB); the clock in fs, communication only, nothing hidden\n",
      static_cast<long long>(d.B), static_cast<long long>(d.T), static_cast<long long>(d.H),
      static_cast<long long>(d.D), dtp::dtype_name(d.dtype), mib(whole));
  for (const Tier& t : o.tiers)
    std::printf("# %s: alpha %g us, %g GB/s\n", t.name.c_str(), t.alpha_s * 1e6,
                t.bandwidth_Bps / 1e9);
  std::printf(
      "# sent MiB: off-rank bytes per rank, forward + backward (ring messages + (g-1)/g of each "
      "all-to-all); "
      "formula: section 6. clock: the slowest rank's, us.\n");
  std::printf("%-11s %-14s %2s %9s %9s %9s %11s %11s %11s %11s\n", "tier", "method", "n", "S MiB",
              "sent MiB", "formula", "fwd us", "formula", "fwd+bwd us", "formula");
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
          return forward ? r.p2p_forward + share * r.a2a_forward
                         : r.p2p_backward + share * r.a2a_backward;
        };
        double fwd_clock = 0, total_clock = 0, sent_max = 0;
        for (const CommNumbers& r : ranks) {
          fwd_clock = std::max(fwd_clock, r.clock_forward * kClockUnit);
          total_clock = std::max(total_clock, r.clock_total * kClockUnit);
          sent_max = std::max(sent_max, sent(r, true) + sent(r, false));
        }
        std::printf("%-11s %-14s %2d %9.2f %9.2f %9.2f %11.1f %11.1f %11.1f %11.1f\n",
                    tier.name.c_str(), c.label().c_str(), n, mib(S), mib(sent_max),
                    mib(f.forward_bytes + f.backward_bytes), fwd_clock * 1e6, f.forward_s * 1e6,
                    total_clock * 1e6, (f.forward_s + f.backward_s) * 1e6);
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
                 "communication only: clock unit 1 fs, so attend_block's 1 or 2 units per block "
                 "add < 1e-7; a "
                 "send is charged when posted, so nothing overlaps");
        add_context(line, ctx);
        write_line(json, line);
      }
  std::printf("\n");
  return 0;
}

}  // namespace dtp::bench::sequence_expert
