// Which positions a rank holds, and moving rows of axis 1 between a whole
// sequence, a rank's shard and its pieces. For every batch row b the
// positions [start, start + length) of x [B, T, ...] are one contiguous run
// of memory, so each move is B copies of a run (on any device).
#include <string>

#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

namespace {

// x's shape with axis 1 set to @p length.
Shape with_positions(const Tensor& x, std::int64_t length) {
  std::vector<std::int64_t> dims;
  for (int d = 0; d < x.ndim(); ++d) dims.push_back(d == 1 ? length : x.size(d));
  return Shape(dims);
}

void check_rows_tensor(const char* what, const Tensor& x) {
  DTP_CHECK(x.defined() && x.ndim() >= 2, what, ": expects a tensor [B, T, ...], got ",
            x.describe());
}

// dst[b, dst_at + i, ...] = src[b, src_at + i, ...] for i < count, every b.
void copy_rows(const Tensor& src, std::int64_t src_at, Tensor& dst, std::int64_t dst_at,
               std::int64_t count) {
  const std::int64_t B = src.size(0), row = src.numel() / (B * src.size(1));
  for (std::int64_t b = 0; b < B; ++b) {
    Tensor to = dst.flatten().slice((b * dst.size(1) + dst_at) * row, count * row);
    to.copy_from(src.flatten().slice((b * src.size(1) + src_at) * row, count * row));
  }
}

std::int64_t total_length(const std::vector<PositionRange>& ranges) {
  std::int64_t total = 0;
  for (const PositionRange& r : ranges) total += r.length;
  return total;
}

}  // namespace

const char* sequence_layout_name(SequenceLayout layout) {
  return layout == SequenceLayout::zigzag ? "zigzag" : "contiguous";
}

std::vector<PositionRange> positions_of(std::int64_t T, int n, int rank, SequenceLayout layout) {
  DTP_CHECK(n >= 1 && rank >= 0 && rank < n, "positions_of: rank ", rank, " is not in [0, n = ", n,
            ")");
  DTP_CHECK(T >= 1, "positions_of: the sequence must have at least one position, got T = ", T);
  if (layout == SequenceLayout::contiguous) {
    DTP_CHECK(T % n == 0, "sequence parallelism: T = ", T, " does not split into n = ", n,
              " equal contiguous shards (pick a sequence length that divides by ", n, ")");
    return {{rank * (T / n), T / n}};
  }
  DTP_CHECK(T % (2 * n) == 0, "sequence parallelism: T = ", T, " does not split into 2 x ", n,
            " = ", 2 * n, " zigzag chunks (pick a sequence length that divides by ", 2 * n, ")");
  const std::int64_t chunk = T / (2 * n);
  return {{rank * chunk, chunk}, {(2 * n - 1 - rank) * chunk, chunk}};
}

bool block_visible(const PositionRange& queries, const PositionRange& keys) {
  return queries.length > 0 && keys.length > 0 && keys.start <= queries.end() - 1;
}

Tensor take_positions(const Tensor& x, const std::vector<PositionRange>& ranges) {
  check_rows_tensor("take_positions", x);
  Tensor shard = Tensor::empty(with_positions(x, total_length(ranges)), x.dtype(), x.device());
  std::int64_t at = 0;
  for (const PositionRange& r : ranges) {
    DTP_CHECK(r.start >= 0 && r.end() <= x.size(1), "take_positions: positions [", r.start, ", ",
              r.end(), ") are outside the sequence's ", x.size(1));
    copy_rows(x, r.start, shard, at, r.length);
    at += r.length;
  }
  return shard;
}

void put_positions(const Tensor& shard, const std::vector<PositionRange>& ranges, Tensor& x) {
  check_rows_tensor("put_positions", x);
  check_rows_tensor("put_positions", shard);
  DTP_CHECK(shard.size(1) == total_length(ranges) &&
                shard.numel() / shard.size(1) == x.numel() / x.size(1),
            "put_positions: the shard ", shard.describe(), " does not hold ", total_length(ranges),
            " positions shaped like rows of ", x.describe());
  std::int64_t at = 0;
  for (const PositionRange& r : ranges) {
    DTP_CHECK(r.start >= 0 && r.end() <= x.size(1), "put_positions: positions [", r.start, ", ",
              r.end(), ") are outside the sequence's ", x.size(1));
    copy_rows(shard, at, x, r.start, r.length);
    at += r.length;
  }
}

std::vector<Tensor> split_positions(const Tensor& shard, const std::vector<PositionRange>& ranges) {
  check_rows_tensor("split_positions", shard);
  DTP_CHECK(shard.size(1) == total_length(ranges), "split_positions: the shard ", shard.describe(),
            " has ", shard.size(1), " positions but the ranges hold ", total_length(ranges));
  std::vector<Tensor> pieces;
  std::int64_t at = 0;
  for (const PositionRange& r : ranges) {
    pieces.push_back(Tensor::empty(with_positions(shard, r.length), shard.dtype(), shard.device()));
    copy_rows(shard, at, pieces.back(), 0, r.length);
    at += r.length;
  }
  return pieces;
}

Tensor join_positions(const std::vector<Tensor>& pieces) {
  DTP_CHECK(!pieces.empty(), "join_positions: no pieces");
  std::int64_t total = 0;
  for (const Tensor& p : pieces) {
    check_rows_tensor("join_positions", p);
    DTP_CHECK(p.numel() / p.size(1) == pieces[0].numel() / pieces[0].size(1) &&
                  p.size(0) == pieces[0].size(0),
              "join_positions: piece ", p.describe(), " does not match ", pieces[0].describe(),
              " but for axis 1");
    total += p.size(1);
  }
  Tensor joined =
      Tensor::empty(with_positions(pieces[0], total), pieces[0].dtype(), pieces[0].device());
  std::int64_t at = 0;
  for (const Tensor& p : pieces) {
    copy_rows(p, 0, joined, at, p.size(1));
    at += p.size(1);
  }
  return joined;
}

}  // namespace dtp::ch06
