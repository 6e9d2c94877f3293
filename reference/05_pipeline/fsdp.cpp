// Puzzle 5.8: FSDP inside each pipeline stage. The d ranks holding a stage
// keep 1/d of its units each and gather a unit only while it computes, once
// per micro-batch and pass; each micro-batch's gradient is reduce-scattered
// into the shard as soon as it is complete, where the micro-batches add up.
#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {
namespace {

int position(const StageModule& stage, const Unit& unit) {
  return unit.index() - stage.range().first;
}

}  // namespace

PipelineFsdp::PipelineFsdp(Comm& dp, StageModule& stage) : dp_(dp), stage_(stage) {
  for (Unit* unit : stage.units()) {
    const ChunkRange range = chunk_range(unit->numel(), dp.size(), dp.rank());
    const Tensor& full = unit->params();
    Tensor shard =
        Tensor::empty(Shape{range.length}, full.dtype(), full.device(), MemoryCategory::params);
    shard.copy_from(full.slice(range.offset, range.length));
    parameter_shards_.push_back(shard);
    gradient_shards_.push_back(
        Tensor::zeros(Shape{range.length}, full.dtype(), full.device(), MemoryCategory::grads));
    unit->set_buffers(Tensor(), Tensor());
  }
  stage.on_before_forward([this](Unit& unit) { gather_unit(position(stage_, unit)); });
  stage.on_after_forward([](Unit& unit) { unit.set_buffers(Tensor(), Tensor()); });
  stage.on_before_backward([this](Unit& unit) {
    gather_unit(position(stage_, unit));
    unit.set_buffers(unit.params(), Tensor::zeros(unit.params().shape(), unit.params().dtype(),
                                                  unit.params().device(), MemoryCategory::grads));
  });
  stage.on_grad_ready([this](Unit& unit) {
    Tensor& shard = gradient_shards_[static_cast<std::size_t>(position(stage_, unit))];
    Tensor reduced =
        Tensor::empty(shard.shape(), shard.dtype(), shard.device(), MemoryCategory::grads);
    dp_.reduce_scatter(unit.grads(), reduced, ReduceOp::avg);
    ops::axpy(shard, 1.0, reduced);  // the micro-batches accumulate in the shard
    unit.set_buffers(Tensor(), Tensor());
  });
}

PipelineFsdp::~PipelineFsdp() { stage_.clear_hooks(); }

void PipelineFsdp::zero_grad() {
  for (Tensor& shard : gradient_shards_) shard.fill(0.0);
}

void PipelineFsdp::gather_unit(int u) {
  Unit& unit = *stage_.units()[static_cast<std::size_t>(u)];
  const Tensor& shard = parameter_shards_[static_cast<std::size_t>(u)];
  Tensor full =
      Tensor::empty(Shape{unit.numel()}, shard.dtype(), shard.device(), MemoryCategory::params);
  dp_.all_gather(shard, full);
  unit.set_buffers(full, Tensor());
}

}  // namespace dtp::ch05
