/// @file collectives_checks.h
/// @brief What every chapter 01 checker shares: the sizes it sweeps, a runner
/// that keeps each rank's result and CommStats, and the checks on those stats
/// (no library collectives, latency rounds and bytes on the alpha-beta clock).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "01_collectives/collectives.h"
#include "support/harness.h"

namespace dtp::testing::ch01 {

/// What an output buffer holds before the collective writes it: never a
/// pattern value, so a chunk that never arrives shows.
inline constexpr double kPoison = -1.0;

/// The buffer lengths every exact-results test sweeps on N ranks: one element,
/// fewer than N (N-1 is 0 elements when N = 1), exactly N, and a prime.
inline std::vector<std::int64_t> exact_lengths(int n) {
  std::vector<std::int64_t> lengths;
  for (std::int64_t length :
       {std::int64_t{1}, std::int64_t{n - 1}, std::int64_t{n}, std::int64_t{1009}}) {
    if (std::find(lengths.begin(), lengths.end(), length) == lengths.end())
      lengths.push_back(length);
  }
  return lengths;
}

/// A buffer of more than a million elements that no world size divides evenly.
inline constexpr std::int64_t kLargeLength = (std::int64_t{1} << 20) + 7;
/// The largest world the checkers may start (8; under mpi, the process count).
inline int largest_world() { return all_world_sizes().back(); }
/// @p n, or the largest world that can be started when that is smaller.
inline int fit_world(int n) { return std::min(n, largest_world()); }
/// The root @p wanted, moved into the ranks of a world of @p n: a fitted
/// world may be smaller than the root a test names (one GPU gives NCCL a
/// world of one).
inline int root_in(int n, int wanted) { return std::clamp(wanted, 0, n - 1); }
/// The world sizes the large-buffer tests use (keeps the suite fast).
inline std::vector<int> large_world_sizes() {
  std::vector<int> sizes;
  for (int n : {2, 5, 8}) {
    const int fitted = fit_world(n);
    if (std::find(sizes.begin(), sizes.end(), fitted) == sizes.end()) sizes.push_back(fitted);
  }
  return sizes;
}

/// True when ranks may be processes (mpi, nccl): every process must then make
/// the same launches in the same order, so a sweep never stops early on one
/// process's failed expectation.
inline bool ranks_are_processes() { return World::from_env(1).backend != Backend::thread; }
/// Whether a sweep may stop after a failure (keeps the report short).
inline bool stop_sweep() { return ::testing::Test::HasFailure() && !ranks_are_processes(); }
/// lcm(1..8): divisible by every world size, so byte formulas are exact.
inline constexpr std::int64_t kDivisibleLength = 840;

inline int ceil_log2(int n) {
  int rounds = 0;
  while ((1 << rounds) < n) ++rounds;
  return rounds;
}
inline int floor_log2(int n) {
  int rounds = 0;
  while ((2 << rounds) <= n) ++rounds;
  return rounds;
}
inline bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

/// "ring_all_reduce on N=4 with 1009 f64 elements".
inline std::string describe_run(const std::string& puzzle, int n, std::int64_t numel,
                                DType dtype = DType::f64) {
  std::ostringstream out;
  out << puzzle << " on N=" << n << " with " << numel << " " << dtype_name(dtype) << " elements";
  return out.str();
}

/// What one rank ended with: the values the checker reads and its CommStats.
/// On the thread backend every rank runs in this process. Under mpi (or nccl
/// across processes) only this process's rank has values (`here`); the counters and clocks of the
/// others are exchanged after the puzzle returns (`has_stats`), so the clock checks see every rank.
/// A process that sat a smaller world out has neither.
struct RankOutcome {
  bool here = false;
  bool has_stats = false;
  std::vector<double> values;
  CommStats stats;
};

namespace detail {
// The counters exchanged between processes, as doubles.
constexpr int kStatFields = 6;
inline void stats_to_row(const CommStats& stats, double* row) {
  row[0] = stats.clock;
  row[1] = static_cast<double>(stats.messages_sent);
  row[2] = static_cast<double>(stats.bytes_sent);
  row[3] = static_cast<double>(stats.messages_received);
  row[4] = static_cast<double>(stats.bytes_received);
  row[5] = static_cast<double>(stats.total_collective_calls());
}
inline CommStats row_to_stats(const double* row) {
  CommStats stats;
  stats.clock = row[0];
  stats.messages_sent = static_cast<std::int64_t>(row[1]);
  stats.bytes_sent = static_cast<std::int64_t>(row[2]);
  stats.messages_received = static_cast<std::int64_t>(row[3]);
  stats.bytes_received = static_cast<std::int64_t>(row[4]);
  if (row[5] > 0)
    stats.collective_calls["(a library collective)"] = static_cast<std::int64_t>(row[5]);
  return stats;
}
}  // namespace detail

/// Runs @p body on @p n ranks and returns each rank's outcome, indexed by rank.
/// The body prepares its tensors, calls comm.reset_stats() right before the
/// puzzle, calls it and returns the values to check; the stats are read after
/// it returns. A rank failure propagates as the exception gtest reports; an
/// unsolved stub's message is kept as it is ("rank 0: puzzle 1.4 ... is not
/// solved yet"), any other failure is prefixed with @p context (which run).
inline std::vector<RankOutcome> run_puzzle(int n, const std::string& context,
                                           const std::function<std::vector<double>(Comm&)>& body,
                                           CostModel cost = {}) {
  std::vector<RankOutcome> outcomes(static_cast<std::size_t>(n));
  std::vector<std::vector<double>> tables(static_cast<std::size_t>(n));  // every rank's stats rows
  try {
    run_ranks(
        n,
        [&](Comm& comm) {
          std::vector<double> values = body(comm);
          const CommStats stats = comm.stats();
          RankOutcome& outcome = outcomes[static_cast<std::size_t>(comm.rank())];
          outcome.values = std::move(values);
          outcome.stats = stats;
          outcome.here = outcome.has_stats = true;
          if (comm.backend_name() == "thread") return;  // every rank is in this process
          // Measured already, so the library collective here is not counted.
          std::vector<double> row(detail::kStatFields);
          detail::stats_to_row(stats, row.data());
          const Tensor mine = Tensor::from_values(row, DType::f64).to(comm.device());
          Tensor all =
              Tensor::zeros(Shape{detail::kStatFields * comm.size()}, DType::f64, comm.device());
          comm.all_gather(mine, all);
          tables[static_cast<std::size_t>(comm.rank())] = all.to_vector();
        },
        cost);
  } catch (const RankFailure& failure) {
    bool not_solved = false;
    try {
      if (failure.original()) std::rethrow_exception(failure.original());
    } catch (const NotSolved&) {
      not_solved = true;
    } catch (...) {
    }
    if (not_solved) throw;
    throw std::runtime_error(context + ": " + failure.what());
  }
  for (const std::vector<double>& table : tables) {
    if (table.empty()) continue;
    for (int rank = 0; rank < n; ++rank) {
      RankOutcome& outcome = outcomes[static_cast<std::size_t>(rank)];
      if (outcome.has_stats) continue;
      outcome.stats =
          detail::row_to_stats(&table[static_cast<std::size_t>(rank * detail::kStatFields)]);
      outcome.has_stats = true;
    }
    break;
  }
  return outcomes;
}

/// False when this process sat the run out (mpi, a world smaller than the
/// process count): it has no rank's counters to check.
inline bool measured(const std::vector<RankOutcome>& outcomes) {
  return std::any_of(outcomes.begin(), outcomes.end(),
                     [](const RankOutcome& outcome) { return outcome.has_stats; });
}

/// Chapter 01 builds collectives from send/recv: no rank may have called a
/// library collective, and with two or more ranks some rank must have sent a
/// message (when @p expect_messages).
inline ::testing::AssertionResult only_send_recv(const std::string& puzzle,
                                                 const std::string& context,
                                                 const std::vector<RankOutcome>& outcomes,
                                                 bool expect_messages = true) {
  std::int64_t messages = 0;
  for (std::size_t rank = 0; rank < outcomes.size(); ++rank) {
    if (!outcomes[rank].has_stats) continue;
    const CommStats& stats = outcomes[rank].stats;
    messages += stats.messages_sent;
    if (stats.total_collective_calls() == 0) continue;
    ::testing::AssertionResult failure = ::testing::AssertionFailure();
    failure << context << ": rank " << rank << ": " << puzzle << " called the library collective";
    bool first = true;
    for (const auto& [kind, calls] : stats.collective_calls) {
      if (calls == 0) continue;
      failure << (first ? " " : ", ") << (kind.front() == '(' ? kind : "Comm::" + kind) << " ("
              << calls << "x)";
      first = false;
    }
    failure << "; chapter 01 builds collectives from send/recv only";
    return failure;
  }
  if (expect_messages && measured(outcomes) && outcomes.size() >= 2 && messages == 0) {
    return ::testing::AssertionFailure()
           << context << ": no rank sent a message (CommStats::messages_sent is 0 everywhere); "
           << puzzle << " must move the data with Comm::send/recv";
  }
  return ::testing::AssertionSuccess();
}

/// The largest simulated clock over the ranks: the time the collective took.
inline double max_clock(const std::vector<RankOutcome>& outcomes) {
  double clock = 0.0;
  for (const RankOutcome& outcome : outcomes) {
    if (outcome.has_stats) clock = std::max(clock, outcome.stats.clock);
  }
  return clock;
}

/// The rank whose clock is the largest (where the critical path ends).
inline int slowest_rank(const std::vector<RankOutcome>& outcomes) {
  int slowest = 0;
  for (std::size_t rank = 0; rank < outcomes.size(); ++rank) {
    if (outcomes[rank].stats.clock > outcomes[static_cast<std::size_t>(slowest)].stats.clock) {
      slowest = static_cast<int>(rank);
    }
  }
  return slowest;
}

/// How the clock is read: latency rounds under CostModel::latency_rounds(),
/// bytes on the critical path under CostModel::bytes().
enum class ClockUnit { latency_rounds, critical_path_bytes };

inline const char* unit_name(ClockUnit unit) {
  return unit == ClockUnit::latency_rounds ? "latency rounds" : "bytes on the critical path";
}

/// The max clock over ranks must equal @p expected (or be at most it when
/// @p at_most); @p formula says where the number comes from, e.g. "2(N-1) = 6".
inline ::testing::AssertionResult clock_matches(const std::string& context,
                                                const std::vector<RankOutcome>& outcomes,
                                                ClockUnit unit, double expected,
                                                const std::string& formula, bool at_most = false,
                                                bool link_per_peer = false) {
  if (!measured(outcomes)) return ::testing::AssertionSuccess();  // this process sat the run out
  const double took = max_clock(outcomes);
  const bool ok = at_most ? took <= expected : took == expected;
  if (ok) return ::testing::AssertionSuccess();
  std::ostringstream took_text;
  took_text << std::setprecision(17) << took;
  return ::testing::AssertionFailure()
         << context << " took " << took_text.str() << " " << unit_name(unit) << " (slowest rank "
         << slowest_rank(outcomes) << "); expected " << (at_most ? "at most " : "") << formula
         << " (a send costs " << (unit == ClockUnit::latency_rounds ? "1" : "its bytes")
         << (link_per_peer ? " on the link to its peer, and sends to different peers travel at once"
                           : " on the sender's clock")
         << "; a recv waits for the message)";
}

/// "ceil(log2 N) = 3" style formula text.
inline std::string formula(const std::string& text, double value) {
  std::ostringstream out;
  out << text << " = " << static_cast<long long>(value);
  return out.str();
}

/// The concatenation of each rank's pattern over its chunk of @p numel:
/// what an all-gather of pattern shards produces.
inline std::vector<double> gathered_pattern(int n, std::int64_t numel, DType dtype = DType::f64) {
  std::vector<double> full;
  full.reserve(static_cast<std::size_t>(numel));
  for (int rank = 0; rank < n; ++rank) {
    const std::vector<double> shard =
        pattern_values(rank, chunk_range(numel, n, rank).length, dtype);
    full.insert(full.end(), shard.begin(), shard.end());
  }
  return full;
}

/// Elements [offset, offset + length) of @p values.
inline std::vector<double> slice_of(const std::vector<double>& values, ChunkRange range) {
  return std::vector<double>(values.begin() + range.offset,
                             values.begin() + range.offset + range.length);
}

/// Every rank in @p ranks (all ranks when empty) that ran in this process must
/// hold expected(rank).
/// Reports the first few wrong ranks through values_equal, with chunk
/// locations when @p chunks > 0 and values decoded in words under @p key
/// ("got 16777217 = rank 1's element 0 alone").
inline ::testing::AssertionResult ranks_hold(
    const std::string& context, const std::vector<RankOutcome>& outcomes,
    const std::function<std::vector<double>(int)>& expected, int chunks, PatternKey key,
    std::vector<int> ranks = {}) {
  if (ranks.empty()) {
    for (std::size_t rank = 0; rank < outcomes.size(); ++rank)
      ranks.push_back(static_cast<int>(rank));
  }
  constexpr int kShownRanks = 3;
  int wrong_ranks = 0;
  std::ostringstream report;
  for (int rank : ranks) {
    if (!outcomes[static_cast<std::size_t>(rank)].here) continue;  // another process checks it
    ::testing::AssertionResult same =
        values_equal(context, rank, expected(rank), outcomes[static_cast<std::size_t>(rank)].values,
                     chunks, key);
    if (same) continue;
    if (wrong_ranks < kShownRanks) report << (wrong_ranks ? "\n" : "") << same.message();
    ++wrong_ranks;
  }
  if (wrong_ranks == 0) return ::testing::AssertionSuccess();
  if (wrong_ranks > kShownRanks)
    report << "\n(" << wrong_ranks - kShownRanks << " more ranks wrong)";
  return ::testing::AssertionFailure() << report.str();
}

/// Concatenates the parts as a stream would print them.
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

/// Keys for decoding values in messages: the collective copies or sums.
inline PatternKey copies_of(int n, DType dtype) {
  return PatternKey{n, dtype, PatternMeaning::copies};
}
inline PatternKey sums_of(int n, DType dtype) { return PatternKey{n, dtype, PatternMeaning::sums}; }

/// The dtypes every puzzle is also run with besides f64.
inline std::vector<DType> other_dtypes() { return {DType::f32, DType::i32}; }

}  // namespace dtp::testing::ch01
