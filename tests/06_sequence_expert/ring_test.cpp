// Puzzles 6.2 and 6.3: ring attention with contiguous positions. The output
// and the gradients must equal single-device causal attention for n = 1, 2,
// 3, 4, 6 and 8; a length that does not split is refused; the key/value
// blocks make exactly n - 1 transfers forward and the gradients n backward
// (n - 1 with their blocks, one home); and blocks in the causal future are
// skipped, so rank r computes r + 1 blocks. The trace shows each transfer
// posted before the block in hand is computed and waited on after it.
#include <algorithm>

#include "dtp/trace.h"
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
  // attend_block (provided) refuses a block wholly in the queries' future, naming both ranges.
  const std::string future = error_of([] {
    run_ranks(1, [](Comm& clock) {
      const Tensor x = Tensor::zeros({1, 4, 1, 2}, checker_dtype(clock.device()), clock.device());
      PartialAttention partial = empty_partial(x);
      attend_block(clock, x, PositionRange{0, 4}, x, x, PositionRange{8, 4}, partial);
    });
  });
  EXPECT_NE(future.find("positions [0, 4) can see a key at [8, 12)"), std::string::npos) << future;
  const Case c = make_case(Dims{2, 48, 2, 4}, 72);
  for (int n : degrees({2, 4, 8})) {
    check_ring(c, n, false, false,
               [&](Comm& sp, std::int64_t blocks, std::int64_t, const CommStats& s,
                   const CommStats&) -> std::string {
                 const int r = sp.rank();
                 // k and v of one shard, of the checker's dtype.
                 const std::int64_t block_bytes = 2 * c.d.numel() / n * element_bytes(sp);
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

// Overlap, read exactly from the order of events on each rank's own thread
// (trace lane 0), not from timings. At every step s but the last, the
// transfer of the next block is posted (isend) before the block in hand,
// rank (r - s) mod n's, is computed (attend_block), and nothing is waited on
// (wait, or a blocking recv) until that compute is done. A ring that waits
// for the next block first, or sends only after computing, has nothing
// travelling while it computes. Every rank computes its own block at step 0,
// so the overlap must show there at least.
std::string check_overlap(const std::vector<trace::Span>& spans, int n, int r) {
  std::vector<trace::Span> lane;
  for (const trace::Span& s : spans)
    if (s.rank == r && s.lane == 0) lane.push_back(s);
  // Stable: spans that start in the same microsecond keep the order they ended in.
  std::stable_sort(lane.begin(), lane.end(), [](const trace::Span& a, const trace::Span& b) {
    return a.start_us < b.start_us;
  });
  // With contiguous positions rank r computes one block at each step 0..r (the causal skip).
  const std::string who = "rank " + std::to_string(r) + " of " + std::to_string(n);
  int posts = 0, waits_since_post = 0, computed = 0, overlapped = 0;
  std::string waited;
  for (const trace::Span& s : lane) {
    if (s.name == "isend" || s.name == "send") {
      ++posts;
      waits_since_post = 0;
      waited.clear();
    } else if (s.name == "wait" || s.name == "recv") {
      if (waits_since_post++ == 0) waited = s.name;
    } else if (s.name == "attend_block") {
      const int step = computed++;
      if (step >= n - 1) continue;  // the last step has no transfer to overlap
      const std::string where = who + ", step " + std::to_string(step) + " (computing rank " +
                                std::to_string(((r - step) % n + n) % n) + "'s block): ";
      if (posts < step + 1)
        return where + "computed before posting the transfer of the next block (" +
               std::to_string(posts) + " transfer(s) posted, expected " + std::to_string(step + 1) +
               "): post irecv from r - 1 and isend to r + 1 first, so the next block travels "
               "while this one computes";
      if (waits_since_post > 0)
        return where + "a '" + waited +
               "' for the next key/value block came before computing on the current one, so the "
               "transfer never overlapped the compute: post irecv and isend, attend_block, then "
               "wait";
      ++overlapped;
    }
  }
  if (overlapped == 0)
    return who + ": no step computed a block while a transfer was in flight (" +
           std::to_string(computed) + " attend_block span(s), " + std::to_string(posts) +
           " transfer(s) posted)";
  return "";
}

TEST(Puzzle6_2_ring_forward, TheNextTransferIsPostedBeforeComputingAndWaitedAfter) {
  if (World::from_env(2).backend != Backend::thread)
    GTEST_SKIP() << "the trace lanes are the thread backend's; the thread flavour checks this";
  const Case c = make_case(Dims{2, 48, 2, 4}, 75);
  for (int n : {3, 4}) {
    trace::enable();
    check_ring(c, n, false, false, nullptr);
    trace::disable();
    if (HasFailure()) return;
    const std::vector<trace::Span> spans = trace::spans();
    for (int r = 0; r < n; ++r) {
      const std::string failure = check_overlap(spans, n, r);
      ASSERT_TRUE(failure.empty())
          << failure << "\n    [contiguous ring attention, forward, on " << n << " ranks]";
    }
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
          const std::int64_t shard_bytes = c.d.numel() / n * element_bytes(sp);
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
