// An expert-parallel run's checkpoint (provided, not a puzzle): consolidated,
// as ZeRO's (chapter 03). The replicated part of the model is the same on
// every rank; each block's experts are spread, rank r holding experts
// [r L, (r + 1) L) at the end of the block's flat buffer. Rank 0 gathers
// those regions in rank order, which is the order of a single-device block,
// and writes the file a single-device run of the same MoE model writes. On
// --resume each rank copies its own experts' parameters by their names and
// cuts its own region out of each optimizer state tensor.
#include <string>

#include "drivers/06_sequence_expert/ep_strategy.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch06 {
namespace {

const std::string kExperts = " experts";  // the optimizer buffer of a block's owned experts
const std::string kExpertTag = ".expert.";

// Rank 0's concatenation of every rank's @p region (undefined elsewhere).
Tensor gather_regions(Comm& ep, const Tensor& region) {
  Tensor all;
  if (ep.rank() == 0)
    all = Tensor::empty(Shape{region.numel() * ep.size()}, region.dtype(), region.device(),
                        MemoryCategory::other);
  ep.gather(region, all, 0);
  return all;
}

// "block.0"'s "moe.expert.1.fc.weight" as the expert @p shift further on:
// "moe.expert.<1 + shift>.fc.weight".
std::string renumbered(const std::string& name, int shift) {
  const std::size_t at = name.find(kExpertTag);
  DTP_CHECK(at != std::string::npos, "ep checkpoint: '", name, "' is not an expert's parameter");
  const std::size_t digits = at + kExpertTag.size();
  const std::size_t end = name.find('.', digits);
  const int expert = std::stoi(name.substr(digits, end - digits));
  return name.substr(0, digits) + std::to_string(expert + shift) + name.substr(end);
}

}  // namespace

std::vector<NamedTensor> ExpertParallelTrainer::gather_checkpoint() {
  GPT& model = trainer_->model();
  const bool root = ep_.rank() == 0;
  std::vector<NamedTensor> tensors;
  std::size_t block = 0;
  for (Unit* unit : model.units()) {
    if (dynamic_cast<Block*>(unit) == nullptr) {
      if (root)
        for (const ParamView& p : unit->parameters())
          tensors.push_back({parameter_entry(unit->name(), p.name), p.value});
      continue;
    }
    const Tensor& owned = owned_[block++].params;
    const std::int64_t start = unit->numel() - owned.numel();  // where this rank's experts begin
    const Tensor all = gather_regions(ep_, owned);
    if (!root) continue;
    for (const ParamView& p : unit->parameters())
      if (p.offset < start) tensors.push_back({parameter_entry(unit->name(), p.name), p.value});
    for (int r = 0; r < ep_.size(); ++r)
      for (const ParamView& p : unit->parameters())
        if (p.offset >= start)
          tensors.push_back(
              {parameter_entry(unit->name(), renumbered(p.name, r * local_)),
               all.slice(r * owned.numel() + p.offset - start, p.shape.numel()).view(p.shape)});
  }
  // Optimizer state: a block's replicated part ("<unit>") and its experts
  // ("<unit> experts") make one tensor of the single-device layout, the
  // experts gathered in rank order.
  const Optimizer& optimizer = trainer_->optimizer();
  for (Unit* unit : model.units()) {
    const bool block = dynamic_cast<Block*>(unit) != nullptr;
    for (const std::string& kind : state_kinds(optimizer)) {
      const std::string name = optimizer_entry(unit->name(), kind);
      const Tensor replicated = state_tensor(optimizer, unit->name(), kind);
      if (!block) {
        if (root) tensors.push_back({name, replicated});
        continue;
      }
      const Tensor all =
          gather_regions(ep_, state_tensor(optimizer, unit->name() + kExperts, kind));
      if (!root) continue;
      Tensor full = Tensor::empty(Shape{replicated.numel() + all.numel()}, replicated.dtype(),
                                  replicated.device(), MemoryCategory::other);
      full.slice(0, replicated.numel()).copy_from(replicated);
      full.slice(replicated.numel(), all.numel()).copy_from(all);
      tensors.push_back({name, full});
    }
  }
  return tensors;
}

void ExpertParallelTrainer::save(const std::string& path, const std::vector<RunSetting>& strategy) {
  std::vector<NamedTensor> gathered = gather_checkpoint();  // every rank takes part
  if (ep_.rank() == 0) trainer_->save_gathered(path, strategy, std::move(gathered));
}

void ExpertParallelTrainer::resume(const std::string& path,
                                   const std::vector<RunSetting>& strategy) {
  const Checkpoint checkpoint = trainer_->resume_gathered(path, strategy);
  GPT& model = trainer_->model();
  // Parameters: this rank's model names its experts as the single-device one does.
  load_parameters(model, checkpoint, path);
  const Optimizer& optimizer = trainer_->optimizer();
  for (Unit* unit : model.units()) {
    const bool block = dynamic_cast<Block*>(unit) != nullptr;
    for (const std::string& kind : state_kinds(optimizer)) {
      const std::string name = optimizer_entry(unit->name(), kind);
      DTP_CHECK(checkpoint.has(name), "--resume ", path, ": the checkpoint has no ", name);
      const Tensor saved = checkpoint.tensor(name).flatten();
      // The replicated part is the saved tensor's start; rank r's experts
      // are the r-th of the equal regions after it.
      Tensor replicated = state_tensor(optimizer, unit->name(), kind);
      Tensor experts = block ? state_tensor(optimizer, unit->name() + kExperts, kind) : Tensor();
      const std::int64_t whole = replicated.numel() + (block ? ep_.size() * experts.numel() : 0);
      DTP_CHECK(saved.numel() == whole, "--resume ", path, ": ", name, " holds ", saved.numel(),
                " elements, the whole ", unit->name(), " of this model ", whole);
      replicated.copy_from(saved.slice(0, replicated.numel()));
      if (block)
        experts.copy_from(
            saved.slice(replicated.numel() + ep_.rank() * experts.numel(), experts.numel()));
    }
  }
}

}  // namespace dtp::ch06
