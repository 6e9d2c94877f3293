// Checkers for puzzles 1.4 (ring_all_gather) and 1.5 (ring_reduce_scatter).
#include "collectives_checks.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch01;

// --- 1.4 ring_all_gather --------------------------------------------------------

// Rank r's shard is its pattern over chunk r's length; full starts poisoned.
std::vector<RankOutcome> run_all_gather(int n, std::int64_t numel, DType dtype = DType::f64,
                                        CostModel cost = {}, Shape full_shape = {}) {
  return run_puzzle(
      n, describe_run("ring_all_gather", n, numel, dtype),
      [&](Comm& comm) {
        const Tensor shard = pattern_tensor(comm.rank(), chunk_range(numel, n, comm.rank()).length,
                                            dtype, comm.device());
        Tensor full = Tensor::full(full_shape.ndim() > 0 ? full_shape : Shape{numel}, kPoison,
                                   dtype, comm.device());
        comm.reset_stats();
        dtp::ch01::ring_all_gather(comm, shard, full);
        return full.to_vector();
      },
      cost);
}

void expect_all_gather(int n, std::int64_t numel, DType dtype = DType::f64, Shape full_shape = {}) {
  const std::vector<RankOutcome> outcomes = run_all_gather(n, numel, dtype, {}, full_shape);
  const std::vector<double> expected = gathered_pattern(n, numel, dtype);
  EXPECT_TRUE(ranks_hold(
      describe_run("ring_all_gather", n, numel, dtype), outcomes, [&](int) { return expected; }, n,
      copies_of(n, dtype)));
}

TEST(Puzzle1_4_ring_all_gather, ExactResults) {
  for (int n : all_world_sizes()) {
    for (std::int64_t numel : exact_lengths(n)) {
      expect_all_gather(n, numel);
      if (stop_sweep()) return;
    }
  }
}

TEST(Puzzle1_4_ring_all_gather, LargeBuffer) {
  for (int n : large_world_sizes()) {
    expect_all_gather(n, kLargeLength);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_4_ring_all_gather, Dtypes) {
  for (DType dtype : other_dtypes()) {
    expect_all_gather(fit_world(5), 5003, dtype);
    if (stop_sweep()) return;
  }
}

// full is [6, 7]: 42 elements in 4 chunks of 11, 11, 11, 9 that cut across rows.
TEST(Puzzle1_4_ring_all_gather, TwoDimensionalShape) {
  expect_all_gather(fit_world(4), 42, DType::f64, Shape{6, 7});
}

TEST(Puzzle1_4_ring_all_gather, UsesOnlySendRecv) {
  for (int n : all_world_sizes()) {
    const std::int64_t numel = 3 * n + 2;
    EXPECT_TRUE(only_send_recv("ring_all_gather", describe_run("ring_all_gather", n, numel),
                               run_all_gather(n, numel)));
  }
}

TEST(Puzzle1_4_ring_all_gather, LatencyRounds) {
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes =
        run_all_gather(n, kDivisibleLength, DType::f64, CostModel::latency_rounds());
    EXPECT_TRUE(clock_matches(cat("ring_all_gather on N=", n), outcomes, ClockUnit::latency_rounds,
                              n - 1, formula("N-1", n - 1)));
  }
}

TEST(Puzzle1_4_ring_all_gather, CriticalPathBytes) {
  const std::int64_t numel = kDivisibleLength;
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes =
        run_all_gather(n, numel, DType::f64, CostModel::bytes());
    const double expected = static_cast<double>((n - 1) * (numel / n) * 8);
    EXPECT_TRUE(clock_matches(
        describe_run("ring_all_gather", n, numel), outcomes, ClockUnit::critical_path_bytes,
        expected, formula(cat("(N-1)*(S/N)*elem_size = ", n - 1, "*", numel / n, "*8"), expected)));
  }
}

// --- 1.5 ring_reduce_scatter ----------------------------------------------------

