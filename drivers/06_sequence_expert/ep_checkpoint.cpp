// An expert-parallel run's checkpoint (provided, not a puzzle): consolidated,
// as ZeRO's (chapter 03). The replicated part of the model is the same on
// every rank; each block's experts are spread, rank r holding experts
// [r L, (r + 1) L) at the end of the block's flat buffer. Rank 0 gathers
// those regions in rank order, which is the order of a single-device block,
// and writes the file a single-device run of the same MoE model writes. On
// --resume each rank copies its own experts' parameters by their names and
// cuts its own region out of each optimizer state tensor.
#include <string>

#include "06_sequence_expert/sequence_expert.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"

namespace dtp::ch06 {
namespace {

const std::string kExperts = " experts";  // the optimizer buffer of a block's owned experts
const std::string kExpertTag = ".expert.";

// Rank 0's concatenation of every rank's @p region (undefined elsewhere).
Tensor gather_regions(Comm& ep, const Tensor& region) {
  Tensor all;
  if (ep.rank() == 0)
    all = Tensor::empty(Shape{region.numel() * ep.size()}, region.dtype(), region.device(), MemoryCategory::other);
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

// An optimizer state tensor's name, "<buffer>.<kind>" (kind m, v or
// momentum), taken apart: the buffer is "<unit>" (its replicated part) or
// "<unit> experts" (a block's experts on this rank).
struct StateName {
  std::string unit, kind;
  bool experts = false;
  std::string saved() const { return optimizer_entry(unit + "." + kind); }  // the single-device name
};
StateName split_state(const std::string& name) {
  const std::size_t dot = name.rfind('.');
  DTP_CHECK(dot != std::string::npos, "ep checkpoint: optimizer state '", name, "' is not <buffer>.<kind>");
  std::string buffer = name.substr(0, dot);
  const bool experts = buffer.size() > kExperts.size() &&
                       buffer.compare(buffer.size() - kExperts.size(), kExperts.size(), kExperts) == 0;
  if (experts) buffer.resize(buffer.size() - kExperts.size());
  return {buffer, name.substr(dot + 1), experts};
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
        for (const ParamView& p : unit->parameters()) tensors.push_back({parameter_entry(unit->name(), p.name), p.value});
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
          tensors.push_back({parameter_entry(unit->name(), renumbered(p.name, r * local_)),
                             all.slice(r * owned.numel() + p.offset - start, p.shape.numel()).view(p.shape)});
  }
  // Optimizer state: a block's replicated part and its experts make one
  // tensor of the single-device layout, the experts gathered in rank order.
  const std::vector<NamedTensor> state = trainer_->optimizer().state();
  for (const NamedTensor& s : state) {
    const StateName name = split_state(s.name);
    if (name.experts) continue;  // joined to its block's replicated part below
    const NamedTensor* experts = nullptr;
    for (const NamedTensor& e : state)
      if (e.name == name.unit + kExperts + "." + name.kind) experts = &e;
    if (experts == nullptr) {
      if (root) tensors.push_back({name.saved(), s.tensor});
      continue;
    }
    const Tensor all = gather_regions(ep_, experts->tensor);
    if (!root) continue;
    Tensor full = Tensor::empty(Shape{s.tensor.numel() + all.numel()}, s.tensor.dtype(), s.tensor.device(),
                                MemoryCategory::other);
    full.slice(0, s.tensor.numel()).copy_from(s.tensor);
    full.slice(s.tensor.numel(), all.numel()).copy_from(all);
    tensors.push_back({name.saved(), full});
  }
  return tensors;
}

void ExpertParallelTrainer::resume(const std::string& path, const std::vector<RunSetting>& strategy) {
  const Checkpoint checkpoint = trainer_->resume_gathered(path, strategy);
  GPT& model = trainer_->model();
  // Parameters: this rank's model names its experts as the single-device one does.
  load_parameters(model, checkpoint, path);
  for (NamedTensor& s : trainer_->optimizer().state()) {
    const StateName name = split_state(s.name);
    DTP_CHECK(checkpoint.has(name.saved()), "--resume ", path, ": the checkpoint has no ", name.saved());
    const Tensor saved = checkpoint.tensor(name.saved()).flatten();
    // The replicated part is the saved tensor's start; rank r's experts are
    // the r-th of the equal regions after it.
    std::int64_t start = 0;
    if (name.experts) start = saved.numel() - (ep_.size() - ep_.rank()) * s.tensor.numel();
    DTP_CHECK(start >= 0 && start + s.tensor.numel() <= saved.numel(), "--resume ", path, ": ", name.saved(),
              " holds ", saved.numel(), " elements, too few for this rank's ", s.tensor.numel(), " (", s.name, ")");
    s.tensor.copy_from(saved.slice(start, s.tensor.numel()));
  }
}

}  // namespace dtp::ch06
