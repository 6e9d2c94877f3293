/// @file ddp.h
/// @brief Chapter 02 contract: data-parallel training (DDP).
///
/// Every rank holds a full replica of the model and trains on its own slice
/// of the global batch. After backward, each gradient is averaged over the
/// ranks, so every replica applies the same update and stays identical. The
/// four puzzles make that averaging faster step by step: one all-reduce per
/// parameter (2.1), one per unit (2.2), buckets all-reduced asynchronously
/// while backward is still running (2.3), and no communication at all on the
/// first K-1 of K accumulated micro-batches (2.4).
///
/// How a puzzle plugs into training: a rank builds `Trainer(config, rank,
/// world)` (its sampler then yields only this rank's slice of the batch) and
/// registers the communication with `trainer.on_after_backward(...)` (2.1,
/// 2.2, 2.3's finish) or with the model's grad-ready hooks (2.3), as
/// `dtp train --strategy ddp` does (drivers/02_ddp/ddp_strategy.h, provided).
/// See chapters/02_ddp/README.md.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "dtp/comm.h"
#include "dtp/data.h"
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/trainer.h"

/// Chapter 02: data parallelism.
namespace dtp::ch02 {

/// Puzzle 2.1. Averages every named parameter's gradient over the ranks with
/// one all-reduce per parameter (ParamView::grad of every unit).
///
/// Call it after backward on every rank. Afterwards every rank's gradients
/// equal the mean over ranks of the gradients they had before.
/// Communication: exactly one all-reduce per named parameter.
void naive_all_reduce_gradients(Comm& comm, GPT& model);

/// Puzzle 2.2. Averages the gradients with one all-reduce per unit, over the
/// unit's flat gradient buffer (Unit::grads()).
///
/// Same result as 2.1 with far fewer, larger messages: exactly one all-reduce
/// per unit, and the bytes all-reduced equal the model's gradient bytes.
void flat_all_reduce_gradients(Comm& comm, GPT& model);

/// Where one bucket's piece of one parameter sits.
struct BucketPiece {
  int unit = 0;             ///< Unit::index() of the unit the parameter belongs to
  std::int64_t offset = 0;  ///< first element in the unit's flat gradient buffer
  std::int64_t numel = 0;   ///< elements
};

/// Puzzle 2.3. Bucketed gradient all-reduce, overlapped with backward.
///
/// The constructor groups the model's parameters into buckets in the order
/// their gradients become ready during backward: units from the head to the
/// embedding, and inside a unit its parameters from last to first. Parameters
/// are never split: a bucket takes whole parameters until it holds at least
/// @p bucket_bytes bytes of gradient, then the next bucket starts (so
/// bucket_bytes = 0 gives one bucket per parameter, and a huge bucket_bytes
/// one bucket for the whole model). Each bucket owns a contiguous buffer
/// (MemoryCategory::comm) of its size.
///
/// The constructor also installs a grad-ready hook on the model
/// (GPT::on_grad_ready). When a unit's gradients are final, the hook copies
/// them into their buckets; as soon as every piece of a bucket has arrived,
/// it starts an asynchronous all-reduce of that bucket (Comm::iall_reduce)
/// and returns at once, so communication runs while backward continues.
///
/// finish() waits for every bucket, copies the averaged gradients back into
/// the units' gradient buffers and gets ready for the next backward. Call it
/// once after every backward (Trainer::on_after_backward). Communication per
/// step: exactly bucket_count() all-reduces whose sizes add up to the model's
/// gradient bytes.
class BucketedAllReduce {
 public:
  /// Plans the buckets and installs the grad-ready hook on @p model.
  /// Throws dtp::Error when @p bucket_bytes is negative. @p comm and
  /// @p model must outlive this object.
  BucketedAllReduce(Comm& comm, GPT& model, std::int64_t bucket_bytes);
  /// Removes the model's grad-ready hooks (GPT::clear_grad_ready_hooks).
  ~BucketedAllReduce();
  /// Not copyable: the hook refers to this object.
  BucketedAllReduce(const BucketedAllReduce&) = delete;
  /// Not copyable.
  BucketedAllReduce& operator=(const BucketedAllReduce&) = delete;

  /// Waits for every bucket's all-reduce, writes the averaged gradients back
  /// into the units' gradient buffers and resets for the next backward.
  /// Throws dtp::Error when some bucket never became ready (a unit's hook
  /// did not run since the last finish()).
  void finish();
  /// Number of buckets.
  std::int64_t bucket_count() const;
  /// The pieces of bucket @p bucket, in the order they become ready.
  const std::vector<BucketPiece>& bucket(std::int64_t bucket) const;

 private:
  struct Bucket {
    std::vector<BucketPiece> pieces;
    Tensor buffer;
    int missing = 0;
    Request request;
  };
  void on_unit_ready(Unit& unit);
  Comm& comm_;
  GPT& model_;
  std::vector<Bucket> buckets_;
};

/// Puzzle 2.4. One optimizer step's worth of gradient accumulation.
///
/// Runs forward and backward on each of the K = micro_batches.size()
/// micro-batches, in order, with the loss scaled by 1/K (GPT::backward's
/// loss_scale), so that the accumulated gradient is the gradient of the mean
/// loss over all K micro-batches. Calls @p synchronize_gradients exactly once,
/// after the last backward: the first K-1 micro-steps must not communicate.
/// The caller has zeroed the gradients and steps the optimizer afterwards.
///
/// Returns the mean of the K micro-batch losses. Throws dtp::Error (before
/// any forward) when there are no micro-batches or when they differ in
/// shape (1/K weighting is right only for equal micro-batches).
double accumulation_step(GPT& model, const std::vector<Batch>& micro_batches,
                         const std::function<void()>& synchronize_gradients);

}  // namespace dtp::ch02
