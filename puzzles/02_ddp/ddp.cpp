// Chapter 02 — data-parallel training (DDP).
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 02
// to see which puzzles pass. The contract is in chapters/02_ddp/ddp.h; the
// lesson (why all-reduce, buckets, overlap, accumulation) is in
// chapters/02_ddp/README.md.
//
// Tools you may use:
//   comm.all_reduce(t, ReduceOp::avg)         blocking: every rank's t becomes the mean
//   comm.iall_reduce(t, ReduceOp::avg)        non-blocking: returns a Request; t is
//                                             final after request.wait()
//   model.units()                             embedding, block.0, ..., head (forward order)
//   unit->parameters()                        ParamView: name, shape, offset, value, grad
//   unit->grads()                             the unit's flat gradient buffer
//   model.on_grad_ready([](Unit& u) {...})    called during backward, head first,
//                                             as soon as u's gradients are final
//   t.slice(offset, numel), dst.copy_from(src), Tensor::empty(shape, dtype, device,
//                                             MemoryCategory::comm)
//   model.forward(inputs, targets), model.backward(loss_scale)
// The `(void)x;` lines only silence unused-parameter warnings: delete them.
#include "02_ddp/ddp.h"

namespace dtp::ch02 {

void naive_all_reduce_gradients(Comm& comm, GPT& model) {
  // About 5 lines.
  // For every unit, for every parameter: all-reduce its gradient view with
  // ReduceOp::avg. The view writes through to the unit's flat buffer.
  (void)comm;
  (void)model;
  throw dtp::NotSolved("2.1 naive_ddp");
}

void flat_all_reduce_gradients(Comm& comm, GPT& model) {
  // About 2 lines: one all-reduce per unit, over its flat gradient buffer.
  (void)comm;
  (void)model;
  throw dtp::NotSolved("2.2 flat_ddp");
}

BucketedAllReduce::BucketedAllReduce(Comm& comm, GPT& model, std::int64_t bucket_bytes)
    : comm_(comm), model_(model) {
  // About 30 lines.
  // 1. Reject bucket_bytes < 0 with DTP_CHECK (a dtp::Error).
  // 2. Walk units from last to first, and each unit's parameters from last to
  //    first; append BucketPiece{unit index, offset, numel} to the current
  //    bucket; once the bucket holds >= bucket_bytes bytes, close it: give it
  //    a buffer (Tensor::empty, MemoryCategory::comm) and set missing to its
  //    piece count. Close the last, partly filled bucket too.
  // 3. model_.on_grad_ready([this](Unit& u) { on_unit_ready(u); });
  (void)bucket_bytes;
  throw dtp::NotSolved("2.3 bucketed_ddp");
}

BucketedAllReduce::~BucketedAllReduce() {
  // About 3 lines: wait for requests still in flight, then
  // model_.clear_grad_ready_hooks(). Never throw from here.
}

void BucketedAllReduce::on_unit_ready(Unit& unit) {
  // About 15 lines.
  // Copy each piece of this unit into its place in its bucket's buffer and
  // decrement the bucket's `missing`; when it reaches 0, start
  // comm_.iall_reduce(bucket.buffer, ReduceOp::avg) and keep the Request.
  // Buckets become complete in the same order on every rank (why?).
  (void)unit;
  throw dtp::NotSolved("2.3 bucketed_ddp");
}

void BucketedAllReduce::finish() {
  // About 15 lines.
  // For every bucket: check it is complete (DTP_CHECK), wait for its request,
  // copy the buffer's pieces back into the units' grads, re-arm `missing`.
  throw dtp::NotSolved("2.3 bucketed_ddp");
}

std::int64_t BucketedAllReduce::bucket_count() const { throw dtp::NotSolved("2.3 bucketed_ddp"); }

const std::vector<BucketPiece>& BucketedAllReduce::bucket(std::int64_t bucket) const {
  (void)bucket;
  throw dtp::NotSolved("2.3 bucketed_ddp");
}

double accumulation_step(GPT& model, const std::vector<Batch>& micro_batches,
                         const std::function<void()>& synchronize_gradients) {
  // About 12 lines.
  // Check (DTP_CHECK) that there is at least one micro-batch and that all
  // have the same shape. Then for each: loss += model.forward(...);
  // model.backward(1.0 / K). Call synchronize_gradients() once, after the
  // last backward only. Return the mean loss.
  (void)model;
  (void)micro_batches;
  (void)synchronize_gradients;
  throw dtp::NotSolved("2.4 gradient_accumulation");
}

}  // namespace dtp::ch02
