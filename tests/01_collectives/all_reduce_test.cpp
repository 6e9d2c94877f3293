// Checkers for the five all-reduces: 1.7 parameter server, 1.8 ring, 1.9 tree,
// 1.10 recursive halving-doubling and 1.11 direct.
#include "collectives_checks.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch01;

// The all-reduces share one signature once the parameter server's root is bound.
using AllReduce = std::function<void(Comm&, Tensor&)>;

// Every rank's x is its pattern; afterwards every rank must hold the sum.
std::vector<RankOutcome> run_all_reduce(const std::string& name, const AllReduce& all_reduce, int n,
                                        std::int64_t numel, DType dtype = DType::f64,
                                        CostModel cost = {}, Shape shape = {}) {
  return run_puzzle(
      n, describe_run(name, n, numel, dtype),
      [&](Comm& comm) {
        Tensor x = pattern_tensor(comm.rank(), numel, dtype, comm.device());
        if (shape.ndim() > 0) x = x.view(shape);
        comm.reset_stats();
        all_reduce(comm, x);
        return x.to_vector();
      },
      cost);
}

void expect_all_reduce(const std::string& name, const AllReduce& all_reduce, int n,
                       std::int64_t numel, DType dtype = DType::f64, Shape shape = {},
                       const std::string& detail = "") {
  const std::vector<RankOutcome> outcomes =
      run_all_reduce(name, all_reduce, n, numel, dtype, {}, shape);
  const std::vector<double> sum = pattern_sum(n, numel, dtype);
  EXPECT_TRUE(ranks_hold(
      describe_run(name, n, numel, dtype) + detail, outcomes, [&](int) { return sum; }, n,
      sums_of(n, dtype)));
}

// The sweeps every all-reduce gets.
void exact_results(const std::string& name, const AllReduce& all_reduce) {
  for (int n : all_world_sizes()) {
    for (std::int64_t numel : exact_lengths(n)) {
      expect_all_reduce(name, all_reduce, n, numel);
      if (stop_sweep()) return;
    }
  }
}

void large_buffer(const std::string& name, const AllReduce& all_reduce) {
  for (int n : large_world_sizes()) {
    expect_all_reduce(name, all_reduce, n, kLargeLength);
    if (stop_sweep()) return;
  }
}

void dtypes(const std::string& name, const AllReduce& all_reduce) {
  for (DType dtype : other_dtypes()) {
    expect_all_reduce(name, all_reduce, fit_world(5), 5003, dtype);
    if (stop_sweep()) return;
  }
}

void uses_only_send_recv(const std::string& name, const AllReduce& all_reduce) {
  for (int n : all_world_sizes()) {
    const std::int64_t numel = 3 * n + 2;
    EXPECT_TRUE(only_send_recv(name, describe_run(name, n, numel),
                               run_all_reduce(name, all_reduce, n, numel)));
  }
}

// The max clock over ranks under CostModel::latency_rounds() (exact when
// @p at_most is false); @p links says whether each rank has a link to every
// peer (CostModel::link_per_peer) or one link for all its sends.
enum class Links { one_per_rank, one_per_peer };

CostModel on(CostModel cost, Links links) {
  return links == Links::one_per_peer ? cost.with_link_per_peer() : cost;
}
std::string described(const std::string& name, int n, Links links) {
  return cat(name, " on N=", n, links == Links::one_per_peer ? " with a link to every peer" : "");
}

void expect_rounds(const std::string& name, const AllReduce& all_reduce, int n, double expected,
                   const std::string& formula_text, bool at_most = false,
                   Links links = Links::one_per_rank) {
  const std::vector<RankOutcome> outcomes = run_all_reduce(
      name, all_reduce, n, kDivisibleLength, DType::f64, on(CostModel::latency_rounds(), links));
  EXPECT_TRUE(clock_matches(described(name, n, links), outcomes, ClockUnit::latency_rounds,
                            expected, formula(formula_text, expected), at_most,
                            links == Links::one_per_peer));
}

