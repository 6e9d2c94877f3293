// Non-blocking all-gather and reduce-scatter (what ZeRO and FSDP prefetch
// with): results on uneven layouts, real asynchrony, statistics and clocks
// equal to the blocking calls, the trace lane, and a long interleaving with
// blocking collectives (run it under TSan too).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/comm_test_helpers.h"
#include "support/harness.h"

namespace dtp {
namespace {

using Results = std::vector<std::vector<double>>;

// Chunk r of @p values under chunk_range.
std::vector<double> chunk_of(const std::vector<double>& values, int parts, int r) {
  ChunkRange range = chunk_range(static_cast<std::int64_t>(values.size()), parts, r);
  return {values.begin() + range.offset, values.begin() + range.offset + range.length};
}

TEST(AsyncShardedCollectives, ResultsMatchTheLayoutOnEveryWorldAndLength) {
  for (int n : testing::all_world_sizes()) {
    // 3 < 8: a full smaller than the world leaves trailing ranks empty shards.
    for (std::int64_t len : {std::int64_t{1}, std::int64_t{3}, std::int64_t{n}, std::int64_t{23},
                             std::int64_t{1000}}) {
      SCOPED_TRACE("world " + std::to_string(n) + ", " + std::to_string(len) + " elements");
      Results gathered(n), reduced(n), maxed(n), shard_after(n), full_after(n);
      testing::run_ranks(n, [&](Comm& comm) {
        const int r = comm.rank();
        ChunkRange mine = chunk_range(len, n, r);
        // Rank r's shard is chunk r of a pattern every rank knows (rank 0's).
        Tensor shard = testing::pattern_tensor(0, len).slice(mine.offset, mine.length).clone();
        Tensor full = Tensor::zeros({len}, DType::f64);
        Tensor contribution = testing::pattern_tensor(r, len);
        Tensor summed = Tensor::zeros({mine.length}, DType::f64);
        Tensor f32_in = testing::pattern_tensor(r, len, DType::f32);
        Tensor f32_max = Tensor::zeros({mine.length}, DType::f32);
        Request g = comm.iall_gather(shard, full);
        Request s = comm.ireduce_scatter(contribution, summed);
        Request m = comm.ireduce_scatter(f32_in, f32_max, ReduceOp::max);
        m.wait();  // out of order: they still run in call order
        g.wait();
        s.wait();
        gathered[r] = full.to_vector();
        reduced[r] = summed.to_vector();
        maxed[r] = f32_max.to_vector();
        shard_after[r] = shard.to_vector();
        full_after[r] = contribution.to_vector();
      });
      const std::vector<double> sum = testing::pattern_sum(n, len);
      const std::vector<double> last = testing::pattern_values(n - 1, len, DType::f32);
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(testing::values_equal("iall_gather", r, testing::pattern_values(0, len),
                                          gathered[r], n));
        EXPECT_TRUE(
            testing::values_equal("ireduce_scatter sum", r, chunk_of(sum, n, r), reduced[r]));
        EXPECT_TRUE(
            testing::values_equal("ireduce_scatter max (f32)", r, chunk_of(last, n, r), maxed[r]));
        // Inputs are read, never written.
        EXPECT_TRUE(testing::values_equal("iall_gather's shard afterwards", r,
                                          chunk_of(testing::pattern_values(0, len), n, r),
                                          shard_after[r]));
        EXPECT_TRUE(testing::values_equal("ireduce_scatter's full afterwards", r,
                                          testing::pattern_values(r, len), full_after[r]));
      }
    }
  }
}

TEST(AsyncShardedCollectives, TheRankKeepsWorkingWhileTheyWait) {
  // Rank 0 starts both, then sends the message rank 1 waits for before it
  // joins them. Were either blocking, rank 0 would never send: a deadlock.
  testing::run_ranks(2, [](Comm& comm) {
    const int r = comm.rank();
    Tensor shard = Tensor::full({4}, r + 1.0, DType::f64), full = Tensor::zeros({8}, DType::f64);
    Tensor grads = Tensor::full({8}, r + 1.0, DType::f64), mine = Tensor::zeros({4}, DType::f64);
    Tensor note = Tensor::zeros({1}, DType::f64);
    if (r == 0) {
      Request g = comm.iall_gather(shard, full);
      Request s = comm.ireduce_scatter(grads, mine);
      comm.send(note, 1);
      g.wait();
      s.wait();
    } else {
      comm.recv(note, 0);
      comm.all_gather(shard, full);
      comm.reduce_scatter(grads, mine);
    }
    EXPECT_EQ(full.item(0), 1.0);
    EXPECT_EQ(full.item(7), 2.0);
    EXPECT_EQ(mine.item(3), 3.0);
  });
}

// What a rank's Comm counted for one all_gather and one reduce_scatter.
struct Counted {
  std::map<std::string, std::int64_t> calls;
  std::int64_t bytes = 0;
  double clock = 0;
};

TEST(AsyncShardedCollectives, CountAndCostExactlyLikeTheBlockingCalls) {
  const CostModel cost{1.0, 1e-3};
  for (int n : {1, 3, 4}) {
    std::vector<Counted> blocking(n), nonblocking(n);
    testing::run_ranks(
        n,
        [&](Comm& comm) {
          const int r = comm.rank();
          const std::int64_t len = 1001;
          Tensor shard = Tensor::zeros({chunk_range(len, n, r).length}, DType::f32);
          Tensor full = Tensor::zeros({len}, DType::f32);
          comm.all_gather(shard, full);
          comm.reduce_scatter(full, shard);
          CommStats stats = comm.stats();
          blocking[r] = {stats.collective_calls, stats.collective_bytes, stats.clock};
          comm.reset_stats();
          comm.iall_gather(shard, full).wait();
          comm.ireduce_scatter(full, shard).wait();
          stats = comm.stats();
          nonblocking[r] = {stats.collective_calls, stats.collective_bytes, stats.clock};
        },
        cost);
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("world " + std::to_string(n) + ", rank " + std::to_string(r));
      EXPECT_EQ(nonblocking[r].calls, blocking[r].calls);
      EXPECT_EQ(nonblocking[r].calls.at("all_gather"), 1);
      EXPECT_EQ(nonblocking[r].calls.at("reduce_scatter"), 1);
      EXPECT_EQ(nonblocking[r].bytes, blocking[r].bytes);
      EXPECT_EQ(nonblocking[r].bytes, 2 * 1001 * 4);
      EXPECT_DOUBLE_EQ(nonblocking[r].clock, blocking[r].clock);
      // The ring's cost, twice: (n - 1) messages and (n - 1) / n of the buffer each.
      const double ring = (n - 1) * cost.alpha + (n - 1.0) / n * 1001 * 4 * cost.beta;
      EXPECT_DOUBLE_EQ(nonblocking[r].clock, 2 * ring);
    }
  }
}

