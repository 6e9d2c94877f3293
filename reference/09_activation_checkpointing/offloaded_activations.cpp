// Offloaded activations: a block's saved tensors go to host memory on the
// copy lane while the next block computes, and come back for its backward.
#include "09_activation_checkpointing/checkpointing.h"

namespace dtp::ch09 {

Tensor OffloadedActivations::forward(const Block& block, const Tensor& x, BlockSaved& saved) const {
  Tensor out = block.run_forward(x, saved);
  CopyLane& lane = copy_lane();
  lane.drain();  // the previous block's copies: done, and their device tensors let go
  const std::vector<Tensor*> slots = saved_tensor_slots(saved);
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) {
    const Tensor& t = *slots[static_cast<std::size_t>(i)];
    if (!t.defined()) continue;
    OffloadedTensor* same = nullptr;
    for (OffloadedTensor& o : saved.offloaded)
      if (slots[static_cast<std::size_t>(o.slots.front())]->shares_storage_with(t)) same = &o;
    if (same != nullptr) {
      same->slots.push_back(i);
      continue;
    }
    saved.offloaded.push_back(
        {lane.copy_to(t, Device::cpu(), MemoryCategory::offloaded, "offload " + block.name()),
         t.device(),
         {i}});
  }
  for (Tensor* slot : slots) *slot = Tensor();
  return out;
}

Tensor OffloadedActivations::backward(const Block& block, const Tensor& dy, BlockSaved& saved,
                                      WeightGrads mode, double loss_scale) const {
  DTP_CHECK(!saved.offloaded.empty(), block.name(),
            " backward: nothing offloaded (forward not run, or its backward already ran)");
  CopyLane& lane = copy_lane();
  lane.drain();  // the last forward's copies are in host memory
  const std::vector<Tensor*> slots = saved_tensor_slots(saved);
  {
    RecomputeScope fetched;
    for (const OffloadedTensor& o : saved.offloaded) {
      const Tensor back =
          lane.copy_to(o.host, o.device, MemoryCategory::activations, "fetch " + block.name());
      for (int i : o.slots) *slots[static_cast<std::size_t>(i)] = back;
    }
    lane.drain();
  }
  saved.offloaded.clear();
  return block.run_backward(dy, saved, mode, loss_scale);
}

}  // namespace dtp::ch09
