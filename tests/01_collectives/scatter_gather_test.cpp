// Checkers for puzzle 1.3: scatter and gather (flat or tree, any root).
#include "collectives_checks.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch01;

// Root's full holds root's pattern; every other rank passes a full of the same
// size holding its own pattern, which scatter must ignore. Each shard starts
// poisoned so a chunk that never arrives shows.
std::vector<RankOutcome> run_scatter(int n, std::int64_t numel, int root, DType dtype = DType::f64,
                                     CostModel cost = {}) {
  const std::string context = cat(describe_run("scatter", n, numel, dtype), ", root ", root);
  return run_puzzle(
      n, context,
      [&](Comm& comm) {
        const Tensor full = pattern_tensor(comm.rank(), numel, dtype, comm.device());
        Tensor shard = Tensor::full(Shape{chunk_range(numel, n, comm.rank()).length}, kPoison,
                                    dtype, comm.device());
        comm.reset_stats();
        dtp::ch01::scatter(comm, full, shard, root);
        return shard.to_vector();
      },
      cost);
}

void expect_scatter(int n, std::int64_t numel, int root, DType dtype = DType::f64) {
  const std::string context = cat(describe_run("scatter", n, numel, dtype), ", root ", root);
  const std::vector<RankOutcome> outcomes = run_scatter(n, numel, root, dtype);
  const std::vector<double> root_full = pattern_values(root, numel, dtype);
  EXPECT_TRUE(ranks_hold(
      context, outcomes, [&](int rank) { return slice_of(root_full, chunk_range(numel, n, rank)); },
      0, copies_of(n, dtype)));
}

// Rank r's shard is its pattern over chunk r's length. Every rank's full
// starts poisoned: root's must be filled completely, the others' must stay
// untouched (the contract).
std::vector<RankOutcome> run_gather(int n, std::int64_t numel, int root, DType dtype = DType::f64,
                                    CostModel cost = {}) {
  const std::string context = cat(describe_run("gather", n, numel, dtype), ", root ", root);
  return run_puzzle(
      n, context,
      [&](Comm& comm) {
        const Tensor shard = pattern_tensor(comm.rank(), chunk_range(numel, n, comm.rank()).length,
                                            dtype, comm.device());
        Tensor full = Tensor::full(Shape{numel}, kPoison, dtype, comm.device());
        comm.reset_stats();
        dtp::ch01::gather(comm, shard, full, root);
        return full.to_vector();
      },
      cost);
}

void expect_gather(int n, std::int64_t numel, int root, DType dtype = DType::f64) {
  const std::string context = cat(describe_run("gather", n, numel, dtype), ", root ", root);
  const std::vector<RankOutcome> outcomes = run_gather(n, numel, root, dtype);
  const std::vector<double> gathered = gathered_pattern(n, numel, dtype);
  const std::vector<double> untouched(static_cast<std::size_t>(numel), kPoison);
  EXPECT_TRUE(
      ranks_hold(context, outcomes, [&](int) { return gathered; }, n, copies_of(n, dtype), {root}));
  for (int rank = 0; rank < n; ++rank) {
    if (rank == root || !outcomes[static_cast<std::size_t>(rank)].here) continue;
    EXPECT_TRUE(values_equal(context + " (a non-root full must stay untouched)", rank, untouched,
                             outcomes[static_cast<std::size_t>(rank)].values, n));
  }
}

TEST(Puzzle1_3_scatter_gather, ScatterExactResults) {
  for (int n : all_world_sizes()) {
    for (std::int64_t numel : exact_lengths(n)) {
      expect_scatter(n, numel, 0);
      if (stop_sweep()) return;
    }
  }
}

TEST(Puzzle1_3_scatter_gather, GatherExactResults) {
  for (int n : all_world_sizes()) {
    for (std::int64_t numel : exact_lengths(n)) {
      expect_gather(n, numel, 0);
      if (stop_sweep()) return;
    }
  }
}

TEST(Puzzle1_3_scatter_gather, ScatterAnyRoot) {
  for (int n : all_world_sizes()) {
    for (int root = 0; root < n; ++root) {
      for (std::int64_t numel : {std::int64_t{1}, std::int64_t{3 * n + 1}}) {
        expect_scatter(n, numel, root);
        if (stop_sweep()) return;
      }
    }
  }
}

TEST(Puzzle1_3_scatter_gather, GatherAnyRoot) {
  for (int n : all_world_sizes()) {
    for (int root = 0; root < n; ++root) {
      for (std::int64_t numel : {std::int64_t{1}, std::int64_t{3 * n + 1}}) {
        expect_gather(n, numel, root);
        if (stop_sweep()) return;
      }
    }
  }
}

TEST(Puzzle1_3_scatter_gather, LargeBuffer) {
  for (int n : large_world_sizes()) {
    expect_scatter(n, kLargeLength, n - 1);
    expect_gather(n, kLargeLength, n / 2);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_3_scatter_gather, Dtypes) {
  for (DType dtype : other_dtypes()) {
    expect_scatter(fit_world(5), 5003, root_in(fit_world(5), 1), dtype);
    expect_gather(fit_world(5), 5003, fit_world(5) - 1, dtype);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_3_scatter_gather, UsesOnlySendRecv) {
  for (int n : all_world_sizes()) {
    const std::int64_t numel = 3 * n + 2;
    EXPECT_TRUE(
        only_send_recv("scatter", describe_run("scatter", n, numel), run_scatter(n, numel, n / 2)));
    EXPECT_TRUE(
        only_send_recv("gather", describe_run("gather", n, numel), run_gather(n, numel, n / 2)));
  }
}

// A flat scatter sends N-1 messages from root (N-1 rounds); a binomial one
// takes ceil(log2 N). A flat gather takes 1 round (receives are free on the
// clock), a binomial one ceil(log2 N). Either way: at most N-1.
TEST(Puzzle1_3_scatter_gather, LatencyRounds) {
  for (int n : all_world_sizes()) {
    const CostModel cost = CostModel::latency_rounds();
    const double bound = n - 1;
    EXPECT_TRUE(clock_matches(cat("scatter on N=", n),
                              run_scatter(n, kDivisibleLength, 0, DType::f64, cost),
                              ClockUnit::latency_rounds, bound, formula("N-1", bound), true));
    EXPECT_TRUE(clock_matches(cat("gather on N=", n),
                              run_gather(n, kDivisibleLength, n - 1, DType::f64, cost),
                              ClockUnit::latency_rounds, bound, formula("N-1", bound), true));
  }
}

// Root holds (N-1)/N of the data that must leave it (scatter) or reach it
// (gather); no chunk needs to travel more than once along a path.
TEST(Puzzle1_3_scatter_gather, CriticalPathBytes) {
  const std::int64_t numel = kDivisibleLength;
  for (int n : all_world_sizes()) {
    const CostModel cost = CostModel::bytes();
    const double bound = static_cast<double>((n - 1) * (numel / n) * 8);
    const std::string text =
        formula(cat("(N-1)*(S/N)*elem_size = ", n - 1, "*", numel / n, "*8"), bound);
    EXPECT_TRUE(clock_matches(describe_run("scatter", n, numel),
                              run_scatter(n, numel, 0, DType::f64, cost),
                              ClockUnit::critical_path_bytes, bound, text, true));
    EXPECT_TRUE(clock_matches(describe_run("gather", n, numel),
                              run_gather(n, numel, 0, DType::f64, cost),
                              ClockUnit::critical_path_bytes, bound, text, true));
  }
}

}  // namespace
