// Which blocks to checkpoint: every k-th, or the fewest that fit a budget.
#include <string>

#include "09_activation_checkpointing/checkpointing.h"

namespace dtp::ch09 {

std::vector<bool> checkpoint_every(int layers, int k) {
  DTP_CHECK(k >= 1, "checkpoint_every: k must be at least 1 (every k-th block), got ", k);
  DTP_CHECK(layers >= 0, "checkpoint_every: layers must be at least 0, got ", layers);
  std::vector<bool> plan(static_cast<std::size_t>(layers), false);
  for (int i = 0; i < layers; i += k) plan[static_cast<std::size_t>(i)] = true;
  return plan;
}

namespace {
std::vector<BlockKeeps> keeps_of(const std::vector<bool>& plan) {
  std::vector<BlockKeeps> keeps;
  for (bool checkpointed : plan)
    keeps.push_back(checkpointed ? BlockKeeps::input_only : BlockKeeps::everything);
  return keeps;
}

std::int64_t peak_of(const StepShape& step, int k) {
  const ActivationPeaks peaks =
      predicted_activation_peaks(step, keeps_of(checkpoint_every(step.config.layers, k)));
  return peaks.combined;
}
}  // namespace

int largest_every_within(const StepShape& step, std::int64_t budget_bytes) {
  const int layers = step.config.layers;
  const std::vector<bool> none(static_cast<std::size_t>(layers), false);
  const ActivationPeaks plain = predicted_activation_peaks(step, keeps_of(none));
  if (plain.combined <= budget_bytes) return 0;
  // The first k that fits, from the largest down.
  for (int k = layers; k >= 1; --k)
    if (peak_of(step, k) <= budget_bytes) return k;
  throw Error("largest_every_within: no plan fits " + std::to_string(budget_bytes) +
              " bytes; checkpointing every block still peaks at " +
              std::to_string(peak_of(step, 1)) + " bytes");
}

}  // namespace dtp::ch09
