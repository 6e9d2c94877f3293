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
  if (comm.rank() == 0) full = Tensor::empty(Shape{numel}, shard.dtype(), comm.device(), MemoryCategory::other);
  comm.gather(mine, full, 0);
  return full;
}

// A shard optimizer's state names its buffer "<unit> shard"; the checkpoint
// names it as a single-device run does, "<unit>".
std::string unsharded_name(const std::string& state, const std::string& buffer, const std::string& unit) {
  DTP_CHECK(state.rfind(buffer + ".", 0) == 0, "ShardedOptimizer: state '", state, "' is not of buffer '", buffer,
            "'");
  return unit + state.substr(buffer.size());
}

// Which buffer (unit) each of the shard optimizer's state tensors belongs to.
template <typename Fn>
void for_each_state(Optimizer& shard_optimizer, const std::vector<Unit*>& units, Fn&& fn) {
  const std::vector<ParamBuffer>& buffers = shard_optimizer.buffers();
  for (NamedTensor& state : shard_optimizer.state()) {
    std::size_t u = 0;
    while (u < buffers.size() && state.name.rfind(buffers[u].name + ".", 0) != 0) ++u;
    DTP_CHECK(u < buffers.size(), "ShardedOptimizer: state '", state.name, "' belongs to no buffer");
    fn(*units[u], unsharded_name(state.name, buffers[u].name, units[u]->name()), state.tensor);
  }
}

// The checkpoint's tensor @p name, which must hold @p numel elements of @p dtype.
const Tensor& saved_tensor(const Checkpoint& checkpoint, const std::string& name, std::int64_t numel, DType dtype,
                           const std::string& path) {
  DTP_CHECK(checkpoint.has(name), "--resume ", path, ": the checkpoint has no ", name);
  const Tensor& saved = checkpoint.tensor(name);
  DTP_CHECK(saved.numel() == numel && saved.dtype() == dtype, "--resume ", path, ": ", name, " is ",
            saved.shape().str(), " ", dtype_name(saved.dtype()), " in the checkpoint, but this run's holds ", numel,
            " elements of ", dtype_name(dtype));
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
      tensors.push_back({parameter_entry(unit->name(), p.name), full.slice(p.offset, p.shape.numel()).view(p.shape)});
  }
  for_each_state(*optimizer_, units, [&](Unit& unit, const std::string& name, const Tensor& shard) {
    const Tensor full = gather_full(comm_, shard, unit.numel());
    if (comm_.rank() == 0) tensors.push_back({optimizer_entry(name), full});
  });
  return tensors;
}

void ShardedOptimizer::restore_shards(const Checkpoint& checkpoint, const std::string& path) {
  std::vector<Unit*> units = model_.units();
  for (Unit* unit : units) {
    // The unit's flat parameters, assembled from its named ones.
    Tensor full = Tensor::empty(Shape{unit->numel()}, parameter_shard(unit->index()).dtype(), Device::cpu(),
                                MemoryCategory::other);
    for (const ParamView& p : unit->parameters()) {
      const std::string name = parameter_entry(unit->name(), p.name);
      full.slice(p.offset, p.shape.numel()).copy_from(saved_tensor(checkpoint, name, p.shape.numel(), full.dtype(), path).flatten());
    }
    if (unit->params().defined()) unit->params().copy_from(full);  // ZeRO-1, ZeRO-2: full on every rank
    const ChunkRange range = shard(unit->index());
    parameter_shard(unit->index()).copy_from(full.slice(range.offset, range.length));
  }
  for_each_state(*optimizer_, units, [&](Unit& unit, const std::string& name, Tensor& shard) {
    const ChunkRange range = this->shard(unit.index());
    const Tensor& saved = saved_tensor(checkpoint, optimizer_entry(name), unit.numel(), shard.dtype(), path);
    shard.copy_from(saved.flatten().slice(range.offset, range.length));
  });
  optimizer_->set_steps(steps_);
}

}  // namespace dtp::ch03
