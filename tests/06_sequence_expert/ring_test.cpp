// Puzzles 6.2 and 6.3: ring attention with contiguous positions. The output
// and the gradients must equal single-device causal attention for n = 1, 2,
// 3, 4, 6 and 8; a length that does not split is refused; the key/value
// blocks make exactly n - 1 transfers forward and the gradients n backward
// (n - 1 with their blocks, one home); and blocks in the causal future are
// skipped, so rank r computes r + 1 blocks.
#include "sp_checks.h"

namespace dtp::testing::ch06 {

namespace {

std::string count_line(int r, const std::string& what, std::int64_t got, std::int64_t expected,
                       const std::string& why) {
  if (got == expected) return "";
  return "rank " + std::to_string(r) + " " + what + ": expected " + std::to_string(expected) +
         ", got " + std::to_string(got) + " (" + why + ")";
}

TEST(Puzzle6_2_ring_forward, EqualsSingleDeviceAttentionForEveryDegree) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 71);
  for (int n : degrees({1, 2, 3, 4, 6, 8})) check_ring(c, n, false, false, nullptr);
}

TEST(Puzzle6_2_ring_forward, MakesNMinusOneTransfersAndSkipsFutureBlocks) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 72);
  for (int n : degrees({2, 4, 8})) {
    check_ring(c, n, false, false,
               [&](Comm& sp, std::int64_t blocks, std::int64_t, const CommStats& s,
                   const CommStats&) -> std::string {
                 const int r = sp.rank();
                 const std::int64_t block_bytes =
                     2 * c.d.numel() / n * 8;  // k and v of one shard, f64
                 for (const std::string& line :
                      {count_line(r, "messages sent in forward", s.messages_sent, n - 1,
                                  "one key/value block to rank r + 1 per step but the last"),
                       count_line(r, "bytes sent in forward", s.bytes_sent, (n - 1) * block_bytes,
                                  "n - 1 blocks of k and v, " + std::to_string(block_bytes) +
                                      " bytes each"),
                       count_line(r, "collective calls", s.total_collective_calls(), 0,
                                  "the ring is point-to-point only"),
                       count_line(r, "blocks computed in forward", blocks, r + 1,
                                  "its queries see the blocks of ranks 0.." + std::to_string(r) +
                                      "; later blocks lie wholly in the causal future: skip them "
                                      "(block_visible)")})
                   if (!line.empty()) return line;
                 return "";
               });
  }
}

TEST(Puzzle6_3_ring_backward, GradientsEqualSingleDeviceAttentionForEveryDegree) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 73);
  for (int n : degrees({1, 2, 3, 4, 6, 8})) check_ring(c, n, false, true, nullptr);
}

TEST(Puzzle6_3_ring_backward, GradientsTravelWithTheirBlocksAndComeHome) {
  const Case c = make_case(Dims{2, 48, 2, 4}, 74);
  for (int n : degrees({1, 2, 4, 8})) {
    check_ring(
        c, n, false, true,
        [&](Comm& sp, std::int64_t, std::int64_t blocks, const CommStats&,
            const CommStats& s) -> std::string {
          const int r = sp.rank();
          const std::int64_t shard_bytes = c.d.numel() / n * 8;
          const std::int64_t messages = n > 1 ? n : 0;
          const std::int64_t bytes = n > 1 ? (n - 1) * 4 * shard_bytes + 2 * shard_bytes : 0;
          for (const std::string& line :
               {count_line(r, "messages sent in backward", s.messages_sent, messages,
                           "n - 1 transfers of (k, v, dk, dv), then (dk, dv) home to their owner"),
                count_line(r, "bytes sent in backward", s.bytes_sent, bytes,
                           std::to_string(n - 1) + " x 4 shards + 2 shards of " +
                               std::to_string(shard_bytes) + " bytes"),
                count_line(r, "blocks computed in backward", blocks, r + 1,
                           "the same visible blocks as the forward")})
            if (!line.empty()) return line;
          return "";
        });
  }
}

}  // namespace
}  // namespace dtp::testing::ch06
