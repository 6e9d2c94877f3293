// Puzzle 3.4: FSDP with prefetch.
//
// Zero3 gathers a unit when it is about to run, so every gather is exposed.
// Here, as soon as unit i is ready to compute, the gather of the unit that
// runs next (i+1 in forward, i-1 in backward) is started without waiting:
// it travels while unit i computes. Only two units' parameters are ever
// whole at once: the one computing and the one arriving.
#include "03_zero_fsdp/zero.h"

namespace dtp::ch03 {

Zero3Prefetch::Zero3Prefetch(Comm& comm, GPT& model, const TrainConfig& config)
    : Zero3("zero3-prefetch", comm, model, config) {
  const int units = static_cast<int>(model.units().size());
  // Waits for `unit`'s prefetch (or gathers it now, the first unit of a pass),
  // installs it, then starts the gather of the unit `next` (when there is one).
  auto arrive_and_prefetch = [this, units](Unit& unit, bool with_gradient, int next) {
    if (next_.unit == unit.index()) {
      next_.request.wait();
      install(unit, next_.full, with_gradient);
      next_ = InFlight{};
    } else {
      gather_unit(unit, with_gradient);
    }
    if (next >= 0 && next < units) {
      const Tensor& shard = parameter_shard(next);
      const std::int64_t numel = model_.units()[static_cast<std::size_t>(next)]->numel();
      next_.full =
          Tensor::empty(Shape{numel}, shard.dtype(), shard.device(), MemoryCategory::params);
      next_.request = comm_.iall_gather(shard, next_.full);
      next_.unit = next;
    }
  };
  model.on_before_forward([=](Unit& unit) { arrive_and_prefetch(unit, false, unit.index() + 1); });
  model.on_after_forward([](Unit& unit) { unit.set_buffers(Tensor(), Tensor()); });
  model.on_before_backward([=](Unit& unit) { arrive_and_prefetch(unit, true, unit.index() - 1); });
  model.on_grad_ready([this](Unit& unit) { reduce_and_release(unit); });
}

Zero3Prefetch::~Zero3Prefetch() {
  // A gather still in flight writes into next_.full: let it land first.
  try {
    next_.request.wait();
  } catch (...) {
  }
}

}  // namespace dtp::ch03
