// Checkers for puzzles 1.1 (tree_broadcast) and 1.2 (tree_reduce).
#include "collectives_checks.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch01;

// --- 1.1 tree_broadcast ------------------------------------------------------

// Every rank starts with its own pattern, so a rank that is never written to
// keeps values that cannot be mistaken for root's.
std::vector<RankOutcome> run_broadcast(int n, std::int64_t numel, int root,
                                       DType dtype = DType::f64, CostModel cost = {},
                                       Shape shape = {}) {
  const std::string context = cat(describe_run("tree_broadcast", n, numel, dtype), ", root ", root);
  return run_puzzle(
      n, context,
      [&](Comm& comm) {
        Tensor x = pattern_tensor(comm.rank(), numel, dtype, comm.device());
        if (shape.ndim() > 0) x = x.view(shape);
        comm.reset_stats();
        dtp::ch01::tree_broadcast(comm, x, root);
        return x.to_vector();
      },
      cost);
}

void expect_broadcast(int n, std::int64_t numel, int root, DType dtype = DType::f64,
                      Shape shape = {}) {
  const std::string context = cat(describe_run("tree_broadcast", n, numel, dtype), ", root ", root);
  const std::vector<RankOutcome> outcomes = run_broadcast(n, numel, root, dtype, {}, shape);
  const std::vector<double> expected = pattern_values(root, numel, dtype);
  EXPECT_TRUE(ranks_hold(
      context, outcomes, [&](int) { return expected; }, n, copies_of(n, dtype)));
}

TEST(Puzzle1_1_tree_broadcast, ExactResults) {
  for (int n : all_world_sizes()) {
    for (std::int64_t numel : exact_lengths(n)) {
      expect_broadcast(n, numel, 0);
      if (stop_sweep()) return;
    }
  }
}

TEST(Puzzle1_1_tree_broadcast, AnyRoot) {
  for (int n : all_world_sizes()) {
    for (int root = 0; root < n; ++root) {
      for (std::int64_t numel : {std::int64_t{1}, std::int64_t{3 * n + 1}}) {
        expect_broadcast(n, numel, root);
        if (stop_sweep()) return;
      }
    }
  }
}

