// Checkers for puzzle 1.6: pairwise all-to-all.
#include "collectives_checks.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch01;

// Every rank's in is its pattern over N * chunk elements; out starts poisoned.
std::vector<RankOutcome> run_all_to_all(int n, std::int64_t chunk, DType dtype = DType::f64,
                                        CostModel cost = {}) {
  const std::int64_t numel = n * chunk;
  return run_puzzle(
      n, describe_run("pairwise_all_to_all", n, numel, dtype),
      [&](Comm& comm) {
        const Tensor in = pattern_tensor(comm.rank(), numel, dtype, comm.device());
        Tensor out = Tensor::full(Shape{numel}, kPoison, dtype, comm.device());
        comm.reset_stats();
        dtp::ch01::pairwise_all_to_all(comm, in, out);
        return out.to_vector();
      },
      cost);
}

// Chunk i of rank j's out is chunk j of rank i's in.
std::vector<double> expected_out(int n, std::int64_t chunk, int rank, DType dtype) {
  std::vector<double> out;
  for (int source = 0; source < n; ++source) {
    const std::vector<double> in = pattern_values(source, n * chunk, dtype);
    out.insert(out.end(), in.begin() + rank * chunk, in.begin() + (rank + 1) * chunk);
  }
  return out;
}

void expect_all_to_all(int n, std::int64_t chunk, DType dtype = DType::f64) {
  const std::vector<RankOutcome> outcomes = run_all_to_all(n, chunk, dtype);
  EXPECT_TRUE(ranks_hold(
      describe_run("pairwise_all_to_all", n, n * chunk, dtype), outcomes,
      [&](int rank) { return expected_out(n, chunk, rank, dtype); }, n, copies_of(n, dtype)));
}

// Sizes must divide by N, so the sweep is over the chunk each pair exchanges:
// empty buffers, one element per pair, a few, and a prime.
TEST(Puzzle1_6_pairwise_all_to_all, ExactResults) {
  for (int n : all_world_sizes()) {
    for (std::int64_t chunk : {0, 1, 3, 127}) {
      expect_all_to_all(n, chunk);
      if (stop_sweep()) return;
    }
  }
}

