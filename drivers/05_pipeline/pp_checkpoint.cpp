// A pipeline run's checkpoint (provided, not a puzzle): consolidated, as
// ZeRO's (chapter 03). Each unit lives on one stage; under --fsdp it is
// further sharded over that stage's replicas. To save, unit by unit in model
// order, the stage's replicas gather its shards (FSDP), and replica 0 sends
// the whole unit along its pipeline to world rank 0, which writes a single
// device's layout. To resume, every rank reads the file and keeps what it
// holds. Every rank walks the units in the same order, so each transfer has
// its partner waiting.
#include <string>

#include "drivers/05_pipeline/pp_strategy.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch05 {
namespace {

// The stage that holds unit @p unit.
int owner_stage(const std::vector<UnitRange>& partition, int pp, int unit) {
  for (std::size_t vs = 0; vs < partition.size(); ++vs)
    if (unit >= partition[vs].first && unit < partition[vs].first + partition[vs].count)
      return static_cast<int>(vs) % pp;
  DTP_CHECK(false, "pp checkpoint: unit ", unit, " is in no stage of the partition");
  return -1;
}

}  // namespace

void PipelineTrainer::save(const std::string& path, const std::vector<RunSetting>& strategy) {
  GPT& model = serial_->model();
  const Optimizer& optimizer_state = serial_->optimizer();
  const std::vector<std::string> kinds = state_kinds(optimizer_state);
  const bool fsdp = !fsdp_.empty();
  // This rank's FSDP shard of one of its units.
  auto fsdp_shard = [&](const Unit& unit) {
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const std::vector<Unit*> units = chunks_[c]->units();
      for (std::size_t u = 0; u < units.size(); ++u)
        if (units[u] == &unit) return fsdp_[c]->parameter_shards()[u];
    }
    DTP_CHECK(false, "pp checkpoint: unit ", unit.name(), " is in none of this rank's chunks");
    return Tensor();
  };
  const bool root = mesh_.pp.rank() == 0 && mesh_.dp.rank() == 0;
  std::vector<NamedTensor> params, optimizer;  // world rank 0's, in unit order
  for (Unit* unit : model.units()) {
    const int stage = owner_stage(partition_, options_.pp, unit->index());
    const bool mine = mesh_.pp.rank() == stage;
    const std::string buffer = unit->name() + (fsdp ? " shard" : "");
    // What this rank holds of the unit: its parameters and each optimizer
    // state, whole or (FSDP) its shard of them.
    std::vector<Tensor> held;
    if (mine) {
      held.push_back(fsdp ? fsdp_shard(*unit) : unit->params());
      for (const std::string& kind : kinds)
        held.push_back(state_tensor(optimizer_state, buffer, kind));
    }
    auto new_whole = [&] {
      return Tensor::empty(Shape{unit->numel()}, model.config().dtype, model.config().device,
                           MemoryCategory::other);
    };
    for (std::size_t k = 0; k < 1 + kinds.size(); ++k) {
      Tensor whole;
      if (mine) {
        if (!fsdp) {
          whole = held[k];
        } else {
          if (mesh_.dp.rank() == 0) whole = new_whole();
          mesh_.dp.gather(held[k], whole, 0);
        }
        if (mesh_.dp.rank() == 0 && stage != 0) mesh_.pp.send(whole, 0);
      } else if (root) {
        whole = new_whole();
        mesh_.pp.recv(whole, stage);
      }
      if (!root) continue;
      if (k == 0) {
        for (const ParamView& p : unit->parameters())
          params.push_back({parameter_entry(unit->name(), p.name),
                            whole.flatten().slice(p.offset, p.shape.numel()).view(p.shape)});
      } else {
        optimizer.push_back({optimizer_entry(unit->name(), kinds[k - 1]), whole.flatten()});
      }
    }
  }
  if (!root) return;
  for (NamedTensor& t : optimizer) params.push_back(std::move(t));
  serial_->save_gathered(path, strategy, std::move(params));
}

void PipelineTrainer::resume(const std::string& path, const std::vector<RunSetting>& strategy) {
  const Checkpoint checkpoint = serial_->resume_gathered(path, strategy);
  GPT& model = serial_->model();
  const Optimizer& optimizer_state = serial_->optimizer();
  const std::vector<std::string> kinds = state_kinds(optimizer_state);
  const bool fsdp = !fsdp_.empty();
  auto saved = [&](const std::string& name, std::int64_t numel) {
    DTP_CHECK(checkpoint.has(name), "--resume ", path, ": the checkpoint has no ", name);
    const Tensor& t = checkpoint.tensor(name);
    DTP_CHECK(t.numel() == numel, "--resume ", path, ": ", name, " holds ", t.numel(),
              " elements, this run's ", numel);
    return t.flatten();
  };
  for (auto& chunk : chunks_) {
    std::vector<Unit*> units = chunk->units();
    for (std::size_t u = 0; u < units.size(); ++u) {
      Unit& unit = *units[u];
      Tensor full = Tensor::empty(Shape{unit.numel()}, model.config().dtype, Device::cpu(),
                                  MemoryCategory::other);
      for (const ParamView& p : unit.parameters())
        full.slice(p.offset, p.shape.numel())
            .copy_from(saved(parameter_entry(unit.name(), p.name), p.shape.numel()));
      const ChunkRange range = fsdp ? chunk_range(unit.numel(), mesh_.dp.size(), mesh_.dp.rank())
                                    : ChunkRange{0, unit.numel()};
      if (fsdp) {
        PipelineFsdp& shards = *fsdp_[static_cast<std::size_t>(chunk->chunk())];
        shards.parameter_shards()[u].copy_from(full.slice(range.offset, range.length));
      } else {
        unit.params().copy_from(full);
      }
      const std::string buffer = unit.name() + (fsdp ? " shard" : "");
      for (const std::string& kind : kinds) {
        Tensor mine = state_tensor(optimizer_state, buffer, kind);
        mine.copy_from(saved(optimizer_entry(unit.name(), kind), unit.numel())
                           .slice(range.offset, range.length));
      }
    }
  }
}

}  // namespace dtp::ch05
