#include "dtp/activation_memory.h"

#include <algorithm>

#include "dtp/error.h"

namespace dtp {

namespace {
std::int64_t tokens(const StepShape& s) { return s.batch * s.seq; }
std::int64_t element(const StepShape& s) {
  return static_cast<std::int64_t>(dtype_size(s.config.dtype));
}
}  // namespace

std::int64_t hidden_bytes(const StepShape& step) {
  return tokens(step) * step.config.d_model * element(step);
}

std::int64_t attention_stat_bytes(const StepShape& step) {
  const std::int64_t rows = step.batch * step.config.heads * step.seq;  // query rows
  const std::int64_t per_row = step.config.attention == AttentionKind::naive ? step.seq : 2;
  return rows * per_row * element(step);
}

std::int64_t block_activation_bytes(const StepShape& step) {
  const std::int64_t n = tokens(step), e = element(step);
  const std::int64_t widths = 8 + 2 * static_cast<std::int64_t>(step.config.mlp_ratio);
  return (widths * n * step.config.d_model + 4 * n) * e + attention_stat_bytes(step);
}

std::int64_t head_activation_bytes(const StepShape& step) {
  const std::int64_t n = tokens(step);
  return (2 * n + n * step.config.d_model + n * step.config.vocab_size) * element(step);
}

ActivationPeaks predicted_activation_peaks(const StepShape& step,
                                           const std::vector<BlockKeeps>& keeps) {
  const int layers = step.config.layers;
  DTP_CHECK(static_cast<int>(keeps.size()) == layers, "predicted_activation_peaks: one entry per ",
            "block (", layers, "), got ", keeps.size());
  for (BlockKeeps k : keeps)
    DTP_CHECK(k != BlockKeeps::all_but_probs || step.config.attention == AttentionKind::naive,
              "predicted_activation_peaks: selective recomputation drops naive attention's "
              "probabilities; flash attention keeps none");
  const std::int64_t hidden = hidden_bytes(step), whole = block_activation_bytes(step);
  const std::int64_t own = whole - hidden;  // all a block makes but its output
  const std::int64_t probs = attention_stat_bytes(step), head = head_activation_bytes(step);
  ActivationPeaks peaks;
  // live: device activations; held: the part of it the copy lane holds
  // until its next drain; host: offloaded copies; again: recompute.
  std::int64_t live = hidden, held = 0, host = 0;
  auto note = [&](std::int64_t again) {
    peaks.activations = std::max(peaks.activations, live);
    peaks.recompute = std::max(peaks.recompute, again);
    peaks.combined = std::max(peaks.combined, live + again);
    peaks.offloaded = std::max(peaks.offloaded, host);
  };
  // Forward: a block's input is the previous output, already live; its
  // forward makes everything it keeps plus its output, then drops its part.
  for (BlockKeeps k : keeps) {
    live += whole;
    note(0);
    if (k == BlockKeeps::input_only) live -= own;
    if (k == BlockKeeps::all_but_probs) live -= probs;
    if (k ==
        BlockKeeps::offloaded) {  // drain the previous copies, then queue its own and its input
      live -= held;
      held = own + hidden;
      host += own + hidden;
      note(0);
    }
  }
  live += head;
  note(0);
  // Backward: the head's tensors and the last output go first; each block
  // makes its part again (or fetches it), then frees it and its input.
  live -= head + hidden;
  for (auto k = keeps.rbegin(); k != keeps.rend(); ++k) {
    switch (*k) {
      case BlockKeeps::everything:
        live -= own + hidden;
        break;
      case BlockKeeps::input_only:
        note(whole);  // the recomputed output is dropped at once
        live -= hidden;
        break;
      case BlockKeeps::all_but_probs:
        note(probs + hidden);  // the probabilities and a scratch attention output
        live -= own - probs + hidden;
        break;
      case BlockKeeps::offloaded:
        live -= held;
        held = 0;
        note(own + hidden);  // fetched back: its tensors and its input
        host -= own + hidden;
        break;
    }
  }
  return peaks;
}

int micro_batches_in_flight(const PipelineStage& p) {
  DTP_CHECK(p.stages >= 1 && p.stage >= 0 && p.stage < p.stages && p.microbatches >= 1,
            "micro_batches_in_flight: need 0 <= stage < stages and microbatches >= 1, got stage ",
            p.stage, " of ", p.stages, ", ", p.microbatches, " micro-batches");
  return std::min(p.stages - p.stage, p.microbatches);
}

ActivationPeaks predicted_stage_peaks(const StepShape& step, const PipelineStage& pipeline,
                                      const std::vector<BlockKeeps>& keeps) {
  const int in_flight = micro_batches_in_flight(pipeline);
  for (BlockKeeps k : keeps) {
    DTP_CHECK(k != BlockKeeps::offloaded,
              "predicted_stage_peaks: offloaded blocks are not modelled on pipeline stages");
    DTP_CHECK(k != BlockKeeps::all_but_probs || step.config.attention == AttentionKind::naive,
              "predicted_stage_peaks: selective recomputation drops naive attention's "
              "probabilities; flash attention keeps none");
  }
  const bool last = pipeline.stage == pipeline.stages - 1;
  const std::int64_t hidden = hidden_bytes(step), whole = block_activation_bytes(step);
  const std::int64_t own = whole - hidden, probs = attention_stat_bytes(step);
  const std::int64_t head = last ? head_activation_bytes(step) : 0;
  auto own_kept = [&](BlockKeeps k) {
    return k == BlockKeeps::everything ? own : k == BlockKeeps::input_only ? 0 : own - probs;
  };
  // What one micro-batch keeps from its forward to its backward.
  std::int64_t kept = hidden;  // the stage's input
  for (std::size_t i = 0; i < keeps.size(); ++i)
    kept += own_kept(keeps[i]) + (i + 1 < keeps.size() || last ? hidden : 0);
  kept += head;
  ActivationPeaks peaks;
  // The forward that brings the stage to in_flight micro-batches.
  std::int64_t live = (in_flight - 1) * kept + hidden;
  for (BlockKeeps k : keeps) {
    live += whole;
    peaks.activations = std::max(peaks.activations, live);
    live -= own - own_kept(k);
  }
  peaks.activations = std::max(peaks.activations, live + head);
  peaks.combined = peaks.activations;
  // A backward starts with in_flight micro-batches kept; blocks from the last.
  live = in_flight * kept - head - (last ? hidden : 0);
  for (auto k = keeps.rbegin(); k != keeps.rend(); ++k) {
    const std::int64_t again = *k == BlockKeeps::input_only      ? whole
                               : *k == BlockKeeps::all_but_probs ? probs + hidden
                                                                 : 0;
    peaks.recompute = std::max(peaks.recompute, again);
    peaks.combined = std::max(peaks.combined, live + again);
    live -= own_kept(*k) + hidden;
  }
  return peaks;
}

}  // namespace dtp
