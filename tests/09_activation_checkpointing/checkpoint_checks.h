// The chapter 09 checkers' own pieces: a small GPT, one training step run
// with and without a policy, and what the tracker and the FLOP counter saw.
//
// Checkpointing changes what is kept, never what is computed: a
// checkpointed step must equal the plain one bit for bit (same ops, same
// order, no dropout), in f64 on the CPU and in f32 on a GPU alike. The
// memory checks compare the tracker's peaks with the lesson's formula
// (dtp/activation_memory.h, provided: the runtime's tests hold it to the
// tracker on plain steps, and the reference's to every policy), to the byte;
// a recomputing backward's peak of every byte it allocates is held to the
// checker's own recompute and backward, which drops the scratch at once.
// The FLOP checks count the ops' matrix products (dtp/flops.h) against the
// checker's own formula.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "09_activation_checkpointing/checkpointing.h"
#include "dtp/activation_memory.h"
#include "dtp/flops.h"
#include "support/checker_precision.h"
#include "support/harness.h"
#include "support/training.h"

namespace dtp::testing::ch09 {

inline constexpr std::int64_t kBatch = 3;  // sequences per step
inline constexpr std::int64_t kSeq = 8;    // tokens per sequence

/// The checkers' GPT: vocab 32, context 8, width 16, 2 heads, @p layers
/// blocks, in checker_dtype() on checker_device().
inline GPTConfig checker_model(int layers = 4, AttentionKind attention = AttentionKind::naive) {
  GPTConfig c;
  c.vocab_size = 32;
  c.context = kSeq;
  c.d_model = 16;
  c.heads = 2;
  c.layers = layers;
  c.attention = attention;
  c.device = checker_device();
  c.dtype = checker_dtype(c.device);
  return c;
}

inline StepShape step_of(const GPTConfig& config) { return {config, kBatch, kSeq}; }

/// Matrix-product FLOPs of one block's forward, by the checker's own count:
/// q, k, v and the output projection (4 products of [N, C] by [C, C]), fc
/// and proj (2 of [N, C] by [C, r C]), and attention's scores and output
/// (2 of B H products [T, D] by [D, T] and [T, T] by [T, D]).
inline std::int64_t block_forward_flops(const GPTConfig& c) {
  const std::int64_t n = kBatch * kSeq, C = c.d_model, r = c.mlp_ratio;
  return 2 * n * C * C * 4 + 2 * n * C * (r * C) * 2 + 4 * kBatch * kSeq * kSeq * C;
}

/// Attention's scores and output alone: what selective recomputation makes again.
inline std::int64_t attention_core_flops(const GPTConfig& c) {
  return 4 * kBatch * kSeq * kSeq * c.d_model;
}

/// Fixed tokens and targets for @p config.
inline Batch checker_batch(const GPTConfig& config, std::uint64_t seed = 7) {
  Rng rng(seed);
  Batch b{Tensor::empty({kBatch, kSeq}, DType::i32), Tensor::empty({kBatch, kSeq}, DType::i32)};
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i) {
    b.inputs.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.below(config.vocab_size));
    b.targets.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.below(config.vocab_size));
  }
  return {b.inputs.to(config.device), b.targets.to(config.device)};
}

/// One block of @p config (the checkers' GPT by default), an input and an
/// output gradient for it (charged as `other`, so the block's own
/// activations are all the tracker sees under activations).
struct OneBlock {
  GPTConfig config;
  Block block;
  Tensor x, dy;
  explicit OneBlock(const GPTConfig& c = checker_model(1))
      : config(c),
        block(config, 0),
        x(Tensor::empty({kBatch, kSeq, c.d_model}, c.dtype, c.device)),
        dy(Tensor::empty({kBatch, kSeq, c.d_model}, c.dtype, c.device)) {
    Rng rng(3);
    ops::fill_normal(x, 0, 1, rng);
    ops::fill_normal(dy, 0, 1, rng);
  }
};

/// "" when @p got equals @p expected bit for bit (both @p unit's gradients,
/// flat); else how many elements differ and the first, by parameter name.
inline std::string grads_check(const std::string& what, const Unit& unit,
                               const std::vector<double>& expected,
                               const std::vector<double>& got) {
  std::int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < expected.size() && i < got.size(); ++i)
    if (expected[i] != got[i] && wrong++ == 0) first = static_cast<std::int64_t>(i);
  if (wrong == 0) return "";
  std::ostringstream out;
  out.precision(17);
  const auto f = static_cast<std::size_t>(first);
  out << what << ": " << wrong << " of " << expected.size() << " gradient elements of "
      << unit.name() << " differ, first " << locate(unit, first) << ": expected " << expected[f]
      << ", got " << got[f];
  return out.str();
}

/// One forward and backward, and what it left.
struct StepResult {
  double loss = 0;
  std::vector<std::vector<double>> grads;  // per unit, flat
  std::int64_t activation_peak = 0;        // MemoryCategory::activations
  std::int64_t recompute_peak = 0;         // MemoryCategory::recompute
  std::int64_t combined_peak = 0;          // the two together
  std::int64_t offloaded_peak = 0;         // MemoryCategory::offloaded (host copies)
  std::int64_t left_after = 0;             // activations + recompute live after backward
  FlopCounts flops;
};