// Each rank's full is its pattern; the result shard starts poisoned. The
// values returned are shard followed by full (to check full is not modified).
std::vector<RankOutcome> run_reduce_scatter(int n, std::int64_t numel, DType dtype = DType::f64,
                                            CostModel cost = {}) {
  return run_puzzle(
      n, describe_run("ring_reduce_scatter", n, numel, dtype),
      [&](Comm& comm) {
        const Tensor full = pattern_tensor(comm.rank(), numel, dtype, comm.device());
        Tensor shard = Tensor::full(Shape{chunk_range(numel, n, comm.rank()).length}, kPoison,
                                    dtype, comm.device());
        comm.reset_stats();
        dtp::ch01::ring_reduce_scatter(comm, full, shard);
        std::vector<double> values = shard.to_vector();
        const std::vector<double> after = full.to_vector();
        values.insert(values.end(), after.begin(), after.end());
        return values;
      },
      cost);
}

void expect_reduce_scatter(int n, std::int64_t numel, DType dtype = DType::f64) {
  const std::string context = describe_run("ring_reduce_scatter", n, numel, dtype);
  std::vector<RankOutcome> outcomes = run_reduce_scatter(n, numel, dtype);
  const std::vector<double> sum = pattern_sum(n, numel, dtype);
  for (int rank = 0; rank < n; ++rank) {
    RankOutcome& outcome = outcomes[static_cast<std::size_t>(rank)];
    if (!outcome.here) continue;  // another process checks it
    const ChunkRange mine = chunk_range(numel, n, rank);
    const std::vector<double> full_after(outcome.values.begin() + mine.length,
                                         outcome.values.end());
    outcome.values.resize(static_cast<std::size_t>(mine.length));
    EXPECT_TRUE(values_equal(context + " (full is an input and must not be modified)", rank,
                             pattern_values(rank, numel, dtype), full_after, n));
  }
  EXPECT_TRUE(ranks_hold(
      context + " (shard = chunk r of the sum)", outcomes,
      [&](int rank) { return slice_of(sum, chunk_range(numel, n, rank)); }, 0, sums_of(n, dtype)));
}

TEST(Puzzle1_5_ring_reduce_scatter, ExactResults) {
  for (int n : all_world_sizes()) {
    for (std::int64_t numel : exact_lengths(n)) {
      expect_reduce_scatter(n, numel);
      if (stop_sweep()) return;
    }
  }
}

TEST(Puzzle1_5_ring_reduce_scatter, LargeBuffer) {
  for (int n : large_world_sizes()) {
    expect_reduce_scatter(n, kLargeLength);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_5_ring_reduce_scatter, Dtypes) {
  for (DType dtype : other_dtypes()) {
    expect_reduce_scatter(fit_world(5), 5003, dtype);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_5_ring_reduce_scatter, UsesOnlySendRecv) {
  for (int n : all_world_sizes()) {
    const std::int64_t numel = 3 * n + 2;
    EXPECT_TRUE(only_send_recv("ring_reduce_scatter", describe_run("ring_reduce_scatter", n, numel),
                               run_reduce_scatter(n, numel)));
  }
}

TEST(Puzzle1_5_ring_reduce_scatter, LatencyRounds) {
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes =
        run_reduce_scatter(n, kDivisibleLength, DType::f64, CostModel::latency_rounds());
    EXPECT_TRUE(clock_matches(cat("ring_reduce_scatter on N=", n), outcomes,
                              ClockUnit::latency_rounds, n - 1, formula("N-1", n - 1)));
  }
}

TEST(Puzzle1_5_ring_reduce_scatter, CriticalPathBytes) {
  const std::int64_t numel = kDivisibleLength;
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes =
        run_reduce_scatter(n, numel, DType::f64, CostModel::bytes());
    const double expected = static_cast<double>((n - 1) * (numel / n) * 8);
    EXPECT_TRUE(clock_matches(
        describe_run("ring_reduce_scatter", n, numel), outcomes, ClockUnit::critical_path_bytes,
        expected, formula(cat("(N-1)*(S/N)*elem_size = ", n - 1, "*", numel / n, "*8"), expected)));
  }
}

}  // namespace
