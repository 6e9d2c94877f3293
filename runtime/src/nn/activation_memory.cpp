#include "dtp/activation_memory.h"

#include <algorithm>

#include "dtp/error.h"

namespace dtp {

namespace {
std::int64_t tokens(const StepShape& s) { return s.batch * s.seq; }
std::int64_t element(const StepShape& s) {
  return static_cast<std::int64_t>(dtype_size(s.config.dtype));
}

/// What a block keeps besides its input and output.
std::int64_t own_bytes(const StepShape& step, BlockKeeps keeps) {
  const std::int64_t plain = block_activation_bytes(step) - hidden_bytes(step);
  switch (keeps) {
    case BlockKeeps::everything:
      return plain;
    case BlockKeeps::input_only:
      return 0;
    case BlockKeeps::all_but_probs:
      return plain - attention_stat_bytes(step);
  }
  return plain;
}

/// What its backward makes again (MemoryCategory::recompute).
std::int64_t recompute_bytes(const StepShape& step, BlockKeeps keeps) {
  switch (keeps) {
    case BlockKeeps::everything:
      return 0;
    case BlockKeeps::input_only:
      return block_activation_bytes(step);
    case BlockKeeps::all_but_probs:
      return attention_stat_bytes(step) + hidden_bytes(step);
  }
  return 0;
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
  ActivationPeaks peaks;
  // Forward: the embedding's output, then each block's own tensors and output.
  std::int64_t live = hidden;
  std::vector<std::int64_t> before(keeps.size());  // live when block i starts
  for (std::size_t i = 0; i < keeps.size(); ++i) {
    before[i] = live;
    if (keeps[i] != BlockKeeps::everything)
      peaks.activations = std::max(peaks.activations, live + whole);
    live += own_bytes(step, keeps[i]) + hidden;
  }
  peaks.activations = std::max(peaks.activations, live + head_activation_bytes(step));
  peaks.combined = peaks.activations;
  // Backward of block i: blocks after it are gone, so live is what it and
  // the blocks before it keep, its input included (before[i] + own), and
  // its output is freed already.
  for (std::size_t i = 0; i < keeps.size(); ++i) {
    const std::int64_t again = recompute_bytes(step, keeps[i]);
    peaks.recompute = std::max(peaks.recompute, again);
    if (again > 0)
      peaks.combined = std::max(peaks.combined, before[i] + own_bytes(step, keeps[i]) + again);
  }
  return peaks;
}

}  // namespace dtp
