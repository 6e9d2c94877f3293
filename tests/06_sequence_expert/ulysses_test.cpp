// Puzzle 6.1: Ulysses. The two all-to-all halves must put every element
// where the layout says (checked with values that encode their own index,
// so a wrong one is named by where it came from); attention and its
// gradients must equal single-device causal attention for n = 1..4; and the
// communication is exactly four all-to-alls each way, of the dtype's bytes.
#include "sp_checks.h"

namespace dtp::testing::ch06 {
namespace {

// x[b, t, h, c] = 1 + its flat index: a value names its own place. The
// values are integers up to 576, exact in f32 as in f64, so placements are
// compared exactly in both dtypes.
Tensor index_pattern(const Dims& d) {
  std::vector<double> values(static_cast<std::size_t>(d.numel()));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 1.0 + static_cast<double>(i);
  return Tensor::from_values(values, DType::f64).view({d.B, d.T, d.H, d.D});
}

std::string place_of(double value, const Dims& d) {
  const auto i = static_cast<std::int64_t>(value) - 1;
  if (value != std::floor(value) || i < 0 || i >= d.numel())
    return number(value) + " (no element of the input)";
  return "batch row " + std::to_string(i / (d.T * d.row())) + ", position " +
         std::to_string(i / d.row() % d.T) + ", head " + std::to_string(i % d.row() / d.D) +
         ", channel " + std::to_string(i % d.D);
}

// The head shard rank r should get from sequence_to_heads: every position, heads r H/n ...
std::vector<double> head_shard(const Dims& d, int n, int r) {
  std::vector<double> out;
  const std::int64_t Hl = d.H / n;
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t t = 0; t < d.T; ++t)
      for (std::int64_t h = r * Hl; h < (r + 1) * Hl; ++h)
        for (std::int64_t c = 0; c < d.D; ++c)
          out.push_back(1.0 + static_cast<double>(((b * d.T + t) * d.H + h) * d.D + c));
  return out;
}

// "" or the first misplaced element, named by where it should have come from and where it did.
std::string check_placement(const std::string& what, int r, const Dims& d,
                            const std::vector<double>& expected, const Tensor& got_tensor,
                            const std::string& shape) {
  if (!got_tensor.defined() || got_tensor.numel() != static_cast<std::int64_t>(expected.size()))
    return "rank " + std::to_string(r) + "'s " + what + " must be " + shape + " (" +
           std::to_string(expected.size()) + " elements), got " +
           (got_tensor.defined() ? got_tensor.describe() : std::string("an undefined tensor"));
  const std::vector<double> got = got_tensor.to_vector();
  std::int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != expected[i] && wrong++ == 0) first = static_cast<std::int64_t>(i);
  if (wrong == 0) return "";
  return "rank " + std::to_string(r) + "'s " + what + " (" + shape + ") has " +
         std::to_string(wrong) + " of " + std::to_string(got.size()) +
         " elements in the wrong place; element " + std::to_string(first) +
         " should be the input's " + place_of(expected[first], d) + ", got the input's " +
         place_of(got[first], d);
}

TEST(Puzzle6_1_ulysses, SequenceToHeadsAndBackPutEveryElementWhereTheLayoutSays) {
  const Dims d{2, 12, 12, 2};
  const Tensor whole = index_pattern(d);
  for (int n : degrees({1, 2, 3, 4})) {
    run_and_report("sequence_to_heads / heads_to_sequence", n, [&](Comm& sp) -> std::string {
      const int r = sp.rank();
      const Tensor mine = shard_tensor(whole, d, n, r, false, sp.device());
      const std::string heads_shape =
          "[B, T, H/n, D] = [2, 12, " + std::to_string(d.H / n) + ", 2]";
      std::string failure = check_placement("sequence_to_heads output", r, d, head_shard(d, n, r),
                                            sequence_to_heads(sp, mine), heads_shape);
      if (!failure.empty()) return failure;
      // heads_to_sequence on its own: from the right head shard back to my positions.
      const Tensor heads =
          Tensor::from_values(head_shard(d, n, r), checker_dtype(sp.device()), sp.device())
              .view({d.B, d.T, d.H / n, d.D});
      return check_placement("heads_to_sequence output", r, d, mine.to_vector(),
                             heads_to_sequence(sp, heads),
                             "[B, T/n, H, D] = [2, " + std::to_string(d.T / n) + ", 12, 2]");
    });
  }
}

