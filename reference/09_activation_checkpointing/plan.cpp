// Which blocks to checkpoint: every k-th, or the fewest that fit a budget.
#include <algorithm>
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

int blocks_to_checkpoint(const StepShape& step, const PipelineStage& pipeline, int blocks,
                         std::int64_t budget_bytes) {
  DTP_CHECK(blocks >= 0, "blocks_to_checkpoint: blocks must be at least 0, got ", blocks);
  auto peak = [&](int c) {  // the stage's first c blocks checkpointed
    std::vector<BlockKeeps> keeps(static_cast<std::size_t>(blocks), BlockKeeps::everything);
    std::fill(keeps.begin(), keeps.begin() + c, BlockKeeps::input_only);
    return predicted_stage_peaks(step, pipeline, keeps).combined;
  };
  for (int c = 0; c <= blocks; ++c)
    if (peak(c) <= budget_bytes) return c;
  throw Error("blocks_to_checkpoint: stage " + std::to_string(pipeline.stage) + " of " +
              std::to_string(pipeline.stages) + " does not fit " + std::to_string(budget_bytes) +
              " bytes; checkpointing all its " + std::to_string(blocks) +
              " blocks still peaks at " + std::to_string(peak(blocks)) + " bytes");
}

}  // namespace dtp::ch09