// The max clock over ranks under CostModel::bytes(), with S = 840 f64
// elements (divisible by every N up to 8).
void expect_bytes(const std::string& name, const AllReduce& all_reduce, int n, double expected,
                  const std::string& formula_text, bool at_most = false,
                  Links links = Links::one_per_rank) {
  const std::vector<RankOutcome> outcomes = run_all_reduce(
      name, all_reduce, n, kDivisibleLength, DType::f64, on(CostModel::bytes(), links));
  EXPECT_TRUE(clock_matches(described(name, n, links) + cat(", S=", kDivisibleLength), outcomes,
                            ClockUnit::critical_path_bytes, expected,
                            formula(formula_text, expected), at_most,
                            links == Links::one_per_peer));
}

constexpr std::int64_t kS = kDivisibleLength;
constexpr std::int64_t kElem = 8;  // f64

// Bandwidth optimality, per rank: 2(N-1) messages of one chunk each, so
// 2(N-1)/N of the data, not all of it; @p messages_why says where the
// messages come from.
void expect_sent_per_rank(const std::string& name, const AllReduce& all_reduce,
                          const std::string& messages_why) {
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes = run_all_reduce(name, all_reduce, n, kS);
    const std::int64_t messages = 2 * (n - 1);
    const std::int64_t bytes = 2 * (n - 1) * (kS / n) * kElem;
    for (int rank = 0; rank < n; ++rank) {
      const RankOutcome& outcome = outcomes[static_cast<std::size_t>(rank)];
      if (!outcome.has_stats) continue;
      EXPECT_EQ(outcome.stats.messages_sent, messages)
          << describe_run(name, n, kS) << ": rank " << rank << " sent "
          << outcome.stats.messages_sent << " messages; expected 2(N-1) = " << messages << ": "
          << messages_why;
      EXPECT_EQ(outcome.stats.bytes_sent, bytes)
          << describe_run(name, n, kS) << ": rank " << rank << " sent " << outcome.stats.bytes_sent
          << " bytes; expected 2(N-1)/N*S*elem_size = 2*" << n - 1 << "*" << kS / n
          << "*8 = " << bytes;
    }
    if (stop_sweep()) return;
  }
}

// --- 1.7 parameter_server_all_reduce ---------------------------------------------

AllReduce parameter_server(int root) {
  return [root](Comm& comm, Tensor& x) { dtp::ch01::parameter_server_all_reduce(comm, x, root); };
}
const std::string kParameterServer = "parameter_server_all_reduce";

TEST(Puzzle1_7_parameter_server_all_reduce, ExactResults) {
  exact_results(kParameterServer, parameter_server(0));
}

TEST(Puzzle1_7_parameter_server_all_reduce, AnyRoot) {
  for (int n : all_world_sizes()) {
    for (int root = 0; root < n; ++root) {
      for (std::int64_t numel : {std::int64_t{1}, std::int64_t{3 * n + 1}}) {
        expect_all_reduce(kParameterServer, parameter_server(root), n, numel, DType::f64, {},
                          cat(", root ", root));
        if (stop_sweep()) return;
      }
    }
  }
}

TEST(Puzzle1_7_parameter_server_all_reduce, LargeBuffer) {
  for (int n : large_world_sizes()) {
    expect_all_reduce(kParameterServer, parameter_server(root_in(n, 1)), n, kLargeLength,
                      DType::f64, {}, cat(", root ", root_in(n, 1)));
    if (stop_sweep()) return;
  }
}
TEST(Puzzle1_7_parameter_server_all_reduce, Dtypes) {
  dtypes(kParameterServer, parameter_server(fit_world(5) - 1));
}
TEST(Puzzle1_7_parameter_server_all_reduce, UsesOnlySendRecv) {
  uses_only_send_recv(kParameterServer, parameter_server(0));
}

