// Puzzle 6.4: zigzag ring attention. Rank r holds chunks r and 2n - 1 - r of
// 2n; the output and gradients must equal single-device causal attention for
// n = 1, 2, 3, 4, 6 and 8, a length that does not split into 2n chunks is
// refused, and every rank computes the same number of blocks: 2n + 1
// half-size blocks each way, where contiguous positions give rank r r + 1.
// The forward checkers need only 6.2's forward; the gradient checkers also
// 6.3's backward.
#include "sp_checks.h"

namespace dtp::testing::ch06 {

namespace {

TEST(Puzzle6_4_zigzag, ForwardEqualsSingleDeviceAttention) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 81);
  for (int n : degrees({1, 2, 3, 4, 6, 8})) check_ring(c, n, true, false, nullptr);
  check_refusal(4, 9, true, "T = 36 does not split into 2 x 4 = 8 zigzag chunks");
}

TEST(Puzzle6_4_zigzag, GradientsEqualSingleDeviceAttention) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 81);
  for (int n : degrees({1, 2, 3, 4, 6, 8})) check_ring(c, n, true, true, nullptr);
}

// Rank r's chunks r and 2n - 1 - r see r + 1 and 2n - r chunks of keys:
// every (query chunk, key chunk) pair with some visible key is one block.
std::string blocks_line(int r, int n, const std::string& pass, std::int64_t blocks) {
  const std::int64_t expected = 2 * n + 1;
  if (blocks == expected) return "";
  return "rank " + std::to_string(r) + " computed " + std::to_string(blocks) + " blocks in " +
         pass + ", expected " + std::to_string(expected) + " (its chunks " + std::to_string(r) +
         " and " + std::to_string(2 * n - 1 - r) + " see " + std::to_string(r + 1) + " and " +
         std::to_string(2 * n - r) +
         " chunks of keys: every (query chunk, key chunk) pair with some visible key is one "
         "block)";
}

TEST(Puzzle6_4_zigzag, EveryRankComputesTheSameNumberOfBlocksForward) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 82);
  for (int n : degrees({2, 3, 4, 8})) {
    check_ring(c, n, true, false,
               [&](Comm& sp, std::int64_t forward, std::int64_t, const CommStats& s,
                   const CommStats&) -> std::string {
                 const int r = sp.rank();
                 const std::string blocks = blocks_line(r, n, "forward", forward);
                 if (!blocks.empty()) return blocks;
                 if (s.messages_sent != n - 1)
                   return "rank " + std::to_string(r) + " sent " + std::to_string(s.messages_sent) +
                          " messages in forward, expected n - 1 = " + std::to_string(n - 1) +
                          " (zigzag changes what a block holds, not how it travels)";
                 return "";
               });
  }
}

TEST(Puzzle6_4_zigzag, EveryRankComputesTheSameNumberOfBlocksBackward) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 82);
  for (int n : degrees({2, 3, 4, 8})) {
    check_ring(c, n, true, true,
               [&](Comm& sp, std::int64_t, std::int64_t backward, const CommStats&,
                   const CommStats&) -> std::string {
                 return blocks_line(sp.rank(), n, "backward", backward);
               });
  }
}

}  // namespace
}  // namespace dtp::testing::ch06
