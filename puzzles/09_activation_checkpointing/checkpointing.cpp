// Chapter 09 — activation checkpointing.
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 09
// to see which puzzles pass. The contract is in
// chapters/09_activation_checkpointing/checkpointing.h; the lesson (where
// activation memory comes from, what recomputation costs) is in
// chapters/09_activation_checkpointing/README.md.
//
// Tools you may use:
//   block.run_forward(x, saved)            the block's layers: output, and saved filled
//   block.run_backward(dy, saved, mode, loss_scale)
//                                          dx, from what saved holds
//   saved.clear()                          drops every tensor in a BlockSaved
//   saved.checkpoint                       a Tensor slot for the block input
//   saved.attn.q, .k, .v, .probs           attention's saved tensors ([B, T, C] and
//                                          [B, H, T, T])
//   { dtp::RecomputeScope scope; ... }     what is made inside counts as recompute
//   ops::attention_forward(q, k, v, out, probs)
//                                          q, k, v, out viewed as [B, T, H, D]
//   t.view(shape), Tensor::empty(shape, dtype, device, category)
//   predicted_activation_peaks(step, keeps), predicted_stage_peaks(step, pipeline, keeps)
//                                          the lesson's formulas (dtp/activation_memory.h)
//   saved_tensor_slots(saved)              pointers to every Tensor slot of a BlockSaved
//   copy_lane().copy_to(t, device, category, name), copy_lane().drain()
//                                          copies beside the compute (dtp/copy_lane.h)
//   saved.offloaded                        OffloadedTensor{host, device, slots}
//   a.shares_storage_with(b)               the same tensor (or a view of it)
// The `(void)x;` lines only silence unused-parameter warnings: delete them.
#include "09_activation_checkpointing/checkpointing.h"

namespace dtp::ch09 {

Tensor FullRecomputation::forward(const Block& block, const Tensor& x, BlockSaved& saved) const {
  // About 4 lines: run the block, keep only its input.
  (void)block;
  (void)x;
  (void)saved;
  throw dtp::NotSolved("9.1 full_recomputation");
}

Tensor FullRecomputation::backward(const Block& block, const Tensor& dy, BlockSaved& saved,
                                   WeightGrads mode, double loss_scale) const {
  // About 8 lines: make the saved tensors again from the checkpoint (the
  // output it gives is not needed), then the block's own backward.
  (void)block;
  (void)dy;
  (void)saved;
  (void)mode;
  (void)loss_scale;
  throw dtp::NotSolved("9.1 full_recomputation");
}

std::vector<bool> checkpoint_every(int layers, int k) {
  // About 5 lines.
  (void)layers;
  (void)k;
  throw dtp::NotSolved("9.2 checkpoint_plan");
}

int largest_every_within(const StepShape& step, std::int64_t budget_bytes) {
  // About 15 lines. A plan's peak is predicted_activation_peaks(...).combined
  // with BlockKeeps::input_only for a checkpointed block.
  (void)step;
  (void)budget_bytes;
  throw dtp::NotSolved("9.2 checkpoint_plan");
}

int blocks_to_checkpoint(const StepShape& step, const PipelineStage& pipeline, int blocks,
                         std::int64_t budget_bytes) {
  // About 15 lines: try c = 0, 1, ..., blocks with the first c blocks as
  // BlockKeeps::input_only; predicted_stage_peaks(...).combined is the peak.
  (void)step;
  (void)pipeline;
  (void)blocks;
  (void)budget_bytes;
  throw dtp::NotSolved("9.5 pipeline_checkpointing");
}

Tensor SelectiveRecomputation::forward(const Block& block, const Tensor& x,
                                       BlockSaved& saved) const {
  // About 6 lines, the check for flash attention included.
  (void)block;
  (void)x;
  (void)saved;
  throw dtp::NotSolved("9.3 selective_recomputation");
}

Tensor SelectiveRecomputation::backward(const Block& block, const Tensor& dy, BlockSaved& saved,
                                        WeightGrads mode, double loss_scale) const {
  // About 10 lines: the probabilities again (and a scratch output), then the
  // block's own backward.
  (void)block;
  (void)dy;
  (void)saved;
  (void)mode;
  (void)loss_scale;
  throw dtp::NotSolved("9.3 selective_recomputation");
}

Tensor OffloadedActivations::forward(const Block& block, const Tensor& x, BlockSaved& saved) const {
  // About 20 lines: run the block, drain the lane, queue one host copy per
  // distinct saved tensor (record its slots), empty the slots. Do not wait
  // for your own copies.
  (void)block;
  (void)x;
  (void)saved;
  throw dtp::NotSolved("9.4 offloaded_activations");
}

Tensor OffloadedActivations::backward(const Block& block, const Tensor& dy, BlockSaved& saved,
                                      WeightGrads mode, double loss_scale) const {
  // About 15 lines: drain, fetch every copy back (inside a RecomputeScope),
  // drain, refill the slots, then the block's own backward.
  (void)block;
  (void)dy;
  (void)saved;
  (void)mode;
  (void)loss_scale;
  throw dtp::NotSolved("9.4 offloaded_activations");
}

}  // namespace dtp::ch09
