// A ZeRO run's checkpoint (provided, not a puzzle): consolidated. Rank 0
// gathers every rank's shards into the full tensors a single-device run
// saves, under the same names, so the file does not depend on the stage or
// the world that wrote it (`--load` reads it anywhere). On --resume each rank
// reads the file and keeps its own shard of each tensor. Gathering costs one
// gather per tensor, once per save; a sharded format (a file per rank) would
// avoid it at the price of files tied to one world size.
#include "03_zero_fsdp/zero.h"

namespace dtp::ch03 {
namespace {

// Rank 0's concatenation of every rank's @p shard (empty elsewhere), on the
// communication device: the offloaded stage keeps its shards on the host.
Tensor gather_full(Comm& comm, const Tensor& shard, std::int64_t numel) {
  const Tensor mine = shard.device() == comm.device() ? shard : shard.to(comm.device());
  Tensor full;
  if (comm.rank() == 0)
    full = Tensor::empty(Shape{numel}, shard.dtype(), comm.device(), MemoryCategory::other);
  comm.gather(mine, full, 0);
  return full;
}

// The shard optimizer names each buffer "<unit> shard" (shard_buffers);
// the checkpoint names the state as a single-device run does, "<unit>.m".
std::string shard_buffer(const Unit& unit) { return unit.name() + " shard"; }

// The checkpoint's tensor @p name, which must hold @p numel elements of @p dtype.
const Tensor& saved_tensor(const Checkpoint& checkpoint, const std::string& name,
                           std::int64_t numel, DType dtype, const std::string& path) {
  DTP_CHECK(checkpoint.has(name), "--resume ", path, ": the checkpoint has no ", name);
  const Tensor& saved = checkpoint.tensor(name);
  DTP_CHECK(saved.numel() == numel && saved.dtype() == dtype, "--resume ", path, ": ", name, " is ",
            saved.shape().str(), " ", dtype_name(saved.dtype()),
            " in the checkpoint, but this run's holds ", numel, " elements of ", dtype_name(dtype));
  return saved;
}

}  // namespace

std::vector<NamedTensor> ShardedOptimizer::gather_checkpoint() {
  std::vector<Unit*> units = model_.units();
  std::vector<NamedTensor> tensors;
  for (Unit* unit : units) {
    const Tensor full = gather_full(comm_, parameter_shard(unit->index()), unit->numel());
    if (comm_.rank() != 0) continue;
    for (const ParamView& p : unit->parameters())
      tensors.push_back({parameter_entry(unit->name(), p.name),
                         full.slice(p.offset, p.shape.numel()).view(p.shape)});
  }
  for (Unit* unit : units)
    for (const std::string& kind : state_kinds(*optimizer_)) {
      const Tensor full =
          gather_full(comm_, state_tensor(*optimizer_, shard_buffer(*unit), kind), unit->numel());
      if (comm_.rank() == 0) tensors.push_back({optimizer_entry(unit->name(), kind), full});
    }
  return tensors;
}

void ShardedOptimizer::restore_shards(const Checkpoint& checkpoint, const std::string& path) {
  std::vector<Unit*> units = model_.units();
  for (Unit* unit : units) {
    // The unit's flat parameters, assembled from its named ones.
    Tensor full = Tensor::empty(Shape{unit->numel()}, parameter_shard(unit->index()).dtype(),
                                Device::cpu(), MemoryCategory::other);
    for (const ParamView& p : unit->parameters()) {
      const std::string name = parameter_entry(unit->name(), p.name);
      const Tensor& saved = saved_tensor(checkpoint, name, p.shape.numel(), full.dtype(), path);
      full.slice(p.offset, p.shape.numel()).copy_from(saved.flatten());
    }
    if (unit->params().defined())
      unit->params().copy_from(full);  // ZeRO-1, ZeRO-2: full on every rank
    const ChunkRange range = shard(unit->index());
    parameter_shard(unit->index()).copy_from(full.slice(range.offset, range.length));
  }
  for (Unit* unit : units)
    for (const std::string& kind : state_kinds(*optimizer_)) {
      Tensor mine = state_tensor(*optimizer_, shard_buffer(*unit), kind);
      const ChunkRange range = shard(unit->index());
      const std::string name = optimizer_entry(unit->name(), kind);
      const Tensor& saved = saved_tensor(checkpoint, name, unit->numel(), mine.dtype(), path);
      mine.copy_from(saved.flatten().slice(range.offset, range.length));
    }
  optimizer_->set_steps(steps_);
}

}  // namespace dtp::ch03