// The N-1 workers send at once (arriving at time 1); root then sends the sum
// back N-1 times, one after another on its clock: 1 + (N-1) = N rounds.
TEST(Puzzle1_7_parameter_server_all_reduce, LatencyRounds) {
  for (int n : all_world_sizes()) {
    expect_rounds(kParameterServer, parameter_server(n - 1), n, n == 1 ? 0 : n,
                  n == 1 ? "0 (one rank)" : "N", true);
  }
}

// Root receives all of x from every worker (S bytes on the path), then sends
// all of x N-1 times: S + (N-1)*S = N*S bytes.
TEST(Puzzle1_7_parameter_server_all_reduce, CriticalPathBytes) {
  for (int n : all_world_sizes()) {
    const double bound = n == 1 ? 0.0 : static_cast<double>(n * kS * kElem);
    expect_bytes(kParameterServer, parameter_server(0), n, bound,
                 cat("N*S*elem_size = ", n, "*", kS, "*8"), true);
  }
}

// --- 1.8 ring_all_reduce -------------------------------------------------------------

const AllReduce kRing = [](Comm& comm, Tensor& x) { dtp::ch01::ring_all_reduce(comm, x); };
const std::string kRingName = "ring_all_reduce";

TEST(Puzzle1_8_ring_all_reduce, ExactResults) { exact_results(kRingName, kRing); }
TEST(Puzzle1_8_ring_all_reduce, LargeBuffer) { large_buffer(kRingName, kRing); }
TEST(Puzzle1_8_ring_all_reduce, Dtypes) { dtypes(kRingName, kRing); }
TEST(Puzzle1_8_ring_all_reduce, UsesOnlySendRecv) { uses_only_send_recv(kRingName, kRing); }

// x is [6, 7]: 42 elements, chunks of 11, 11, 11, 9 cut across rows.
TEST(Puzzle1_8_ring_all_reduce, TwoDimensionalShape) {
  expect_all_reduce(kRingName, kRing, fit_world(4), 42, DType::f64, Shape{6, 7}, " shaped [6, 7]");
}

TEST(Puzzle1_8_ring_all_reduce, LatencyRounds) {
  for (int n : all_world_sizes()) expect_rounds(kRingName, kRing, n, 2 * (n - 1), "2(N-1)");
}

// Reduce-scatter then all-gather, each N-1 steps of one chunk of S/N elements.
TEST(Puzzle1_8_ring_all_reduce, CriticalPathBytes) {
  for (int n : all_world_sizes()) {
    expect_bytes(kRingName, kRing, n, static_cast<double>(2 * (n - 1) * (kS / n) * kElem),
                 cat("2(N-1)*(S/N)*elem_size = 2*", n - 1, "*", kS / n, "*8"));
  }
}

// With S not divisible by N the chunks are uneven (ceil-sized, short tail):
// the path carries 2(N-1) chunks, each at most ceil(S/N) elements, and every
// rank sends all chunks but one in each half, at least 2(N-1)*floor(S/N).
TEST(Puzzle1_8_ring_all_reduce, CriticalPathBytesUnevenChunks) {
  const std::int64_t numel = 1009;
  for (int n : all_world_sizes()) {
    const std::vector<RankOutcome> outcomes =
        run_all_reduce(kRingName, kRing, n, numel, DType::f64, CostModel::bytes());
    const std::string context = describe_run(kRingName, n, numel);
    const std::int64_t ceil_chunk = (numel + n - 1) / n;
    const double upper = static_cast<double>(2 * (n - 1) * ceil_chunk * kElem);
    const double lower = static_cast<double>(2 * (n - 1) * (numel / n) * kElem);
    EXPECT_TRUE(clock_matches(
        context, outcomes, ClockUnit::critical_path_bytes, upper,
        formula(cat("2(N-1)*ceil(S/N)*elem_size = 2*", n - 1, "*", ceil_chunk, "*8"), upper),
        true));
    if (!measured(outcomes)) continue;
    EXPECT_GE(max_clock(outcomes), lower)
        << context << " took " << max_clock(outcomes)
        << " bytes on the critical path; a ring moves at least "
        << "2(N-1)*floor(S/N)*elem_size = " << lower << " (is every chunk really sent?)";
  }
}

