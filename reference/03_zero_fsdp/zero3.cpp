// Puzzle 3.3: ZeRO-3 / FSDP, parameters sharded too.
//
// Between uses a unit holds nothing but this rank's shard. Its full
// parameters exist only while it computes: gathered before its forward,
// dropped after it, gathered again before its backward (with a gradient
// buffer), and after its backward the gradient is reduce-scattered into the
// shard and both are dropped. The price: a unit's parameters travel twice per
// step, so 1.5x DDP's bytes.
#include "03_zero_fsdp/zero.h"

namespace dtp::ch03 {

// Copies, so that the full buffers can be released.
std::vector<Tensor> owned_parameter_shards(GPT& model, int world, int rank) {
  std::vector<Tensor> shards;
  for (Unit* unit : model.units()) {
    const ChunkRange range = shard_range(*unit, world, rank);
    const Tensor& params = unit->params();
    Tensor shard =
        Tensor::empty(Shape{range.length}, params.dtype(), params.device(), MemoryCategory::params);
    shard.copy_from(params.slice(range.offset, range.length));
    shards.push_back(shard);
  }
  return shards;
}

Zero3::Zero3(std::string name, Comm& comm, GPT& model, const TrainConfig& config)
    : ShardedOptimizer(std::move(name), comm, model, config,
                       owned_parameter_shards(model, comm.size(), comm.rank())),
      reduced_(model.units().size(), false) {
  for (Unit* unit : model.units()) unit->set_buffers(Tensor(), Tensor());
}

Zero3::Zero3(Comm& comm, GPT& model, const TrainConfig& config)
    : Zero3("zero3", comm, model, config) {
  model.on_before_forward([this](Unit& unit) { gather_unit(unit, false); });
  model.on_after_forward([](Unit& unit) { unit.set_buffers(Tensor(), Tensor()); });
  model.on_before_backward([this](Unit& unit) { gather_unit(unit, true); });
  model.on_grad_ready([this](Unit& unit) { reduce_and_release(unit); });
}

Zero3::~Zero3() { model_.clear_hooks(); }

void Zero3::gather_unit(Unit& unit, bool with_gradient) {
  const Tensor& shard = parameter_shard(unit.index());
  Tensor full =
      Tensor::empty(Shape{unit.numel()}, shard.dtype(), shard.device(), MemoryCategory::params);
  comm_.all_gather(shard, full);
  install(unit, full, with_gradient);
}

void Zero3::install(Unit& unit, Tensor full, bool with_gradient) {
  Tensor grads;
  if (with_gradient)
    grads = Tensor::zeros(full.shape(), full.dtype(), full.device(), MemoryCategory::grads);
  unit.set_buffers(std::move(full), std::move(grads));
}

void Zero3::reduce_and_release(Unit& unit) {
  comm_.reduce_scatter(unit.grads(), gradient_shard(unit.index()), ReduceOp::avg);
  unit.set_buffers(Tensor(), Tensor());
  reduced_[static_cast<std::size_t>(unit.index())] = true;
}

void Zero3::finish_backward() {
  for (Unit* unit : model_.units()) {
    DTP_CHECK(reduced_[static_cast<std::size_t>(unit->index())], "Zero3::finish_backward: unit '",
              unit->name(), "' was not reduce-scattered since the last step; did backward run?");
  }
  reduced_.assign(reduced_.size(), false);
}

void Zero3::step(double lr) { update_shards(lr); }

}  // namespace dtp::ch03
