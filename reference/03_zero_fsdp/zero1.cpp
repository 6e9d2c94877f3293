// Puzzle 3.1: ZeRO-1, the optimizer state sharded.
//
// Every rank keeps the full parameters and gradients, as in DDP, but its
// optimizer only knows its own shard of each unit: 1/N of the state. The
// gradient all-reduce of DDP splits into its two halves with the update in
// between: reduce-scatter (each rank receives the averaged gradient of its
// shard), update the shard, all-gather (every rank receives every updated
// shard). Same bytes on the wire as DDP; N times less optimizer memory.
#include "03_zero_fsdp/zero.h"

namespace dtp::ch03 {

Zero1::Zero1(Comm& comm, GPT& model, const TrainConfig& config)
    : ShardedOptimizer("zero1", comm, model, config,
                       parameter_shard_views(model, comm.size(), comm.rank())) {}

void Zero1::finish_backward() {
  for (Unit* unit : model_.units())
    comm_.reduce_scatter(unit->grads(), gradient_shard(unit->index()), ReduceOp::avg);
}

void Zero1::step(double lr) {
  update_shards(lr);
  // The shard is a view of this rank's own chunk of params(): an in-place all-gather.
  for (Unit* unit : model_.units())
    comm_.all_gather(parameter_shard(unit->index()), unit->params());
}

}  // namespace dtp::ch03