// Bandwidth optimality: each rank sends 2(N-1) chunk messages, 2(N-1)/N of the data.
TEST(Puzzle1_8_ring_all_reduce, BytesSentPerRank) {
  expect_sent_per_rank(kRingName, kRing, "one chunk to the right in each of the 2(N-1) rounds");
}

// --- 1.9 tree_all_reduce -------------------------------------------------------------

const AllReduce kTree = [](Comm& comm, Tensor& x) { dtp::ch01::tree_all_reduce(comm, x); };
const std::string kTreeName = "tree_all_reduce";

TEST(Puzzle1_9_tree_all_reduce, ExactResults) { exact_results(kTreeName, kTree); }
TEST(Puzzle1_9_tree_all_reduce, LargeBuffer) { large_buffer(kTreeName, kTree); }
TEST(Puzzle1_9_tree_all_reduce, Dtypes) { dtypes(kTreeName, kTree); }
TEST(Puzzle1_9_tree_all_reduce, UsesOnlySendRecv) { uses_only_send_recv(kTreeName, kTree); }

// Reduce then broadcast, ceil(log2 N) rounds each. The clock charges sends,
// not receives, so when N is not a power of two the reduce half can finish a
// round early: exact for powers of two, an upper bound otherwise.
TEST(Puzzle1_9_tree_all_reduce, LatencyRounds) {
  for (int n : all_world_sizes()) {
    expect_rounds(kTreeName, kTree, n, 2 * ceil_log2(n), "2*ceil(log2 N)", !is_power_of_two(n));
  }
}

TEST(Puzzle1_9_tree_all_reduce, CriticalPathBytes) {
  for (int n : all_world_sizes()) {
    expect_bytes(kTreeName, kTree, n, static_cast<double>(2 * ceil_log2(n) * kS * kElem),
                 cat("2*ceil(log2 N)*S*elem_size = 2*", ceil_log2(n), "*", kS, "*8"),
                 !is_power_of_two(n));
  }
}

// --- 1.10 halving_doubling_all_reduce -------------------------------------------------

const AllReduce kHalvingDoubling = [](Comm& comm, Tensor& x) {
  dtp::ch01::halving_doubling_all_reduce(comm, x);
};
const std::string kHalvingDoublingName = "halving_doubling_all_reduce";

TEST(Puzzle1_10_halving_doubling_all_reduce, ExactResults) {
  exact_results(kHalvingDoublingName, kHalvingDoubling);
}
TEST(Puzzle1_10_halving_doubling_all_reduce, LargeBuffer) {
  large_buffer(kHalvingDoublingName, kHalvingDoubling);
}
TEST(Puzzle1_10_halving_doubling_all_reduce, Dtypes) {
  dtypes(kHalvingDoublingName, kHalvingDoubling);
}
TEST(Puzzle1_10_halving_doubling_all_reduce, UsesOnlySendRecv) {
  uses_only_send_recv(kHalvingDoublingName, kHalvingDoubling);
}

// log2 N halving steps and log2 N doubling steps; with P the largest power of
// two <= N, the N-P extra ranks add one round to fold their data in and one to
// get the result back.
TEST(Puzzle1_10_halving_doubling_all_reduce, LatencyRounds) {
  for (int n : all_world_sizes()) {
    if (is_power_of_two(n)) {
      expect_rounds(kHalvingDoublingName, kHalvingDoubling, n, 2 * floor_log2(n), "2*log2 N");
    } else {
      expect_rounds(kHalvingDoublingName, kHalvingDoubling, n, 2 * floor_log2(n) + 2,
                    "2*floor(log2 N)+2", true);
    }
  }
}

