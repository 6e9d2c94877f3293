// Chapter 03 — ZeRO-1/2/3, FSDP with prefetch, optimizer offload.
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 03                  (or ./dtp grade 03 --puzzle 3.1)
// The contract is in chapters/03_zero_fsdp/zero.h; the lesson (where the
// memory goes, what each stage shards, the formulas the checkers use) is in
// chapters/03_zero_fsdp/README.md. Solve them in order: 3.4 builds on 3.3.
//
// Provided (ShardedOptimizer, in zero.h; its code in drivers/03_zero_fsdp/):
// this rank's shards and a shard-sized optimizer.
//   shard(u)                 ChunkRange of unit u's flat buffers this rank owns
//   parameter_shard(u)       the parameter shard the optimizer updates
//   gradient_shard(u)        where the averaged gradient of the shard must land
//   update_shards(lr)        one optimizer update of every shard
//   comm_, model_            the ranks and this rank's model
// Tools:
//   comm_.reduce_scatter(full, shard, ReduceOp::avg)   shard = my chunk of the mean
//   comm_.all_gather(shard, full)                      full = every rank's chunk
//   comm_.iall_gather(shard, full) -> Request          the same, non-blocking
//   unit->params(), unit->grads(), unit->numel(), unit->index(), model_.units()
//   unit.set_buffers(params, grads)                    install / release (Tensor())
//   model.on_before_forward / on_after_forward / on_before_backward / on_grad_ready
//   Tensor::empty(Shape{n}, dtype, device, MemoryCategory::params), Tensor::zeros(...)
#include "03_zero_fsdp/zero.h"

