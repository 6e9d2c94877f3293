// A tensor-parallel run's checkpoint (provided, not a puzzle): consolidated,
// as ZeRO's (chapter 03). The DP replicas hold the same slices, so DP group
// 0 alone puts each parameter back together on world rank 0
// (gather_tensor_parallel_slices: rows concatenate, columns interleave), and
// each optimizer state tensor likewise, parameter by parameter, into the
// serial unit's layout. The serial model's released units still know every
// parameter's full shape and offset. To resume, each rank cuts its slices
// out of the file's full tensors, exactly as it cut them from the serial
// model at the start.
#include <string>

#include "drivers/04_tensor_parallel/tp_strategy.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch04 {

void TensorParallelTrainer::save(const std::string& path, const std::vector<RunSetting>& strategy) {
  if (mesh_.dp.rank() != 0) return;  // a replica of DP group 0's slices
  const Optimizer& optimizer = serial_->optimizer();
  const std::vector<std::string> kinds = state_kinds(optimizer);
  const std::vector<Unit*> serial = serial_->model().units();
  const std::vector<Unit*> units = model_->units();
  const bool root = mesh_.tp.rank() == 0;
  std::vector<NamedTensor> params, state;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const auto& sliced = units[u]->parameters();
    const auto& whole = serial[u]->parameters();
    for (std::size_t i = 0; i < sliced.size(); ++i) {
      const Tensor full =
          gather_tensor_parallel_slices(mesh_.tp, sliced[i].name, sliced[i].value, whole[i].shape);
      if (root) params.push_back({parameter_entry(units[u]->name(), sliced[i].name), full});
    }
    for (const std::string& kind : kinds) {
      const Tensor mine = state_tensor(optimizer, units[u]->name(), kind);
      Tensor consolidated;
      if (root)
        consolidated = Tensor::empty(Shape{serial[u]->numel()}, mine.dtype(), mine.device(),
                                     MemoryCategory::other);
      for (std::size_t i = 0; i < sliced.size(); ++i) {
        const Tensor region =
            mine.slice(sliced[i].offset, sliced[i].shape.numel()).view(sliced[i].shape);
        const Tensor full =
            gather_tensor_parallel_slices(mesh_.tp, sliced[i].name, region, whole[i].shape);
        if (root)
          consolidated.slice(whole[i].offset, whole[i].shape.numel()).copy_from(full.flatten());
      }
      if (root) state.push_back({optimizer_entry(units[u]->name(), kind), consolidated});
    }
  }
  if (!root) return;
  for (NamedTensor& t : state) params.push_back(std::move(t));
  serial_->save_gathered(path, strategy, std::move(params));
}

void TensorParallelTrainer::resume(const std::string& path,
                                   const std::vector<RunSetting>& strategy) {
  const Checkpoint checkpoint = serial_->resume_gathered(path, strategy);
  const Optimizer& optimizer = serial_->optimizer();
  const std::vector<std::string> kinds = state_kinds(optimizer);
  const std::vector<Unit*> serial = serial_->model().units();
  const std::vector<Unit*> units = model_->units();
  auto saved = [&](const std::string& name, const Shape& shape) {
    DTP_CHECK(checkpoint.has(name), "--resume ", path, ": the checkpoint has no ", name);
    const Tensor& t = checkpoint.tensor(name);
    DTP_CHECK(t.numel() == shape.numel(), "--resume ", path, ": ", name, " holds ", t.numel(),
              " elements, this ", "model's ", shape.numel(), " (", shape.str(), ")");
    return t;
  };
  for (std::size_t u = 0; u < units.size(); ++u) {
    const auto& sliced = units[u]->parameters();
    const auto& whole = serial[u]->parameters();
    const std::string unit = units[u]->name();
    for (std::size_t i = 0; i < sliced.size(); ++i) {
      const Tensor full =
          saved(parameter_entry(unit, sliced[i].name), whole[i].shape).view(whole[i].shape);
      copy_tensor_parallel_slice(sliced[i].name, full, sliced[i].value, mesh_.tp.size(),
                                 mesh_.tp.rank());
    }
    for (const std::string& kind : kinds) {
      const Tensor consolidated =
          saved(optimizer_entry(unit, kind), Shape{serial[u]->numel()}).flatten();
      const Tensor mine = state_tensor(optimizer, unit, kind);
      for (std::size_t i = 0; i < sliced.size(); ++i)
        copy_tensor_parallel_slice(
            sliced[i].name,
            consolidated.slice(whole[i].offset, whole[i].shape.numel()).view(whole[i].shape),
            mine.slice(sliced[i].offset, sliced[i].shape.numel()).view(sliced[i].shape),
            mesh_.tp.size(), mesh_.tp.rank());
    }
  }
}

}  // namespace dtp::ch04
