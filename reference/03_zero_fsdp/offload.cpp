// Puzzle 3.5: ZeRO-1 with the optimizer offloaded to host memory.
//
// The shard optimizer, its state and the parameter shard it updates (the
// master copy) live on the host. Per step each gradient shard crosses to the
// host once (device -> host) and each updated parameter shard crosses back
// once (host -> device): 2 x Psi/N elements over PCIe, in exchange for no
// optimizer bytes on the device.
#include "03_zero_fsdp/zero.h"

namespace dtp::ch03 {

std::vector<Tensor> host_parameter_shards(GPT& model, int world, int rank) {
  std::vector<Tensor> shards;
  for (const Tensor& view : parameter_shard_views(model, world, rank)) {
    Tensor host =
        Tensor::empty(view.shape(), view.dtype(), Device::cpu(), MemoryCategory::optimizer);
    host.copy_from(view);
    shards.push_back(host);
  }
  return shards;
}

Zero1Offload::Zero1Offload(Comm& comm, GPT& model, const TrainConfig& config)
    : ShardedOptimizer("zero1-offload", comm, model, config,
                       host_parameter_shards(model, comm.size(), comm.rank())) {
  for (Unit* unit : model.units()) {
    const Tensor& params = unit->params();
    device_gradient_shards_.push_back(Tensor::zeros(Shape{shard(unit->index()).length},
                                                    params.dtype(), params.device(),
                                                    MemoryCategory::grads));
  }
}

void Zero1Offload::finish_backward() {
  for (Unit* unit : model_.units()) {
    Tensor& on_device = device_gradient_shards_[static_cast<std::size_t>(unit->index())];
    comm_.reduce_scatter(unit->grads(), on_device, ReduceOp::avg);
    gradient_shard(unit->index()).copy_from(on_device);  // device -> host
  }
}

void Zero1Offload::step(double lr) {
  update_shards(lr);  // on the host
  for (Unit* unit : model_.units()) {
    const ChunkRange range = shard(unit->index());
    Tensor mine = unit->params().slice(range.offset, range.length);
    mine.copy_from(parameter_shard(unit->index()));  // host -> device
    comm_.all_gather(mine, unit->params());
  }
}

}  // namespace dtp::ch03