namespace dtp::ch03 {

// --- 3.1 ZeRO-1 ------------------------------------------------------------------

Zero1::Zero1(Comm& comm, GPT& model, const TrainConfig& config)
    : ShardedOptimizer("zero1", comm, model, config,
                       parameter_shard_views(model, comm.size(), comm.rank())) {
  // Nothing more to do here: the shards are views into the full parameters.
  // Delete this line once finish_backward() and step() are written.
  throw dtp::NotSolved("3.1 zero1");
}

void Zero1::finish_backward() {
  // About 2 lines: reduce-scatter (mean) every unit's grads() into its gradient shard.
  throw dtp::NotSolved("3.1 zero1");
}

void Zero1::step(double lr) {
  // About 3 lines: update the shards, then all-gather every unit's parameter
  // shard into its params() (the shard is a view of params(): in place).
  (void)lr;
  throw dtp::NotSolved("3.1 zero1");
}

// --- 3.2 ZeRO-2 ------------------------------------------------------------------

Zero2::Zero2(Comm& comm, GPT& model, const TrainConfig& config)
    : ShardedOptimizer("zero2", comm, model, config,
                       parameter_shard_views(model, comm.size(), comm.rank())),
      reduced_(model.units().size(), false) {
  // About 12 lines.
  // 1. Release every unit's full gradient: unit->set_buffers(unit->params(), Tensor()).
  // 2. on_before_backward: give the unit a zeroed full gradient buffer, the
  //    same shape, dtype and device as unit.params(), MemoryCategory::grads.
  // 3. on_grad_ready: reduce-scatter (mean) its grads into its gradient shard,
  //    release the full gradient, note the unit as reduced.
  throw dtp::NotSolved("3.2 zero2");
}

Zero2::~Zero2() { model_.clear_hooks(); }

void Zero2::finish_backward() {
  // About 5 lines: throw dtp::Error (DTP_CHECK) naming the first unit not
  // reduced since the last step, then reset reduced_.
  throw dtp::NotSolved("3.2 zero2");
}

void Zero2::step(double lr) {
  // About 3 lines: the same as ZeRO-1's step.
  (void)lr;
  throw dtp::NotSolved("3.2 zero2");
}

// --- 3.3 ZeRO-3 / FSDP -----------------------------------------------------------

std::vector<Tensor> owned_parameter_shards(GPT& model, int world, int rank) {
  // About 8 lines: per unit, a Tensor::empty(Shape{shard length}, the
  // params' dtype and device, MemoryCategory::params) filled with
  // copy_from(params.slice(offset, length)) of its shard_range.
  (void)model;
  (void)world;
  (void)rank;
  throw dtp::NotSolved("3.3 zero3");
}

Zero3::Zero3(std::string name, Comm& comm, GPT& model, const TrainConfig& config)
    : ShardedOptimizer(std::move(name), comm, model, config,
                       owned_parameter_shards(model, comm.size(), comm.rank())),
      reduced_(model.units().size(), false) {
  // 1 line: release every unit's full buffers, unit->set_buffers(Tensor(), Tensor()).
  throw dtp::NotSolved("3.3 zero3");
}

Zero3::Zero3(Comm& comm, GPT& model, const TrainConfig& config)
    : Zero3("zero3", comm, model, config) {
  // About 4 lines: the four hooks (gather_unit, release, gather_unit with a
  // gradient, reduce_and_release).
}

Zero3::~Zero3() { model_.clear_hooks(); }

void Zero3::gather_unit(Unit& unit, bool with_gradient) {
  // About 4 lines: all-gather the unit's parameter shard into a fresh full
  // buffer (MemoryCategory::params), then install().
  (void)unit;
  (void)with_gradient;
  throw dtp::NotSolved("3.3 zero3");
}

void Zero3::install(Unit& unit, Tensor full, bool with_gradient) {
  // About 3 lines: set_buffers(full, a zeroed gradient or Tensor()).
  (void)unit;
  (void)full;
  (void)with_gradient;
  throw dtp::NotSolved("3.3 zero3");
}

void Zero3::reduce_and_release(Unit& unit) {
  // About 3 lines: reduce-scatter (mean), release both buffers, note as reduced.
  (void)unit;
  throw dtp::NotSolved("3.3 zero3");
}

void Zero3::finish_backward() {
  // About 5 lines, as ZeRO-2's.
  throw dtp::NotSolved("3.3 zero3");
}

void Zero3::step(double lr) {
  // 1 line: only the shards change; the next forward gathers them.
  (void)lr;
  throw dtp::NotSolved("3.3 zero3");
}

// --- 3.4 FSDP with prefetch ------------------------------------------------------

Zero3Prefetch::Zero3Prefetch(Comm& comm, GPT& model, const TrainConfig& config)
    : Zero3("zero3-prefetch", comm, model, config) {
  // About 25 lines. Hooks like Zero3's, but before unit i runs:
  //  - if next_ holds unit i's gather: wait for it and install next_.full;
  //    otherwise gather unit i now (the first unit of a pass);
  //  - then start the gather of the unit that runs next (i+1 in forward, i-1
  //    in backward, when it exists) with comm_.iall_gather into next_.
  throw dtp::NotSolved("3.4 zero3_prefetch");
}

Zero3Prefetch::~Zero3Prefetch() {
  // About 4 lines: wait for next_.request (it writes into next_.full) and
  // swallow any error (a destructor must not throw). wait() on a default
  // Request returns at once. ~Zero3 removes the hooks afterwards.
}

// --- 3.5 optimizer offload -------------------------------------------------------

std::vector<Tensor> host_parameter_shards(GPT& model, int world, int rank) {
  // About 7 lines: per view of parameter_shard_views(model, world, rank), a
  // Tensor::empty(view.shape(), view.dtype(), Device::cpu(),
  // MemoryCategory::optimizer) filled with copy_from(view).
  (void)model;
  (void)world;
  (void)rank;
  throw dtp::NotSolved("3.5 zero1_offload");
}

Zero1Offload::Zero1Offload(Comm& comm, GPT& model, const TrainConfig& config)
    : ShardedOptimizer("zero1-offload", comm, model, config,
                       host_parameter_shards(model, comm.size(), comm.rank())) {
  // About 5 lines: one zeroed gradient shard per unit on the model's device
  // (shard(u).length elements, MemoryCategory::grads) into device_gradient_shards_.
  throw dtp::NotSolved("3.5 zero1_offload");
}

void Zero1Offload::finish_backward() {
  // About 5 lines: reduce-scatter (mean) into the device gradient shard, then
  // copy it into gradient_shard(u) (device -> host).
  throw dtp::NotSolved("3.5 zero1_offload");
}

void Zero1Offload::step(double lr) {
  // About 7 lines: update the host shards, copy each into this rank's slice of
  // the unit's params() (host -> device), then all-gather the parameters.
  (void)lr;
  throw dtp::NotSolved("3.5 zero1_offload");
}

}  // namespace dtp::ch03
