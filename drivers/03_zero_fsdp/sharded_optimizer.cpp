// ShardedOptimizer: what every ZeRO stage stands on (provided, not a puzzle).
// It owns this rank's gradient shards and one shard-sized optimizer over the
// (parameter shard, gradient shard) pairs, and computes the gradient norm
// over every rank's shards. The stages (puzzles 3.1-3.5) decide where the
// parameter shards live and how the shards are filled and spread.
#include <utility>

#include "03_zero_fsdp/zero.h"

namespace dtp::ch03 {
namespace {

// One (parameter shard, zeroed gradient shard) pair per unit, after checking
// that every shard has its unit's shard_range length.
std::vector<ParamBuffer> shard_buffers(GPT& model, int world, int rank,
                                       const std::vector<Tensor>& shards) {
  std::vector<Unit*> units = model.units();
  DTP_CHECK(shards.size() == units.size(),
            "ShardedOptimizer: expected one parameter shard per unit (", units.size(), "), got ",
            shards.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::int64_t expected = shard_range(*units[u], world, rank).length;
    DTP_CHECK(shards[u].defined() && shards[u].numel() == expected, "ShardedOptimizer: unit '",
              units[u]->name(), "' rank ", rank, " of ", world, ": expected a parameter shard of ",
              expected, " elements (shard_range), got ",
              shards[u].defined() ? shards[u].numel() : 0);
  }
  std::vector<ParamBuffer> buffers;
  for (std::size_t u = 0; u < units.size(); ++u) {
    Tensor gradient = Tensor::zeros(shards[u].shape(), shards[u].dtype(), shards[u].device(),
                                    MemoryCategory::grads);
    buffers.push_back(ParamBuffer{units[u]->name() + " shard", shards[u], gradient});
  }
  return buffers;
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(std::string name, Comm& comm, GPT& model,
                                   const TrainConfig& config, std::vector<Tensor> parameter_shards)
    : Optimizer(shard_buffers(model, comm.size(), comm.rank(), parameter_shards)),
      comm_(comm),
      model_(model),
      name_(std::move(name)) {
  for (const ParamBuffer& buffer : buffers_) {
    parameter_shards_.push_back(buffer.params);
    gradient_shards_.push_back(buffer.grads);
  }
  for (Unit* unit : model.units()) shards_.push_back(shard_range(*unit, comm.size(), comm.rank()));
  optimizer_ = make_optimizer(config, buffers_);
}

ChunkRange ShardedOptimizer::shard(int unit) const {
  DTP_CHECK(unit >= 0 && unit < static_cast<int>(shards_.size()), "ShardedOptimizer::shard: unit ",
            unit, " outside [0, ", shards_.size(), ")");
  return shards_[static_cast<std::size_t>(unit)];
}

Tensor& ShardedOptimizer::parameter_shard(int unit) {
  (void)shard(unit);  // range check
  return parameter_shards_[static_cast<std::size_t>(unit)];
}

Tensor& ShardedOptimizer::gradient_shard(int unit) {
  (void)shard(unit);
  return gradient_shards_[static_cast<std::size_t>(unit)];
}

double ShardedOptimizer::clip_gradients(double max_norm) {
  return clip_sharded_grad_norm(comm_, gradient_shards_, max_norm);
}

void ShardedOptimizer::update_shards(double lr) {
  optimizer_->step(lr);
  ++steps_;
}

std::vector<Tensor> parameter_shard_views(GPT& model, int world, int rank) {
  std::vector<Tensor> views;
  for (Unit* unit : model.units()) {
    const ChunkRange range = shard_range(*unit, world, rank);
    views.push_back(unit->params().slice(range.offset, range.length));
  }
  return views;
}

}  // namespace dtp::ch03
