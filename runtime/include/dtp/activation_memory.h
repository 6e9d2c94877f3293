/// @file activation_memory.h
/// @brief How many bytes of activations a GPT training step holds on one
/// rank, by formula, for each way a block may keep them (chapter 09).
///
/// With N = batch x seq tokens, width C, MLP ratio r, H heads and e bytes
/// per element, a block's forward keeps, besides its input:
///
///     LayerNorm 1 and 2     mean and rstd per token            4 N
///     ln1 output            q, k and v's input                 N C
///     q, k, v                                                  3 N C
///     attention output      the projection's input             N C
///     x + attention         ln2's input (the residual)         N C
///     ln2 output            fc's input                         N C
///     fc output             GELU's input                       r N C
///     GELU output           proj's input                       r N C
///     block output          the next block's input             N C
///     probabilities         naive attention                    B H T T
///     (or row max and sum)  flash attention                    2 B H T
///
/// that is (8 + 2 r) N C + 4 N + the attention's part, times e. The
/// embedding's output is block 0's input; the head keeps its LayerNorm's
/// statistics and output and the logits: (2 N + N C + N V) e.
///
/// Live activations only grow during the forward and only shrink during the
/// backward, so their peak is at the end of the forward, unless a block that
/// drops what it made (a checkpointed one) briefly held more while it ran:
/// its forward makes everything a plain block keeps before dropping most of
/// it. A block's input is freed when the block's backward is done, its
/// output when the next block's is. What a backward makes again is
/// MemoryCategory::recompute: a whole block's worth for full recomputation,
/// the probabilities and a scratch attention output for selective, the
/// fetched copies for an offloaded block.
///
/// An offloaded block (OffloadedActivations, chapter 09) copies its tensors
/// and its input to host memory (MemoryCategory::offloaded) on the rank's
/// copy lane, which holds the device tensors until its next drain: the next
/// offloaded block's forward, after that block's own forward work, or the
/// first backward. So the device briefly holds two blocks' worth while the
/// copies overlap the next block.
#pragma once

#include <cstdint>
#include <vector>

#include "dtp/gpt_config.h"

namespace dtp {

/// One rank's training step: the model and the tokens of one forward.
struct StepShape {
  GPTConfig config;        ///< the model (its dtype, width, heads, layers, attention)
  std::int64_t batch = 1;  ///< sequences per forward (per micro-batch)
  std::int64_t seq = 1;    ///< tokens per sequence
};

/// What a block keeps between its forward and backward.
enum class BlockKeeps {
  everything,     ///< no policy: every tensor its layers saved
  input_only,     ///< full recomputation: only its input
  all_but_probs,  ///< selective recomputation: all but the attention probabilities
  offloaded,      ///< offloaded: its tensors and its input copied to host memory
};

/// Bytes of activations a plain block keeps, its output included and its
/// input not: ((8 + 2 r) N C + 4 N) e plus the attention's part.
std::int64_t block_activation_bytes(const StepShape& step);
/// The attention's part of it: B H T T e (naive) or 2 B H T e (flash).
std::int64_t attention_stat_bytes(const StepShape& step);
/// One [batch, seq, C] activation: N C e (a block's input or output).
std::int64_t hidden_bytes(const StepShape& step);
/// What the head keeps: (2 N + N C + N V) e.
std::int64_t head_activation_bytes(const StepShape& step);

/// Peaks of one training step's activations.
struct ActivationPeaks {
  std::int64_t activations = 0;  ///< MemoryCategory::activations
  std::int64_t recompute = 0;    ///< MemoryCategory::recompute
  std::int64_t combined = 0;     ///< the two together (the peak of their sum)
  std::int64_t offloaded = 0;    ///< MemoryCategory::offloaded (host copies)
};

/// The peaks of one forward and backward when block i keeps @p keeps[i]
/// (one entry per block; throws dtp::Error for another length, or
/// all_but_probs with flash attention).
ActivationPeaks predicted_activation_peaks(const StepShape& step,
                                           const std::vector<BlockKeeps>& keeps);

/// A stage of a pipeline that runs the 1F1B schedule (chapter 05): stage
/// @p stage of @p stages, @p microbatches per step.
struct PipelineStage {
  int stages = 1;        ///< S
  int stage = 0;         ///< s, from 0 (the first holds the embedding, the last the head)
  int microbatches = 1;  ///< m
};

/// Micro-batches stage s holds at once under 1F1B: min(S - s, m). Stage 0
/// runs S forwards before its first backward; the last stage, one.
int micro_batches_in_flight(const PipelineStage& pipeline);

/// The peaks of one 1F1B step on one stage, for micro-batches of @p step's
/// shape, when the stage's blocks (in order) keep @p keeps (everything,
/// input_only or all_but_probs). A micro-batch in flight keeps the stage's
/// input (received, or the embedding's output on stage 0), what each block
/// keeps and the outputs that feed the stage's next block; the last stage
/// also its head's tensors. The stage's output is sent and dropped. So the
/// activation peak is (in flight - 1) micro-batches kept, plus the forward
/// of the last one to enter; full recomputation shrinks every in-flight
/// micro-batch, which is why it saves most on the first stages.
ActivationPeaks predicted_stage_peaks(const StepShape& step, const PipelineStage& pipeline,
                                      const std::vector<BlockKeeps>& keeps);

}  // namespace dtp