TEST(AsyncShardedCollectives, TheyRunOnTheCommunicationThreadsLane) {
  trace::enable();
  testing::run_ranks(3, [](Comm& comm) {
    Tensor full = Tensor::zeros({3000}), shard = Tensor::zeros({1000});
    Request g = comm.iall_gather(shard, full);
    Request s = comm.ireduce_scatter(full, shard);
    { trace::Scope work("forward", "compute"); }
    g.wait();
    s.wait();
  });
  trace::disable();
  int gather_on_comm_lane = 0, scatter_on_comm_lane = 0, elsewhere = 0, posted_on_rank_lane = 0;
  for (const trace::Span& span : trace::spans()) {
    if ((span.name == "iall_gather" || span.name == "ireduce_scatter") && span.lane == 0)
      ++posted_on_rank_lane;
    if (span.name != "all_gather" && span.name != "reduce_scatter") continue;
    if (span.lane != 1)
      ++elsewhere;
    else if (span.name == "all_gather")
      ++gather_on_comm_lane;
    else
      ++scatter_on_comm_lane;
  }
  EXPECT_EQ(gather_on_comm_lane, 3);
  EXPECT_EQ(scatter_on_comm_lane, 3);
  EXPECT_EQ(elsewhere, 0) << "the caller's thread must not record them: it only queues the work";
  EXPECT_EQ(posted_on_rank_lane, 6)
      << "each call leaves a short span named after it where it was posted";
}

// ZeRO-1/2 gather the updated shards into the parameters they are a view of:
// the shard is the rank's own chunk of full. Every backend takes that (MPI
// needs MPI_IN_PLACE); any other overlap is an error at the call.
TEST(AsyncShardedCollectives, AllGatherInPlaceFromTheRanksOwnChunk) {
  for (int n : testing::all_world_sizes()) {
    for (std::int64_t len : {std::int64_t{3}, std::int64_t{23}}) {
      SCOPED_TRACE("world " + std::to_string(n) + ", " + std::to_string(len) + " elements");
      Results blocking(n), nonblocking(n);
      testing::run_ranks(n, [&](Comm& comm) {
        const int r = comm.rank();
        ChunkRange mine = chunk_range(len, n, r);
        for (bool async : {false, true}) {
          // Only this rank's own chunk holds the pattern; the rest is -1.
          Tensor full = Tensor::full({len}, -1.0, DType::f64);
          full.slice(mine.offset, mine.length)
              .copy_from(testing::pattern_tensor(0, len).slice(mine.offset, mine.length));
          Tensor shard = full.slice(mine.offset, mine.length);
          if (async) {
            comm.iall_gather(shard, full).wait();
            nonblocking[r] = full.to_vector();
          } else {
            comm.all_gather(shard, full);
            blocking[r] = full.to_vector();
          }
        }
      });
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(testing::values_equal("in-place all_gather", r, testing::pattern_values(0, len),
                                          blocking[r], n));
        EXPECT_TRUE(testing::values_equal("in-place iall_gather", r,
                                          testing::pattern_values(0, len), nonblocking[r], n));
      }
    }
  }
}

