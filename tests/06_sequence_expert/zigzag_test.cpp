// Puzzle 6.4: zigzag ring attention. Rank r holds chunks r and 2n - 1 - r of
// 2n; the output and gradients must equal single-device causal attention for
// n = 1, 2, 3, 4, 6 and 8, a length that does not split into 2n chunks is
// refused, and every rank computes the same number of blocks: 2n + 1
// half-size blocks each way, where contiguous positions give rank r r + 1.
#include "sp_checks.h"

namespace dtp::testing::ch06 {

namespace {

TEST(Puzzle6_4_zigzag, ForwardAndGradientsEqualSingleDeviceAttention) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 81);
  for (int n : degrees({1, 2, 3, 4, 6, 8})) check_ring(c, n, true, true, nullptr);
  check_refusal(4, 9, true, "T = 36 does not split into 2 x 4 = 8 zigzag chunks");
}

TEST(Puzzle6_4_zigzag, EveryRankComputesTheSameNumberOfBlocks) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 82);
  for (int n : degrees({2, 3, 4, 8})) {
    check_ring(c, n, true, true,
               [&](Comm& sp, std::int64_t forward, std::int64_t backward, const CommStats& s,
                   const CommStats&) -> std::string {
                 const int r = sp.rank();
                 const std::int64_t expected = 2 * n + 1;
                 const std::string why =
                     " (its chunks " + std::to_string(r) + " and " + std::to_string(2 * n - 1 - r) +
                     " see " + std::to_string(r + 1) + " and " + std::to_string(2 * n - r) +
                     " chunks of keys: every (query chunk, key chunk) pair with some visible key "
                     "is one block)";
                 if (forward != expected)
                   return "rank " + std::to_string(r) + " computed " + std::to_string(forward) +
                          " blocks in forward, expected " + std::to_string(expected) + why;
                 if (backward != expected)
                   return "rank " + std::to_string(r) + " computed " + std::to_string(backward) +
                          " blocks in backward, expected " + std::to_string(expected) + why;
                 if (s.messages_sent != n - 1)
                   return "rank " + std::to_string(r) + " sent " + std::to_string(s.messages_sent) +
                          " messages in forward, expected n - 1 = " + std::to_string(n - 1) +
                          " (zigzag changes what a block holds, not how it travels)";
                 return "";
               });
  }
}

}  // namespace
}  // namespace dtp::testing::ch06
