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
/// 2.2, 2.3's finish) or with the model's grad-ready hooks (2.3). See
/// chapters/02_ddp/README.md.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/data.h"
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

// --- provided (not a puzzle): drivers/02_ddp/ddp_strategy.cpp -------------------

/// How `dtp train --strategy ddp` synchronizes gradients.
enum class DdpMode {
  naive,     ///< 2.1: one all-reduce per parameter
  flat,      ///< 2.2: one all-reduce per unit
  bucketed,  ///< 2.3: buckets overlapped with backward
};

/// What one rank's communication did in one optimizer step.
struct RankCommStep {
  int rank = 0;                   ///< the rank
  double loss = 0;                ///< the rank's mean loss over its slice
  std::int64_t all_reduces = 0;   ///< all-reduce calls
  std::int64_t bytes = 0;         ///< bytes all-reduced
  double exposed_seconds = 0;     ///< time the rank thread spent blocked on communication
};

/// DdpOptions::bucket_bytes meaning "choose from the model" (default_bucket_bytes).
inline constexpr std::int64_t kAutoBucketBytes = -1;
/// About how many buckets the default bucket size makes of a model's gradients.
inline constexpr std::int64_t kDefaultBucketCount = 4;

/// Settings of the "ddp" strategy.
struct DdpOptions {
  int world = 2;                         ///< data-parallel ranks (World::from_env)
  DdpMode mode = DdpMode::bucketed;      ///< how gradients are averaged
  /// 2.3's bucket size in bytes; kAutoBucketBytes: default_bucket_bytes(model).
  std::int64_t bucket_bytes = kAutoBucketBytes;
  std::int64_t accumulate = 1;           ///< micro-batches per optimizer step (2.4)
  /// Called on rank 0 after each step with every rank's numbers (index = rank).
  std::function<void(std::int64_t step, const std::vector<RankCommStep>&)> on_comm;
};

/// The bucket size that splits @p model's gradients into about
/// kDefaultBucketCount buckets (gradient bytes / kDefaultBucketCount), so
/// that the default run overlaps communication with backward.
std::int64_t default_bucket_bytes(const GPT& model);

/// options.bucket_bytes, or default_bucket_bytes(model) for kAutoBucketBytes.
std::int64_t resolve_bucket_bytes(const DdpOptions& options, const GPT& model);

/// Checks @p options against @p config: world >= 1, accumulate >= 1,
/// bucket_bytes >= 0 or kAutoBucketBytes, and config.batch divisible by
/// world * accumulate (the message names --batch, --world and --accumulate;
/// no overflow for huge values). Throws dtp::Error.
void validate_ddp(const TrainConfig& config, const DdpOptions& options);

/// Registers the "ddp" strategy with @p options (the last registration wins).
/// It launches options.world ranks, which first check that they agree on
/// their settings and initial parameters (check_ranks_agree). The StepRecord
/// it reports has the loss averaged over ranks, the tokens of all ranks, the
/// slowest rank's step time (so tokens_per_second is global) and rank 0's
/// other fields.
void register_ddp_strategy(const DdpOptions& options);

}  // namespace dtp::ch02
