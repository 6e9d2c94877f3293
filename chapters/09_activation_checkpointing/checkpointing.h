/// @file checkpointing.h
/// @brief Chapter 09 contract: activation checkpointing.
///
/// A block's forward keeps what its backward needs: about 16 activations of
/// the block's width per token, plus the attention probabilities. Across L
/// blocks that is most of a training step's memory. Activation checkpointing
/// keeps less and computes the rest again in the backward:
///
/// - full recomputation (9.1) keeps only a block's input and runs the whole
///   block's forward again just before its backward;
/// - a plan (9.2) decides which blocks to treat so: every k-th, or the
///   fewest that fit a memory budget;
/// - selective recomputation (9.3) keeps everything but the attention
///   probabilities, the part that grows with the sequence length squared and
///   costs the fewest FLOPs to make again;
/// - offloading (9.4) computes nothing twice: it copies a block's tensors to
///   host memory while the next block computes, and back for the backward;
/// - in a 1F1B pipeline (9.5) the first stages hold the most micro-batches,
///   so each stage checkpoints as many blocks as its own budget needs.
///
/// How it plugs in: a policy derives from dtp::ActivationPolicy (dtp/gpt.h)
/// and is installed on a block with `block.policy = &policy`. From then on
/// every caller of Block::forward and Block::backward (the GPT, a pipeline
/// stage, FSDP's hooks around them) runs the policy instead, which does the
/// block's work through Block::run_forward and Block::run_backward.
/// `dtp train --checkpoint full|every:K|selective` installs them
/// (drivers/checkpointing.h). See
/// chapters/09_activation_checkpointing/README.md.
#pragma once

#include <cstdint>
#include <vector>

#include "dtp/activation_memory.h"
#include "dtp/copy_lane.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/nn.h"

/// Chapter 09: activation checkpointing.
namespace dtp::ch09 {

/// Puzzle 9.1. Full recomputation of a block.
///
/// forward() runs the block (Block::run_forward), keeps its input x in
/// saved.checkpoint (the tensor itself, not a copy) and drops every other
/// tensor the layers saved, so that between forward and backward the block
/// holds nothing but the input it was given. A mixture-of-experts block
/// also leaves its load-balancing loss in saved.moe.aux_loss, a number the
/// model adds to its loss after the forward: it stays.
///
/// backward() runs the block's forward again from saved.checkpoint, inside a
/// dtp::RecomputeScope (so the tracker charges what it makes to
/// MemoryCategory::recompute and the FLOPs count as recomputed), drops the
/// recomputed output (the next block already has the first one), then runs
/// Block::run_backward, and drops the checkpoint.
///
/// The model has no dropout and every op is deterministic, so the recomputed
/// tensors equal the first ones bit for bit, and so do the gradients: a
/// checkpointed step equals a plain one exactly.
class FullRecomputation : public ActivationPolicy {
 public:
  Tensor forward(const Block& block, const Tensor& x, BlockSaved& saved) const override;
  Tensor backward(const Block& block, const Tensor& dy, BlockSaved& saved, WeightGrads mode,
                  double loss_scale) const override;
};

/// Puzzle 9.2 (first half). Which blocks of @p layers to checkpoint when
/// every k-th one is: blocks 0, k, 2k, ... (entry i is true for block i).
/// k = 1 checkpoints every block; k >= layers only block 0. Throws
/// dtp::Error naming k when k < 1.
std::vector<bool> checkpoint_every(int layers, int k);

/// Puzzle 9.2 (second half). The largest k such that checkpointing every
/// k-th block (checkpoint_every, full recomputation) keeps one rank's
/// activation peak for @p step within @p budget_bytes: the peak of the kept
/// and the recomputed activations together, ActivationPeaks::combined by the
/// lesson's formula (predicted_activation_peaks() in dtp/activation_memory.h).
/// The largest k recomputes the fewest blocks: the least extra compute that
/// fits. Returns 0 when no block needs checkpointing (the plain step fits).
/// Throws dtp::Error when even k = 1 does not fit, naming the budget and
/// k = 1's peak.
int largest_every_within(const StepShape& step, std::int64_t budget_bytes);

/// Puzzle 9.3. Selective recomputation of a block (Korthikanti et al., 2022).
///
/// forward() runs the block (Block::run_forward) and drops only the
/// attention probabilities (saved.attn.probs, [B, H, T, T]); everything else
/// stays. backward() makes the probabilities again from the saved q and k,
/// inside a dtp::RecomputeScope: ops::attention_forward writes them and an
/// attention output (a scratch tensor, dropped at once: the saved one is
/// still there), exactly what the block's forward computed. Then
/// Block::run_backward.
///
/// Only naive attention keeps probabilities: with flash attention there is
/// nothing to drop (its backward already makes them again), and forward()
/// throws dtp::Error saying so; so it does for a block whose attention runs
/// through an AttentionCore (sequence parallelism), which keeps its own.
class SelectiveRecomputation : public ActivationPolicy {
 public:
  Tensor forward(const Block& block, const Tensor& x, BlockSaved& saved) const override;
  Tensor backward(const Block& block, const Tensor& dy, BlockSaved& saved, WeightGrads mode,
                  double loss_scale) const override;
};

/// Puzzle 9.5. Checkpointing in a 1F1B pipeline: how many of a stage's
/// blocks to checkpoint.
///
/// Under 1F1B stage s holds min(S - s, m) micro-batches in flight
/// (micro_batches_in_flight()), so the first stages need more memory for
/// the same blocks. Returns the fewest c such that checkpointing the
/// stage's first c blocks (of @p blocks; full recomputation) keeps its
/// peak, kept and recomputed activations together
/// (predicted_stage_peaks(step, pipeline, keeps).combined), within
/// @p budget_bytes: 0 when the plain stage fits. Fewer checkpointed blocks
/// is less recompute. Throws dtp::Error when even c = blocks does not fit,
/// naming the stage, the budget and the smallest peak it can reach.
int blocks_to_checkpoint(const StepShape& step, const PipelineStage& pipeline, int blocks,
                         std::int64_t budget_bytes);

/// Puzzle 9.4. Offloaded activations.
///
/// forward() runs the block (Block::run_forward); drains the rank's copy
/// lane (copy_lane().drain(): the previous block's copies are done, and the
/// lane lets go of that block's device tensors); then queues a copy of each
/// tensor the layers saved (saved_tensor_slots(saved), the block input among
/// them) to host memory, Device::cpu(), as MemoryCategory::offloaded, and
/// records each in saved.offloaded: its host copy, the device it came from
/// and every slot that held it. Slots that share one tensor (q, k and v's
/// input is one LayerNorm output: the same tensor, same shape, in three
/// slots) get one copy. Then it empties every slot.
/// It does not wait for its own copies: they run while the next block
/// computes, and that block's forward drains them.
///
/// backward() drains the lane (the last forward's copies), then, inside a
/// dtp::RecomputeScope, queues a copy of each host tensor back to its
/// device (MemoryCategory::activations, so charged as recompute), drains
/// again (inside the scope or after it: a copy's category is fixed when it
/// is queued), puts each fetched tensor in every slot it came from, drops
/// the host copies, and runs Block::run_backward.
///
/// Offloading moves bytes, not FLOPs: nothing is computed twice.
class OffloadedActivations : public ActivationPolicy {
 public:
  Tensor forward(const Block& block, const Tensor& x, BlockSaved& saved) const override;
  Tensor backward(const Block& block, const Tensor& dy, BlockSaved& saved, WeightGrads mode,
                  double loss_scale) const override;
};

}  // namespace dtp::ch09
