// Puzzle 10.5: ZeRO++. qwZ's quantized all-gather and qgZ's quantized
// reduce-scatter against the checker's own quantize and dequantize of every
// rank's data, bit for bit on every rank, with their bytes by the lesson's
// formula from chunk_range's (uneven) lengths; hpZ's secondary partition
// on 2 nodes of 2 ranks, whose gather stays on the node's communicator.
// Every tensor handed over is made on the rank's device (comm.device()).
#include "compression_checks.h"

namespace dtp::testing::compression {
namespace {

/// Rank @p rank's values: normal values times (rank + 1), with an outlier
/// (x 40) every 13th element, so blocks get scales of their own.
std::vector<double> rank_values(int rank, std::int64_t n, DType dtype) {
  Rng rng(Rng::derive(505, static_cast<std::uint64_t>(rank)));
  std::vector<double> x;
  for (std::int64_t i = 0; i < n; ++i)
    x.push_back(in_dtype(dtype, (rank + 1) * rng.normal() * (i % 13 == 5 ? 40 : 1)));
  return x;
}

std::vector<double> slice_of(const std::vector<double>& x, ChunkRange range) {
  return {x.begin() + range.offset, x.begin() + range.offset + range.length};
}

/// "element 40 (chunk 1 of 3, offset 6)".
std::string where(std::int64_t i, std::int64_t numel, int world) {
  for (int c = 0; c < world; ++c) {
    const ChunkRange range = chunk_range(numel, world, c);
    if (i >= range.offset && i < range.offset + range.length)
      return "element " + std::to_string(i) + " (chunk " + std::to_string(c) + " of " +
             std::to_string(world) + ", offset " + std::to_string(i - range.offset) + ")";
  }
  return "element " + std::to_string(i);
}

/// The first element where @p got and @p expected differ in bits (-1: none), and how many do.
std::pair<std::int64_t, std::int64_t> first_difference(const std::vector<double>& expected,
                                                       const std::vector<double>& got) {
  std::int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (!same_bits(expected[i], got[i]) && wrong++ == 0) first = static_cast<std::int64_t>(i);
  return {first, wrong};
}

std::string bytes_failure(const std::string& who, const std::string& expected_calls,
                          const std::map<std::string, std::int64_t>& calls, std::int64_t expected,
                          const std::string& formula, std::int64_t got, std::int64_t float_bytes) {
  if (calls_text(calls) == expected_calls && got == expected) return "";
  std::ostringstream out;
  out << who << ": expected " << expected_calls << " moving " << formula << " = " << expected
      << " bytes, got " << calls_text(calls) << " moving " << got << " bytes";
  if (got == float_bytes) out << ": the floats travelled unquantized";
  return out.str();
}

// --- qwZ ------------------------------------------------------------------------------

std::string qwz_text(int world, std::int64_t numel, std::int64_t block, DType dtype) {
  std::ostringstream out;
  out << "quantized_all_gather on " << world << " rank(s), full of " << numel << " "
      << dtype_name(dtype) << ", block " << block;
  return out.str();
}

// Rank r's shard is rank_values(r) over its chunk; every rank's full must be
// the concatenation of every shard quantized (8 bits) and dequantized.
std::string check_qwz(Comm& comm, std::int64_t numel, std::int64_t block, DType dtype) {
  const int world = comm.size(), rank = comm.rank();
  std::vector<double> expected, raw;
  std::int64_t expected_bytes = 0;
  std::string formula;
  for (int r = 0; r < world; ++r) {
    const std::int64_t length = chunk_range(numel, world, r).length;
    const std::vector<double> shard = rank_values(r, length, dtype);
    const Quantization q = quantize_like_the_contract(shard, dtype, 8, block);
    expected.insert(expected.end(), q.values.begin(), q.values.end());
    raw.insert(raw.end(), shard.begin(), shard.end());
    expected_bytes += wire_bytes(length, 8, block, dtype);
    formula += (r == 0 ? "" : " + ") + wire_formula(length, 8, block, dtype);
  }
  const Tensor shard = Tensor::from_values(
      rank_values(rank, chunk_range(numel, world, rank).length, dtype), dtype, comm.device());
  Tensor full = Tensor::full(Shape{numel}, kUnwritten, dtype, comm.device());
  const CommStats before = comm.stats();
  dtp::ch10::quantized_all_gather(comm, shard, full, block);
  const CommStats after = comm.stats();

  const std::vector<double> got = full.to_vector();
  const auto [first, wrong] = first_difference(expected, got);
  if (first >= 0) {
    const auto i = static_cast<std::size_t>(first);
    int owner = 0;
    while (first >=
           chunk_range(numel, world, owner).offset + chunk_range(numel, world, owner).length)
      ++owner;
    std::string why;
    if (got[i] == kUnwritten)
      why = "the fill value: rank " + std::to_string(owner) + "'s part of full was never written";
    else if (same_bits(got[i], raw[i]) && owner == rank)
      why =
          "this rank's own shard copied as it is: dequantize it from its codes like the "
          "others', so every replica holds the same bits";
    else if (same_bits(got[i], raw[i]))
      why = "rank " + std::to_string(owner) + "'s raw value: the shards travelled unquantized";
    std::ostringstream out;
    out << "rank " << rank << ", " << where(first, numel, world) << " of full (rank " << owner
        << "'s shard): expected " << text(expected[i]) << " (quantized to 8 bits in blocks of "
        << block << " of the shard, and back), got " << text(got[i]) << " (" << wrong << " of "
        << numel << " elements differ)" << (why.empty() ? "" : ": ") << why;
    return out.str();
  }
  return bytes_failure("rank " + std::to_string(rank), "all_gather x2",
                       calls_between(before, after), expected_bytes,
                       "each shard's 4 * words + scales * " + std::to_string(dtype_size(dtype)) +
                           ", summed: " + formula,
                       after.collective_bytes - before.collective_bytes,
                       numel * static_cast<std::int64_t>(dtype_size(dtype)));
}

// Lengths: one value (one rank holds it), fewer values than ranks, uneven
// shards, and blocks that do and do not divide them.
TEST(Puzzle10_5_zero_plus_plus, QuantizedAllGatherBitForBit) {
  const DType dtype = data_dtype();
  for (int world : chapter_worlds())
    for (std::int64_t numel : {1, 3, 37, 203})
      for (std::int64_t block : {8, 32}) {
        run_and_check(qwz_text(world, numel, block, dtype), world,
                      [&](Comm& comm) { return check_qwz(comm, numel, block, dtype); });
        if (stop_sweep()) return;
      }
}

// --- qgZ ------------------------------------------------------------------------------

std::string qgz_text(int world, std::int64_t numel, int bits, std::int64_t block, DType dtype) {
  std::ostringstream out;
  out << "quantized_reduce_scatter on " << world << " rank(s), full of " << numel << " "
      << dtype_name(dtype) << ", " << bits << " bits, block " << block;
  return out.str();
}

// Rank i's full is rank_values(i). Rank j's shard must be
// (d_0 + d_1 + ... + d_{N-1}) / N in rank order, d_i being chunk j of rank
// i's full quantized and dequantized.
std::string check_qgz(Comm& comm, std::int64_t numel, int bits, std::int64_t block, DType dtype) {
  const int world = comm.size(), rank = comm.rank();
  const ChunkRange mine = chunk_range(numel, world, rank);
  std::vector<double> expected(static_cast<std::size_t>(mine.length), 0.0);
  std::vector<double> summed = expected, exact = expected, own;
  for (int i = 0; i < world; ++i) {
    const std::vector<double> chunk = slice_of(rank_values(i, numel, dtype), mine);
    const Quantization q = quantize_like_the_contract(chunk, dtype, bits, block);
    for (std::size_t k = 0; k < chunk.size(); ++k) {
      summed[k] = in_dtype(dtype, summed[k] + q.values[k]);
      exact[k] = in_dtype(dtype, exact[k] + chunk[k]);
    }
    if (i == rank) own = q.values;
  }
  for (std::size_t k = 0; k < expected.size(); ++k) {
    expected[k] = in_dtype(dtype, summed[k] / world);
    exact[k] = in_dtype(dtype, exact[k] / world);
  }
  std::int64_t expected_bytes = 0;
  std::string formula;
  for (int j = 0; j < world; ++j) {
    const std::int64_t length = chunk_range(numel, world, j).length;
    expected_bytes += wire_bytes(length, bits, block, dtype);
    formula += (j == 0 ? "" : " + ") + wire_formula(length, bits, block, dtype);
  }

  const Tensor full = Tensor::from_values(rank_values(rank, numel, dtype), dtype, comm.device());
  Tensor shard = Tensor::full(Shape{mine.length}, kUnwritten, dtype, comm.device());
  const CommStats before = comm.stats();
  dtp::ch10::quantized_reduce_scatter(comm, full, shard, bits, block);
  const CommStats after = comm.stats();

  const std::vector<double> got = shard.to_vector();
  const auto [first, wrong] = first_difference(expected, got);
  if (first >= 0) {
    const auto k = static_cast<std::size_t>(first);
    std::string why;
    if (got[k] == kUnwritten)
      why = "the fill value: never written";
    else if (std::equal(got.begin(), got.end(), summed.begin(), same_bits) && world > 1)
      why = "summed without dividing by N";
    else if (std::equal(got.begin(), got.end(), exact.begin(), same_bits))
      why = "the exact mean of the raw chunks: they were not quantized";
    else if (std::equal(got.begin(), got.end(), own.begin(), same_bits) && world > 1)
      why = "this rank's own chunk alone: average the N chunks that arrived";
    else if (std::fabs(got[k] - expected[k]) <=
             4.0 * world * unit_roundoff(dtype) * std::fabs(expected[k]))
      why =
          "right up to rounding: add d_0 + d_1 + ... in rank order, then divide by N, in the "
          "dtype";
    std::ostringstream out;
    out << "rank " << rank << ", element " << first << " of its shard (element "
        << mine.offset + first << " of full): expected " << text(expected[k])
        << " (the mean over ranks, in rank order, of that element quantized to " << bits
        << " bits and back), got " << text(got[k]) << " (" << wrong << " of " << mine.length
        << " elements differ)" << (why.empty() ? "" : ": ") << why;
    return out.str();
  }
  return bytes_failure("rank " + std::to_string(rank), "all_to_all_v x2",
                       calls_between(before, after), expected_bytes,
                       "each chunk's 4 * words + scales * " + std::to_string(dtype_size(dtype)) +
                           ", summed: " + formula,
                       after.collective_bytes - before.collective_bytes,
                       numel * static_cast<std::int64_t>(dtype_size(dtype)));
}

TEST(Puzzle10_5_zero_plus_plus, QuantizedReduceScatterBitForBit) {
  const DType dtype = data_dtype();
  for (int world : chapter_worlds())
    for (std::int64_t numel : {3, 37, 203})
      for (auto [bits, block] : {std::pair<int, std::int64_t>{8, 32}, {4, 8}}) {
        run_and_check(qgz_text(world, numel, bits, block, dtype), world,
                      [&](Comm& comm) { return check_qgz(comm, numel, bits, block, dtype); });
        if (stop_sweep()) return;
      }
}

// --- hpZ ------------------------------------------------------------------------------

// A world of 4 as 2 nodes of 2 (ranks 0, 1 and 2, 3). Every rank holds the
// same full (after the forward's all-gather): 37 values, 19 and 18 per node
// rank. The secondary shard is a copy of chunk node.rank(); the backward's
// gather rebuilds full from the node alone. secondary_all_gather is handed
// the checker's own secondary shard, so a wrong secondary_shard is reported
// as such (and every rank still makes the same gather).
TEST(Puzzle10_5_zero_plus_plus, SecondaryPartitionStaysInTheNode) {
  if (!world_fits(4)) GTEST_SKIP() << "needs 4 ranks; mpiexec started fewer processes";
  const DType dtype = data_dtype();
  constexpr std::int64_t kNumel = 37;
  const std::vector<double> values = rank_values(7, kNumel, dtype);
  run_and_check("hpZ on 4 ranks in 2 nodes of 2, full of 37", 4, [&](Comm& comm) -> std::string {
    Comm node = comm.split(comm.rank() / 2, comm.rank());
    const std::string who = "rank " + std::to_string(comm.rank()) + " (node rank " +
                            std::to_string(node.rank()) + " of node " +
                            std::to_string(comm.rank() / 2) + ")";
    const Tensor full = Tensor::from_values(values, dtype, comm.device());
    const CommStats world_before = comm.stats(), node_before = node.stats();
    const Tensor secondary = dtp::ch10::secondary_shard(node, full);
    const CommStats node_between = node.stats();
    const ChunkRange range = chunk_range(kNumel, node.size(), node.rank());
    const std::vector<double> expected = slice_of(values, range);
    Tensor rebuilt = Tensor::full(Shape{kNumel}, kUnwritten, dtype, comm.device());
    dtp::ch10::secondary_all_gather(node, Tensor::from_values(expected, dtype, comm.device()),
                                    rebuilt);
    const CommStats world_after = comm.stats(), node_after = node.stats();

    const std::vector<double> got = secondary.to_vector();
    if (got.size() != expected.size() || first_difference(expected, got).first >= 0) {
      std::string why;
      const ChunkRange primary = chunk_range(kNumel, comm.size(), comm.rank());
      if (got == slice_of(values, primary))
        why =
            ": ZeRO-3's primary shard (chunk rank of world.size()); the secondary one is chunk "
            "node.rank() of node.size()";
      return who + ": secondary_shard expected chunk " + std::to_string(node.rank()) + " of " +
             std::to_string(node.size()) + " of full (elements " + std::to_string(range.offset) +
             " to " + std::to_string(range.offset + range.length - 1) + ", " +
             std::to_string(range.length) + " values), got " + std::to_string(got.size()) +
             " values" + (got.empty() ? "" : " starting " + text(got[0])) + why;
    }
    if (secondary.shares_storage_with(full))
      return who +
             ": secondary_shard returned a view of full; it must be a copy (full is freed "
             "after the forward)";
    if (!calls_between(node_before, node_between).empty())
      return who + ": secondary_shard made " +
             calls_text(calls_between(node_before, node_between)) +
             " on the node: the chunk is in full already";
    const auto [first, wrong] = first_difference(values, rebuilt.to_vector());
    if (first >= 0)
      return who + ": secondary_all_gather, " + where(first, kNumel, node.size()) +
             " of full: expected " + text(values[static_cast<std::size_t>(first)]) + ", got " +
             text(rebuilt.to_vector()[static_cast<std::size_t>(first)]) + " (" +
             std::to_string(wrong) + " of " + std::to_string(kNumel) + " differ)";
    const auto world_calls = calls_between(world_before, world_after);
    if (!world_calls.empty() || world_after.collective_bytes != world_before.collective_bytes)
      return who + ": the world communicator carried " + calls_text(world_calls) + ", " +
             std::to_string(world_after.collective_bytes - world_before.collective_bytes) +
             " bytes: hpZ's gather crosses no node boundary (use the node communicator)";
    const std::int64_t full_bytes = kNumel * static_cast<std::int64_t>(dtype_size(dtype));
    return bytes_failure(who + " on the node communicator", "all_gather x1",
                         calls_between(node_between, node_after), full_bytes,
                         "full's bytes, 37 * " + std::to_string(dtype_size(dtype)),
                         node_after.collective_bytes - node_between.collective_bytes, -1);
  });
}

// --- bad arguments ---------------------------------------------------------------------

// Every rank passes a shard one value short of its chunk of 13 values on 2
// ranks (7 and 6): the short shards still make as many words and scales as
// the right ones, so only a check of the length itself refuses them.
TEST(Puzzle10_5_zero_plus_plus, ShardsOfTheWrongLengthAreRefused) {
  const DType dtype = data_dtype();
  const int world = std::min(2, chapter_worlds().back());
  run_and_check("ZeRO++ with shards one value short", world, [&](Comm& comm) -> std::string {
    const std::int64_t mine = chunk_range(13, comm.size(), comm.rank()).length;
    const std::string who = "rank " + std::to_string(comm.rank()) + ": ";
    Tensor full = Tensor::zeros(Shape{13}, dtype, comm.device());
    Tensor short_shard = Tensor::full(Shape{mine - 1}, 0.5, dtype, comm.device());
    std::string message =
        dtp_error_of([&] { dtp::ch10::quantized_all_gather(comm, short_shard, full, 8); });
    if (!refused(message))
      return who + "quantized_all_gather with a shard of " + std::to_string(mine - 1) +
             " values for a chunk of " + std::to_string(mine) +
             " must throw a dtp::Error, got: " + message;
    message =
        dtp_error_of([&] { dtp::ch10::quantized_reduce_scatter(comm, full, short_shard, 8, 8); });
    if (!refused(message))
      return who + "quantized_reduce_scatter into a shard of " + std::to_string(mine - 1) +
             " values for a chunk of " + std::to_string(mine) +
             " must throw a dtp::Error, got: " + message;
    message = dtp_error_of([&] { dtp::ch10::secondary_all_gather(comm, short_shard, full); });
    if (!refused(message))
      return who + "secondary_all_gather of a secondary shard of " + std::to_string(mine - 1) +
             " values for a chunk of " + std::to_string(mine) +
             " must throw a dtp::Error, got: " + message;
    return "";
  });
}

}  // namespace
}  // namespace dtp::testing::compression