TEST(Puzzle1_6_pairwise_all_to_all, LargeBuffer) {
  for (int n : large_world_sizes()) {
    expect_all_to_all(n, kLargeLength / n + 1);
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_6_pairwise_all_to_all, Dtypes) {
  for (DType dtype : other_dtypes()) {
    expect_all_to_all(fit_world(5), 1001, dtype);
    if (stop_sweep()) return;
  }
}

// in is [N, 2, 3] and out [2*N, 3]: chunks are taken from the flattened elements.
TEST(Puzzle1_6_pairwise_all_to_all, TwoDimensionalShape) {
  const int n = fit_world(3);
  const std::string context =
      cat("pairwise_all_to_all on N=", n, " with shapes [", n, ", 2, 3] -> [", 2 * n, ", 3]");
  const std::vector<RankOutcome> outcomes = run_puzzle(n, context, [&](Comm& comm) {
    const Tensor in =
        pattern_tensor(comm.rank(), 6 * n, DType::f64, comm.device()).view(Shape{n, 2, 3});
    Tensor out = Tensor::full(Shape{2 * n, 3}, kPoison, DType::f64, comm.device());
    comm.reset_stats();
    dtp::ch01::pairwise_all_to_all(comm, in, out);
    return out.to_vector();
  });
  EXPECT_TRUE(ranks_hold(
      context, outcomes, [&](int rank) { return expected_out(n, 6, rank, DType::f64); }, n,
      copies_of(n, DType::f64)));
}

// What one rank saw when handed bad sizes.
struct BadSizeOutcome {
  bool here = false;  // this rank ran in this process
  bool threw_dtp_error = false;
  std::string what;  // the error's message, or what happened instead
};

// Every rank passes in/out of @p in_numel / @p out_numel elements; each must
// throw dtp::Error (before sending anything) naming the sizes.
void expect_rejected(int n, std::int64_t in_numel, std::int64_t out_numel, const std::string& why) {
  std::vector<BadSizeOutcome> outcomes(static_cast<std::size_t>(n));
  run_ranks(n, [&](Comm& comm) {
    const Tensor in = pattern_tensor(comm.rank(), in_numel, DType::f64, comm.device());
    Tensor out = Tensor::full(Shape{out_numel}, kPoison, DType::f64, comm.device());
    BadSizeOutcome& outcome = outcomes[static_cast<std::size_t>(comm.rank())];
    outcome.here = true;
    try {
      dtp::ch01::pairwise_all_to_all(comm, in, out);
      outcome.what = "it returned normally";
    } catch (const Error& error) {
      outcome.threw_dtp_error = true;
      outcome.what = error.what();
    } catch (const std::exception& error) {
      outcome.what = cat("it threw something other than dtp::Error: ", error.what());
    }
  });
  const std::string context = cat("pairwise_all_to_all on N=", n, " with in.numel() = ", in_numel,
                                  " and out.numel() = ", out_numel, " (", why, ")");
  for (int rank = 0; rank < n; ++rank) {
    const BadSizeOutcome& outcome = outcomes[static_cast<std::size_t>(rank)];
    if (!outcome.here) continue;  // another process checks it
    EXPECT_TRUE(outcome.threw_dtp_error)
        << context << " must throw dtp::Error on every rank; on rank " << rank << " "
        << outcome.what;
    if (!outcome.threw_dtp_error) continue;
    const bool names_sizes = outcome.what.find(std::to_string(in_numel)) != std::string::npos ||
                             outcome.what.find(std::to_string(out_numel)) != std::string::npos;
    EXPECT_TRUE(names_sizes) << context << ": the error should name the sizes; rank " << rank
                             << " said: " << outcome.what;
  }
}

TEST(Puzzle1_6_pairwise_all_to_all, RejectsBadSizes) {
  for (int n : all_world_sizes()) {
    if (n >= 2) {
      expect_rejected(n, 2 * n + 1, 2 * n + 1, "not divisible by N");
      expect_rejected(n, 1, 1, "fewer elements than ranks, not divisible by N");
    }
    expect_rejected(n, 2 * n, 3 * n, "in and out differ");
    expect_rejected(n, 3 * n, 2 * n, "in and out differ");
    if (stop_sweep()) return;
  }
}

TEST(Puzzle1_6_pairwise_all_to_all, UsesOnlySendRecv) {
  for (int n : all_world_sizes()) {
    EXPECT_TRUE(only_send_recv("pairwise_all_to_all", describe_run("pairwise_all_to_all", n, 3 * n),
                               run_all_to_all(n, 3)));
  }
}

// Every rank sends N-1 chunks, one per peer; its sends are serialized on its
// own clock, so N-1 rounds is the least and pairing the exchanges well (step k:
// send to r+k, receive from r-k) reaches it.
TEST(Puzzle1_6_pairwise_all_to_all, LatencyRounds) {
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes =
        run_all_to_all(n, 5, DType::f64, CostModel::latency_rounds());
    EXPECT_TRUE(clock_matches(cat("pairwise_all_to_all on N=", n), outcomes,
                              ClockUnit::latency_rounds, n - 1, formula("N-1", n - 1)));
  }
}

TEST(Puzzle1_6_pairwise_all_to_all, CriticalPathBytes) {
  const std::int64_t chunk = 105;
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes =
        run_all_to_all(n, chunk, DType::f64, CostModel::bytes());
    const double expected = static_cast<double>((n - 1) * chunk * 8);
    EXPECT_TRUE(clock_matches(
        describe_run("pairwise_all_to_all", n, n * chunk), outcomes, ClockUnit::critical_path_bytes,
        expected, formula(cat("(N-1)*(S/N)*elem_size = ", n - 1, "*", chunk, "*8"), expected)));
  }
}

}  // namespace