// Halving sends S/2 + S/4 + ... + S/P = (P-1)/P*S, doubling the same back.
// The extra ranks' fold and unfold each move all of x on top.
TEST(Puzzle1_10_halving_doubling_all_reduce, CriticalPathBytes) {
  for (int n : all_world_sizes()) {
    const int p = 1 << floor_log2(n);
    const std::int64_t halves = 2 * (p - 1) * (kS / p) * kElem;
    if (is_power_of_two(n)) {
      expect_bytes(kHalvingDoublingName, kHalvingDoubling, n, static_cast<double>(halves),
                   cat("2(N-1)/N*S*elem_size = 2*", n - 1, "*", kS / n, "*8"));
    } else {
      expect_bytes(kHalvingDoublingName, kHalvingDoubling, n,
                   static_cast<double>(halves + 2 * kS * kElem),
                   cat("(2(P-1)/P + 2)*S*elem_size with P = ", p, ", S = ", kS), true);
    }
  }
}

// --- 1.11 direct_all_reduce ----------------------------------------------------------

const AllReduce kDirect = [](Comm& comm, Tensor& x) { dtp::ch01::direct_all_reduce(comm, x); };
const std::string kDirectName = "direct_all_reduce";

TEST(Puzzle1_11_direct_all_reduce, ExactResults) { exact_results(kDirectName, kDirect); }
TEST(Puzzle1_11_direct_all_reduce, LargeBuffer) { large_buffer(kDirectName, kDirect); }
TEST(Puzzle1_11_direct_all_reduce, Dtypes) { dtypes(kDirectName, kDirect); }
TEST(Puzzle1_11_direct_all_reduce, UsesOnlySendRecv) { uses_only_send_recv(kDirectName, kDirect); }

// The point of the algorithm: with a link to every peer, each step's N-1
// messages travel at once, so the whole all-reduce is 2 rounds for any N. A
// solution that waits for one peer before sending to the next serializes them.
TEST(Puzzle1_11_direct_all_reduce, TwoRoundsWithALinkToEveryPeer) {
  for (int n : all_world_sizes()) {
    expect_rounds(kDirectName, kDirect, n, n == 1 ? 0 : 2,
                  n == 1 ? "0 (one rank)"
                         : "2 steps x 1 round (every irecv and isend of a step posted "
                           "before any wait)",
                  false, Links::one_per_peer);
  }
}

// Through one link per rank the N-1 messages of a step queue one after
// another: 2(N-1) rounds, the same as the ring.
TEST(Puzzle1_11_direct_all_reduce, LatencyRoundsThroughOneLink) {
  for (int n : all_world_sizes()) expect_rounds(kDirectName, kDirect, n, 2 * (n - 1), "2(N-1)");
}

// Each step moves one chunk of S/N per message: with a link to every peer the
// path carries 2 chunks; through one link, the 2(N-1) chunks a rank sends.
TEST(Puzzle1_11_direct_all_reduce, CriticalPathBytes) {
  for (int n : all_world_sizes()) {
    const std::int64_t chunk = kS / n;
    expect_bytes(kDirectName, kDirect, n, static_cast<double>(n == 1 ? 0 : 2 * chunk * kElem),
                 cat("2*(S/N)*elem_size = 2*", chunk, "*8"), false, Links::one_per_peer);
    expect_bytes(kDirectName, kDirect, n, static_cast<double>(2 * (n - 1) * chunk * kElem),
                 cat("2(N-1)*(S/N)*elem_size = 2*", n - 1, "*", chunk, "*8"));
  }
}

// Every rank sends one chunk to each peer in each step: 2(N-1) messages and
// 2(N-1)/N of the data, so N(N-1) messages per step over the whole world.
TEST(Puzzle1_11_direct_all_reduce, MessagesAndBytesPerRank) {
  expect_sent_per_rank(kDirectName, kDirect,
                       "one chunk to each of the N-1 peers in each of the two steps");
}

}  // namespace
