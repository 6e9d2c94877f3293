// Puzzle 2.3: bucketed DDP overlapped with backward.
//
// Plan (constructor): walk the parameters in the order backward finishes
// them (units head -> embedding, parameters last -> first inside a unit) and
// cut that sequence into buckets of at least bucket_bytes. Each bucket knows
// how many of its pieces are still missing.
// Run (hook): when a unit is ready, copy its pieces into their buckets; a
// bucket whose last piece arrived starts its iall_reduce at once and
// backward goes on computing the next unit while the bucket travels.
// Finish: wait for every bucket, copy the averages back, re-arm.
#include "02_ddp/ddp.h"

#include "dtp/error.h"

namespace dtp::ch02 {

BucketedAllReduce::BucketedAllReduce(Comm& comm, GPT& model, std::int64_t bucket_bytes)
    : comm_(comm), model_(model) {
  DTP_CHECK(bucket_bytes >= 0, "BucketedAllReduce: bucket_bytes must be >= 0, got ", bucket_bytes);
  std::vector<Unit*> units = model.units();
  const std::int64_t element_bytes =
      static_cast<std::int64_t>(units.front()->grads().element_size());
  Bucket current;
  std::int64_t current_bytes = 0;
  auto close = [&] {
    if (current.pieces.empty()) return;
    current.buffer =
        Tensor::empty(Shape{current_bytes / element_bytes}, units.front()->grads().dtype(),
                      units.front()->grads().device(), MemoryCategory::comm);
    current.missing = static_cast<int>(current.pieces.size());
    buckets_.push_back(std::move(current));
    current = Bucket{};
    current_bytes = 0;
  };
  for (auto unit = units.rbegin(); unit != units.rend(); ++unit) {
    const std::vector<ParamView>& parameters = (*unit)->parameters();
    for (auto p = parameters.rbegin(); p != parameters.rend(); ++p) {
      const std::int64_t numel = p->shape.numel();
      if (numel == 0) continue;
      current.pieces.push_back(BucketPiece{(*unit)->index(), p->offset, numel});
      current_bytes += numel * element_bytes;
      if (current_bytes >= bucket_bytes) close();
    }
  }
  close();
  model_.on_grad_ready([this](Unit& unit) { on_unit_ready(unit); });
}

BucketedAllReduce::~BucketedAllReduce() {
  // A bucket still in flight writes its buffer; wait so that memory outlives it.
  for (Bucket& bucket : buckets_) {
    try {
      bucket.request.wait();
    } catch (...) {
    }
  }
  model_.clear_grad_ready_hooks();
}

void BucketedAllReduce::on_unit_ready(Unit& unit) {
  // Pieces of one unit are consecutive in the plan, so a scan is cheap enough
  // for a handful of buckets; a map from unit to buckets would avoid it.
  for (Bucket& bucket : buckets_) {
    std::int64_t position = 0;
    bool touched = false;
    for (const BucketPiece& piece : bucket.pieces) {
      if (piece.unit == unit.index()) {
        bucket.buffer.slice(position, piece.numel)
            .copy_from(unit.grads().slice(piece.offset, piece.numel));
        --bucket.missing;
        touched = true;
      }
      position += piece.numel;
    }
    if (touched && bucket.missing == 0)
      bucket.request = comm_.iall_reduce(bucket.buffer, ReduceOp::avg);
  }
}

void BucketedAllReduce::finish() {
  std::vector<Unit*> units = model_.units();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    DTP_CHECK(bucket.missing == 0, "BucketedAllReduce::finish: bucket ", b, " still misses ",
              bucket.missing, " of its ", bucket.pieces.size(),
              " pieces; did backward run (and call the grad-ready hooks) since the last finish()?");
    bucket.request.wait();
    std::int64_t position = 0;
    for (const BucketPiece& piece : bucket.pieces) {
      Tensor target =
          units[static_cast<std::size_t>(piece.unit)]->grads().slice(piece.offset, piece.numel);
      target.copy_from(bucket.buffer.slice(position, piece.numel));
      position += piece.numel;
    }
    bucket.request = Request();
    bucket.missing = static_cast<int>(bucket.pieces.size());
  }
}

std::int64_t BucketedAllReduce::bucket_count() const {
  return static_cast<std::int64_t>(buckets_.size());
}

const std::vector<BucketPiece>& BucketedAllReduce::bucket(std::int64_t bucket) const {
  DTP_CHECK(bucket >= 0 && bucket < bucket_count(), "BucketedAllReduce::bucket: index ", bucket,
            " outside [0, ", bucket_count(), ")");
  return buckets_[static_cast<std::size_t>(bucket)].pieces;
}

}  // namespace dtp::ch02