TEST(Puzzle1_1_tree_broadcast, LargeBuffer) {
  for (int n : large_world_sizes()) {
    expect_broadcast(n, kLargeLength, n - 1);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_1_tree_broadcast, Dtypes) {
  for (DType dtype : other_dtypes()) {
    expect_broadcast(fit_world(5), 5003, fit_world(5) / 2, dtype);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_1_tree_broadcast, TwoDimensionalShape) {
  expect_broadcast(fit_world(3), 77, root_in(fit_world(3), 1), DType::f64, Shape{7, 11});
}

TEST(Puzzle1_1_tree_broadcast, UsesOnlySendRecv) {
  for (int n : all_world_sizes()) {
    const std::int64_t numel = 3 * n + 2;
    const std::vector<RankOutcome> outcomes = run_broadcast(n, numel, n / 2);
    EXPECT_TRUE(
        only_send_recv("tree_broadcast", describe_run("tree_broadcast", n, numel), outcomes));
  }
}

TEST(Puzzle1_1_tree_broadcast, LatencyRounds) {
  for (int n : all_world_sizes()) {
    for (int root : {0, n - 1}) {
      const std::vector<RankOutcome> outcomes =
          run_broadcast(n, kDivisibleLength, root, DType::f64, CostModel::latency_rounds());
      EXPECT_TRUE(clock_matches(cat("tree_broadcast on N=", n, " from root ", root), outcomes,
                                ClockUnit::latency_rounds, ceil_log2(n),
                                formula("ceil(log2 N)", ceil_log2(n))));
    }
  }
}

TEST(Puzzle1_1_tree_broadcast, CriticalPathBytes) {
  const std::int64_t numel = kDivisibleLength;
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes =
        run_broadcast(n, numel, 0, DType::f64, CostModel::bytes());
    const double expected = static_cast<double>(ceil_log2(n) * numel * 8);
    EXPECT_TRUE(clock_matches(
        describe_run("tree_broadcast", n, numel), outcomes, ClockUnit::critical_path_bytes,
        expected,
        formula(cat("ceil(log2 N)*S*elem_size = ", ceil_log2(n), "*", numel, "*8"), expected)));
  }
}

// --- 1.2 tree_reduce -------------------------------------------------------------

std::vector<RankOutcome> run_reduce(int n, std::int64_t numel, int root, DType dtype = DType::f64,
                                    CostModel cost = {}) {
  const std::string context = cat(describe_run("tree_reduce", n, numel, dtype), ", root ", root);
  return run_puzzle(
      n, context,
      [&](Comm& comm) {
        Tensor x = pattern_tensor(comm.rank(), numel, dtype, comm.device());
        comm.reset_stats();
        dtp::ch01::tree_reduce(comm, x, root);
        return x.to_vector();
      },
      cost);
}

// Only root's x is specified afterwards; the other ranks may use theirs as scratch.
void expect_reduce(int n, std::int64_t numel, int root, DType dtype = DType::f64) {
  const std::string context = cat(describe_run("tree_reduce", n, numel, dtype), ", root ", root);
  const std::vector<RankOutcome> outcomes = run_reduce(n, numel, root, dtype);
  const std::vector<double> expected = pattern_sum(n, numel, dtype);
  EXPECT_TRUE(
      ranks_hold(context, outcomes, [&](int) { return expected; }, n, sums_of(n, dtype), {root}));
}

TEST(Puzzle1_2_tree_reduce, ExactResults) {
  for (int n : all_world_sizes()) {
    for (std::int64_t numel : exact_lengths(n)) {
      expect_reduce(n, numel, 0);
      if (stop_sweep()) return;
    }
  }
}

TEST(Puzzle1_2_tree_reduce, AnyRoot) {
  for (int n : all_world_sizes()) {
    for (int root = 0; root < n; ++root) {
      for (std::int64_t numel : {std::int64_t{1}, std::int64_t{3 * n + 1}}) {
        expect_reduce(n, numel, root);
        if (stop_sweep()) return;
      }
    }
  }
}

TEST(Puzzle1_2_tree_reduce, LargeBuffer) {
  for (int n : large_world_sizes()) {
    expect_reduce(n, kLargeLength, n / 2);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_2_tree_reduce, Dtypes) {
  for (DType dtype : other_dtypes()) {
    expect_reduce(fit_world(5), 5003, root_in(fit_world(5), fit_world(5) - 2), dtype);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_2_tree_reduce, UsesOnlySendRecv) {
  for (int n : all_world_sizes()) {
    const std::int64_t numel = 3 * n + 2;
    const std::vector<RankOutcome> outcomes = run_reduce(n, numel, n / 2);
    EXPECT_TRUE(only_send_recv("tree_reduce", describe_run("tree_reduce", n, numel), outcomes));
  }
}

// The clock charges sends, not receives, so a binomial reduce whose root has
// small subtrees can finish in fewer than ceil(log2 N) rounds when N is not a
// power of two; it never needs more.
TEST(Puzzle1_2_tree_reduce, LatencyRounds) {
  for (int n : all_world_sizes()) {
    for (int root : {0, n - 1}) {
      const std::vector<RankOutcome> outcomes =
          run_reduce(n, kDivisibleLength, root, DType::f64, CostModel::latency_rounds());
      const bool exact = is_power_of_two(n);
      EXPECT_TRUE(clock_matches(cat("tree_reduce on N=", n, " to root ", root), outcomes,
                                ClockUnit::latency_rounds, ceil_log2(n),
                                formula("ceil(log2 N)", ceil_log2(n)), !exact));
    }
  }
}

// A binomial tree: every rank sends its partial sum once (root: never) and
// receives one message per child, at most ceil(log2 N). A flat reduce (every
// rank sending straight to root) would make root receive N-1 messages.
TEST(Puzzle1_2_tree_reduce, BinomialTreeMessageCounts) {
  for (int n : all_world_sizes()) {
    const int root = n / 2;
    const std::vector<RankOutcome> outcomes = run_reduce(n, 2 * n + 1, root);
    for (int rank = 0; rank < n; ++rank) {
      if (!outcomes[static_cast<std::size_t>(rank)].has_stats) continue;
      const CommStats& stats = outcomes[static_cast<std::size_t>(rank)].stats;
      const std::int64_t sends = rank == root ? 0 : 1;
      EXPECT_EQ(stats.messages_sent, sends)
          << "tree_reduce on N=" << n << " to root " << root << ": rank " << rank << " sent "
          << stats.messages_sent << " messages; in a binomial tree "
          << (rank == root ? "root sends none"
                           : "every other rank sends its partial sum exactly once");
      EXPECT_LE(stats.messages_received, ceil_log2(n))
          << "tree_reduce on N=" << n << " to root " << root << ": rank " << rank << " received "
          << stats.messages_received
          << " messages; in a binomial tree a rank has at most ceil(log2 N) = " << ceil_log2(n)
          << " children";
    }
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_2_tree_reduce, CriticalPathBytes) {
  const std::int64_t numel = kDivisibleLength;
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes =
        run_reduce(n, numel, 0, DType::f64, CostModel::bytes());
    const double expected = static_cast<double>(ceil_log2(n) * numel * 8);
    EXPECT_TRUE(clock_matches(
        describe_run("tree_reduce", n, numel), outcomes, ClockUnit::critical_path_bytes, expected,
        formula(cat("ceil(log2 N)*S*elem_size = ", ceil_log2(n), "*", numel, "*8"), expected),
        !is_power_of_two(n)));
  }
}

}  // namespace