// 6.1a promises a dtp::Error when H does not divide by n. Without the check
// a view or a permute fails later with a shape that names no heads, or the
// heads are silently cut to H / n rounded down.
TEST(Puzzle6_1_ulysses, SequenceToHeadsRefusesHeadsThatDoNotSplitNamingBoth) {
  const int n = world_fits(4) ? 4 : 2, heads = n == 4 ? 6 : 3;
  const std::string error = error_of([&] {
    run_ranks(n, [&](Comm& sp) {
      sequence_to_heads(sp,
                        Tensor::zeros({1, 2, heads, 2}, checker_dtype(sp.device()), sp.device()));
    });
  });
  const bool names_both = error.find("head") != std::string::npos &&
                          error.find(std::to_string(heads)) != std::string::npos &&
                          error.find(std::to_string(n)) != std::string::npos;
  EXPECT_TRUE(names_both) << "sequence_to_heads of H = " << heads << " heads over n = " << n
                          << " ranks must throw a dtp::Error that says 'heads' and names " << heads
                          << " and " << n << " (H % n != 0: the heads do not split "
                          << "into equal groups); got: " << error;
}

TEST(Puzzle6_1_ulysses, AttentionAndItsGradientsEqualSingleDeviceAttention) {
  if (world_fits(4)) {
    const std::string refusal =
        error_of([] { run_ranks(4, [](Comm& sp) { UlyssesAttention(sp, 6); }); });
    EXPECT_NE(refusal.find("H = 6 heads do not split over n = 4 ranks"), std::string::npos)
        << refusal;
  }
  const Case c = make_case(Dims{2, 24, 12, 2}, 61);
  for (int n : degrees({1, 2, 3, 4})) {
    run_and_report("Ulysses attention", n, [&](Comm& sp) -> std::string {
      const int r = sp.rank();
      UlyssesAttention attention(sp, static_cast<int>(c.d.H));
      const Tensor out = attention.forward(shard_tensor(c.q, c.d, n, r, false, sp.device()),
                                           shard_tensor(c.k, c.d, n, r, false, sp.device()),
                                           shard_tensor(c.v, c.d, n, r, false, sp.device()));
      Tensor dq, dk, dv;
      attention.backward(shard_tensor(c.dout, c.d, n, r, false, sp.device()), dq, dk, dv);
      return compare_attention(c, n, r, false, out, dq, dk, dv);
    });
  }
}

TEST(Puzzle6_1_ulysses, FourAllToAllsForwardAndFourBackwardAndNothingElse) {
  const Case c = make_case(Dims{2, 24, 12, 2}, 62);
  for (int n : degrees({2, 4})) {
    run_and_report("Ulysses communication", n, [&](Comm& sp) -> std::string {
      const int r = sp.rank();
      UlyssesAttention attention(sp, static_cast<int>(c.d.H));
      const std::int64_t bytes = c.d.numel() / n * element_bytes(sp);  // one local [B, T/n, H, D]
      auto check = [&](const std::string& pass, std::int64_t calls,
                       const std::string& which) -> std::string {
        const CommStats s = sp.stats();
        const auto it = s.collective_calls.find("all_to_all");
        const std::int64_t a2a = it == s.collective_calls.end() ? 0 : it->second;
        if (a2a != calls || s.total_collective_calls() != calls)
          return "rank " + std::to_string(r) + " after the " + pass + " made " +
                 std::to_string(a2a) + " all_to_all call(s) and " +
                 std::to_string(s.total_collective_calls() - a2a) +
                 " other collective(s); expected exactly " + std::to_string(calls) +
                 " all_to_alls (" + which + ")";
        if (s.collective_bytes != calls * bytes)
          return "rank " + std::to_string(r) + " after the " + pass + " moved " +
                 std::to_string(s.collective_bytes) + " bytes in collectives; expected " +
                 std::to_string(calls) + " x " + std::to_string(bytes) +
                 " (each all_to_all carries one local [B, T/n, H, D] tensor)";
        if (s.messages_sent != 0)
          return "rank " + std::to_string(r) + " sent " + std::to_string(s.messages_sent) +
                 " point-to-point message(s); Ulysses needs only the all_to_alls";
        return "";
      };
      sp.reset_stats();
      attention.forward(shard_tensor(c.q, c.d, n, r, false, sp.device()),
                        shard_tensor(c.k, c.d, n, r, false, sp.device()),
                        shard_tensor(c.v, c.d, n, r, false, sp.device()));
      std::string failure = check("forward", 4, "q, k and v to heads, the output back");
      if (!failure.empty()) return failure;
      Tensor dq, dk, dv;
      attention.backward(shard_tensor(c.dout, c.d, n, r, false, sp.device()), dq, dk, dv);
      return check("forward and backward", 8, "4 forward; dout to heads, dq, dk and dv back");
    });
  }
}

}  // namespace
}  // namespace dtp::testing::ch06
