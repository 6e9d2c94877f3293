// Puzzle 3.2: ZeRO-2, gradients sharded too.
//
// A unit's full gradient is only needed while its own backward accumulates
// into it. So it is allocated right before that backward and, as soon as the
// unit's gradients are final, reduce-scattered into the shard and dropped:
// a rank never holds more than its gradient shards plus one unit's full
// gradient. The update is ZeRO-1's.
#include "03_zero_fsdp/zero.h"

namespace dtp::ch03 {

Zero2::Zero2(Comm& comm, GPT& model, const TrainConfig& config)
    : ShardedOptimizer("zero2", comm, model, config,
                       parameter_shard_views(model, comm.size(), comm.rank())),
      reduced_(model.units().size(), false) {
  for (Unit* unit : model.units()) unit->set_buffers(unit->params(), Tensor());
  model.on_before_backward([](Unit& unit) {
    const Tensor& params = unit.params();
    unit.set_buffers(params, Tensor::zeros(params.shape(), params.dtype(), params.device(),
                                           MemoryCategory::grads));
  });
  model.on_grad_ready([this](Unit& unit) {
    comm_.reduce_scatter(unit.grads(), gradient_shard(unit.index()), ReduceOp::avg);
    unit.set_buffers(unit.params(), Tensor());
    reduced_[static_cast<std::size_t>(unit.index())] = true;
  });
}

Zero2::~Zero2() { model_.clear_hooks(); }

void Zero2::finish_backward() {
  for (Unit* unit : model_.units()) {
    DTP_CHECK(reduced_[static_cast<std::size_t>(unit->index())], "Zero2::finish_backward: unit '",
              unit->name(), "' was not reduce-scattered since the last step; did backward run?");
  }
  reduced_.assign(reduced_.size(), false);
}

void Zero2::step(double lr) {
  update_shards(lr);
  for (Unit* unit : model_.units())
    comm_.all_gather(parameter_shard(unit->index()), unit->params());
}

}  // namespace dtp::ch03
