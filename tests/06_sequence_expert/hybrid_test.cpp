// Puzzle 6.5: the 2-D hybrid. Ulysses inside groups of u consecutive ranks,
// ring attention across the n / u groups: the output and gradients must
// equal single-device causal attention for several (n, u); inside a group
// Ulysses's four all-to-alls each way, across groups the ring's n / u - 1
// transfers; a group size that does not divide n is refused.
#include "sp_checks.h"

namespace dtp::testing::ch06 {
namespace {

struct Shape2d {
  int n, u;
};

std::vector<Shape2d> hybrid_shapes() {
  std::vector<Shape2d> out;
  for (Shape2d s : {Shape2d{1, 1},
                    {2, 2},
                    {2, 1},
                    {3, 3},
                    {4, 1},
                    {4, 2},
                    {4, 4},
                    {6, 2},
                    {6, 3},
                    {8, 2},
                    {8, 4}})
    if (world_fits(s.n)) out.push_back(s);
  return out;
}

TEST(Puzzle6_5_hybrid, ForwardAndGradientsEqualSingleDeviceAttention) {
  const Case c = make_case(Dims{2, 24, 12, 2}, 91);
  for (const Shape2d& s : hybrid_shapes()) {
    run_and_report(
        "hybrid attention, u = " + std::to_string(s.u), s.n, [&](Comm& sp) -> std::string {
          const int r = sp.rank();
          HybridAttention attention(sp, s.u, static_cast<int>(c.d.H));
          const Tensor out = attention.forward(shard_tensor(c.q, c.d, s.n, r, false, sp.device()),
                                               shard_tensor(c.k, c.d, s.n, r, false, sp.device()),
                                               shard_tensor(c.v, c.d, s.n, r, false, sp.device()));
          Tensor dq, dk, dv;
          attention.backward(shard_tensor(c.dout, c.d, s.n, r, false, sp.device()), dq, dk, dv);
          return compare_attention(c, s.n, r, false, out, dq, dk, dv);
        });
  }
}

TEST(Puzzle6_5_hybrid, AllToAllsInsideTheGroupAndRingTransfersAcrossGroups) {
  if (world_fits(4)) {
    const std::string refusal =
        error_of([] { run_ranks(4, [](Comm& sp) { HybridAttention(sp, 3, 12); }); });
    EXPECT_NE(refusal.find("u = 3 must divide the n = 4 ranks"), std::string::npos) << refusal;
    const std::string heads =
        error_of([] { run_ranks(4, [](Comm& sp) { HybridAttention(sp, 2, 3); }); });
    EXPECT_NE(heads.find("H = 3 heads do not split over a Ulysses group of u = 2"),
              std::string::npos)
        << heads;
  }
  const Case c = make_case(Dims{2, 24, 12, 2}, 92);
  for (const Shape2d& s : hybrid_shapes()) {
    if (s.n == 1) continue;
    run_and_report(
        "hybrid communication, u = " + std::to_string(s.u), s.n, [&](Comm& sp) -> std::string {
          const int r = sp.rank(), groups = s.n / s.u;
          HybridAttention attention(sp, s.u, static_cast<int>(c.d.H));
          attention.inner().reset_stats();
          attention.outer().reset_stats();
          attention.forward(shard_tensor(c.q, c.d, s.n, r, false, sp.device()),
                            shard_tensor(c.k, c.d, s.n, r, false, sp.device()),
                            shard_tensor(c.v, c.d, s.n, r, false, sp.device()));
          const CommStats inner = attention.inner().stats(), outer = attention.outer().stats();
          const auto a2a = inner.collective_calls.count("all_to_all")
                               ? inner.collective_calls.at("all_to_all")
                               : 0;
          if (a2a != 4 || inner.messages_sent != 0)
            return "rank " + std::to_string(r) + " made " + std::to_string(a2a) +
                   " all_to_all(s) and sent " + std::to_string(inner.messages_sent) +
                   " message(s) inside its group of " + std::to_string(s.u) +
                   " in forward; expected 4 all_to_alls (q, k, v to heads; the output back) and no "
                   "messages";
          if (outer.messages_sent != groups - 1 || outer.total_collective_calls() != 0)
            return "rank " + std::to_string(r) + " sent " + std::to_string(outer.messages_sent) +
                   " message(s) and made " + std::to_string(outer.total_collective_calls()) +
                   " collective(s) across the " + std::to_string(groups) +
                   " groups in forward; expected the ring's " + std::to_string(groups - 1) +
                   " transfers and no collectives";
          return "";
        });
  }
}

}  // namespace
}  // namespace dtp::testing::ch06