TEST(AsyncShardedCollectives, OverlapOtherThanTheOwnChunkIsAnErrorAtTheCall) {
  testing::run_ranks(2, [](Comm& comm) {
    const int r = comm.rank();
    Tensor full = Tensor::zeros({10});
    Tensor neighbours = full.slice(r == 0 ? 5 : 0, 5);  // the other rank's chunk
    try {
      comm.all_gather(neighbours, full);
      ADD_FAILURE() << "a shard inside full but not this rank's chunk must throw";
    } catch (const Error& e) {
      EXPECT_TRUE(testing::contains(e.what(), "shares memory with full")) << e.what();
      EXPECT_TRUE(testing::contains(e.what(), "passes full's own chunk " + std::to_string(r)))
          << e.what();
    }
    Tensor own = full.slice(r == 0 ? 0 : 5, 5);
    try {
      comm.reduce_scatter(full, own);
      ADD_FAILURE() << "an in-place reduce_scatter must throw";
    } catch (const Error& e) {
      EXPECT_TRUE(testing::contains(e.what(), "only all_gather may work in place")) << e.what();
    }
    EXPECT_THROW(comm.ireduce_scatter(full, own), Error);
  });
}

TEST(AsyncShardedCollectives, InterleavedWithBlockingCollectivesForManyIterations) {
  // The FSDP pattern, compressed: prefetch the next unit's parameters,
  // reduce-scatter the last unit's gradients, and a blocking all-reduce (a
  // loss or norm) in between, with values that change every iteration so a
  // collective matched with the wrong partner shows.
  for (int n : {2, 3, 4}) {
    testing::run_ranks(n, [n](Comm& comm) {
      const int r = comm.rank();
      const std::int64_t len = 37;
      ChunkRange mine = chunk_range(len, n, r);
      for (int it = 0; it < 150; ++it) {
        Tensor shard = Tensor::zeros({mine.length}, DType::f64);
        for (std::int64_t i = 0; i < mine.length; ++i)
          shard.set_item(i, it * 1000.0 + mine.offset + i);
        Tensor full = Tensor::zeros({len}, DType::f64);
        Tensor grads = Tensor::full({len}, r + it, DType::f64);
        Tensor grad_shard = Tensor::zeros({mine.length}, DType::f64);
        Tensor norm = Tensor::full({2}, it + r, DType::f64);
        Tensor second = Tensor::zeros({len}, DType::f64);

        Request gather = comm.iall_gather(shard, full);
        Request scatter = comm.ireduce_scatter(grads, grad_shard);
        comm.all_reduce(norm);  // blocking, between and beside the queued ones
        Request again = comm.iall_gather(shard, second);
        if (it % 2) {
          again.wait();
          scatter.wait();
          gather.wait();
        } else {
          gather.wait();
          scatter.wait();
          again.wait();
        }
        const double rank_sum = n * (n - 1) / 2.0;
        ASSERT_EQ(norm.item(1), n * it + rank_sum) << "iteration " << it;
        for (std::int64_t i = 0; i < len; i += 6) {
          ASSERT_EQ(full.item(i), it * 1000.0 + i) << "iteration " << it << ", element " << i;
          ASSERT_EQ(second.item(i), it * 1000.0 + i) << "iteration " << it << ", element " << i;
        }
        if (mine.length > 0) {
          ASSERT_EQ(grad_shard.item(0), n * it + rank_sum) << "iteration " << it;
        }
      }
    });
  }
}

TEST(AsyncShardedCollectives, BadShapesThrowAtTheCallAndMismatchesFailTheWait) {
  testing::run_ranks(2, [](Comm& comm) {
    Tensor full = Tensor::zeros({10}), wrong = Tensor::zeros({4});
    try {
      comm.iall_gather(wrong, full);
      ADD_FAILURE() << "a shard of the wrong size must throw";
    } catch (const Error& e) {
      EXPECT_TRUE(testing::contains(e.what(), "iall_gather: rank " + std::to_string(comm.rank()) +
                                                  "'s shard must hold chunk"));
    }
    EXPECT_THROW(comm.ireduce_scatter(full, wrong), Error);
    Tensor ids = Tensor::zeros({10}, DType::i32), ids_shard = Tensor::zeros({5}, DType::i32);
    EXPECT_THROW(comm.ireduce_scatter(ids, ids_shard, ReduceOp::avg), Error);
  });
  RankFailure failure = testing::launch_failure(testing::thread_world(2), [](Comm& comm) {
    Tensor full = Tensor::zeros({comm.rank() == 0 ? 10 : 12}),
           shard = Tensor::zeros({comm.rank() == 0 ? 5 : 6});
    comm.iall_gather(shard, full).wait();
  });
  EXPECT_TRUE(testing::contains(failure.what(), "collective mismatch"));
}

}  // namespace
}  // namespace dtp