/// Runs one step of a fresh GPT(@p config) with policies[i] on block i (null: none).
inline StepResult run_step(const GPTConfig& config,
                           const std::vector<const ActivationPolicy*>& policies) {
  ScopedTracker scope;
  GPT model(config);
  for (int i = 0; i < model.num_blocks(); ++i)
    if (static_cast<std::size_t>(i) < policies.size()) model.block(i).policy = policies[i];
  const Batch batch = checker_batch(config);
  scope.tracker->reset_peaks();
  reset_flop_counts();
  StepResult r;
  r.loss = model.forward(batch.inputs, batch.targets);
  model.backward();
  r.flops = flop_counts();
  for (Unit* unit : model.units()) r.grads.push_back(unit->grads().to_vector());
  r.activation_peak = scope.tracker->peak(MemoryCategory::activations);
  r.recompute_peak = scope.tracker->peak(MemoryCategory::recompute);
  r.combined_peak = scope.tracker->peak_activations_with_recompute();
  r.offloaded_peak = scope.tracker->peak(MemoryCategory::offloaded);
  r.left_after = scope.tracker->live(MemoryCategory::activations) +
                 scope.tracker->live(MemoryCategory::recompute) +
                 scope.tracker->live(MemoryCategory::offloaded);
  return r;
}

/// The same policy on every block of @p config.
inline std::vector<const ActivationPolicy*> on_every_block(const GPTConfig& config,
                                                           const ActivationPolicy& policy) {
  return std::vector<const ActivationPolicy*>(static_cast<std::size_t>(config.layers), &policy);
}

/// "" when @p got's loss and gradients equal @p expected's bit for bit;
/// otherwise the first unit and element that differ.
inline std::string bitwise_equal_step(const StepResult& expected, const StepResult& got,
                                      const GPTConfig& config, const std::string& what) {
  std::ostringstream out;
  out.precision(17);
  if (got.loss != expected.loss)
    out << what << ": the loss is " << got.loss << ", the plain step's " << expected.loss
        << ": the policy changed the forward itself (it must return the block's own output)\n";
  GPT names(config);
  const std::vector<Unit*> units = names.units();
  for (std::size_t u = 0; u < expected.grads.size() && u < got.grads.size(); ++u) {
    std::int64_t wrong = 0, first = -1;
    for (std::size_t i = 0; i < expected.grads[u].size(); ++i)
      if (expected.grads[u][i] != got.grads[u][i] && wrong++ == 0)
        first = static_cast<std::int64_t>(i);
    if (wrong > 0)
      out << what << ": " << wrong << " gradient elements of " << units[u]->name()
          << " differ from the plain step's, first " << locate(*units[u], first) << ": expected "
          << expected.grads[u][static_cast<std::size_t>(first)] << ", got "
          << got.grads[u][static_cast<std::size_t>(first)]
          << (got.grads[u][static_cast<std::size_t>(first)] == 0
                  ? " (zero: did this unit's backward run?)"
                  : " (recomputation must reproduce the forward exactly: the same input, the "
                    "same ops)")
          << "\n";
  }
  return out.str();
}

/// Says a byte count in bytes and in the step's hidden units (N C e).
inline std::string bytes_text(std::int64_t bytes, const StepShape& step) {
  std::ostringstream out;
  out << bytes << " bytes (" << static_cast<double>(bytes) / static_cast<double>(hidden_bytes(step))
      << " x a [B, T, C] activation)";
  return out.str();
}

/// "" when @p got equals @p expected; else a line naming both and their difference.
inline std::string bytes_check(const std::string& what, std::int64_t expected, std::int64_t got,
                               const StepShape& step, const std::string& hint = "") {
  if (got == expected) return "";
  std::ostringstream out;
  out << what << ": expected " << bytes_text(expected, step) << ", got " << bytes_text(got, step)
      << "; " << (got > expected ? "more" : "less") << " by "
      << bytes_text(got > expected ? got - expected : expected - got, step);
  if (!hint.empty()) out << " (" << hint << ")";
  return out.str() + "\n";
}

/// Two data-parallel steps of the tiny model on this rank, each all-reducing
/// the gradients (mean) after backward (chapter 02's 2.2, written here),
/// with @p policy on every block (none: null).
inline ModelState train_data_parallel(Comm& comm, const ActivationPolicy* policy) {
  TrainConfig config = on_device(tiny_config(6, 2), comm.device());
  Trainer trainer(config, comm.rank(), comm.size());
  for (int i = 0; i < trainer.model().num_blocks(); ++i) trainer.model().block(i).policy = policy;
  trainer.on_after_backward([&] {
    for (Unit* unit : trainer.model().units()) comm.all_reduce(unit->grads(), ReduceOp::avg);
  });
  std::vector<double> losses;
  for (int s = 0; s < 2; ++s) losses.push_back(trainer.step().loss);
  return capture(trainer.model(), losses);
}

}  // namespace dtp::testing::ch09
