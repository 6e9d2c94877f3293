/// @file lora.h
/// @brief Chapter 08 contract: LoRA, low-rank adapters on a frozen model.
///
/// Fine-tuning updates every weight W of a pretrained model. LoRA freezes W
/// and learns a low-rank update instead: a Linear computes
///
///     y = x W^T + b + s (x A^T) B^T,   A [r, in], B [out, r], s = alpha / r,
///
/// with B = 0 at the start (so the adapted model starts as the base model)
/// and only A and B trained. The gradient and optimizer memory of W
/// disappear, and under data parallelism only the adapters' gradients travel.
///
/// The puzzles: the adapter's forward and backward (8.1), folding it into W
/// and back (8.2), adapters on a pretrained GPT (8.3), and LoRA under data
/// parallelism (8.4). The runtime provides the two hooks they stand on:
/// Unit::freeze() and Linear::adapter (dtp/nn.h). See chapters/08_lora/README.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/optim.h"
#include "dtp/trainer.h"

/// Chapter 08: LoRA.
namespace dtp::ch08 {

// --- 8.1 the adapter's forward and backward ------------------------------------------

/// Puzzle 8.1. Adds the adapter's term s (x A^T) B^T to @p y [..., out] for
/// x [..., in], A [r, in], B [out, r], and returns h = x A^T as [rows, r],
/// rows = x.numel() / in (MemoryCategory::activations), which the backward
/// needs.
Tensor lora_forward(const Tensor& x, const Tensor& a, const Tensor& b, double scale, Tensor& y);

/// Puzzle 8.1. The adapter's part of the input gradient: dx += s (dy B) A for
/// dy [..., out] and dx [..., in].
void lora_backward_input(const Tensor& dy, const Tensor& a, const Tensor& b, double scale,
                         Tensor& dx);

/// Puzzle 8.1. The adapter's own gradients, accumulated (+=) like every
/// parameter gradient: dA += s (dy B)^T x and dB += s dy^T h, with x the
/// layer's input and h what lora_forward returned. W gets no gradient.
void lora_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& h, const Tensor& b,
                          double scale, Tensor& grad_a, Tensor& grad_b);

// --- 8.2 merging ----------------------------------------------------------------------

/// Puzzle 8.2. Folds the adapter into the weight, W += s B A, in place: the
/// merged Linear computes what the adapted one did, at the base's cost.
void merge(Tensor& weight, const Tensor& a, const Tensor& b, double scale);

/// Puzzle 8.2. Takes it out again, W -= s B A, in place.
void unmerge(Tensor& weight, const Tensor& a, const Tensor& b, double scale);

// --- 8.3 adapters on a GPT -----------------------------------------------------------

/// Which Linears get adapters, and their size.
struct LoraConfig {
  int rank = 8;       ///< r
  double alpha = 16;  ///< the scale is alpha / r
  /// The Linears of every block that get one, by their name in the block:
  /// attn.q, attn.k, attn.v, attn.proj, mlp.fc, mlp.proj. The default is
  /// the LoRA paper's choice, the query and value projections.
  std::vector<std::string> targets = {"attn.q", "attn.v"};
  std::uint64_t seed = 0;  ///< draws A (B starts at zero)
  /// alpha / rank.
  double scale() const { return alpha / rank; }
};

/// Every target name parse_lora_targets() accepts, in block order: what
/// "all" stands for.
const std::vector<std::string>& all_lora_targets();

/// Parses a --lora-targets value: a comma list of target names, or "all".
/// Throws dtp::Error naming the accepted names.
std::vector<std::string> parse_lora_targets(const std::string& text);

/// One adapted Linear: A [r, in] and B [out, r] and their gradients (views
/// of the LoraModel's flat buffers). Its LinearAdapter methods call 8.1.
class LoraLinear : public LinearAdapter {
 public:
  Tensor forward(const Tensor& x, Tensor& y) const override;
  void backward_input(const Tensor& dy, Tensor& dx) const override;
  void backward_weight(const Tensor& dy, const Tensor& x, const Tensor& kept) const override;

  Tensor a;          ///< A [r, in]
  Tensor b;          ///< B [out, r]
  Tensor grad_a;     ///< dA, like A
  Tensor grad_b;     ///< dB, like B
  double scale = 1;  ///< alpha / r
};

/// Puzzle 8.3. LoRA adapters on a (pretrained) GPT.
class LoraModel {
 public:
  /// Freezes every unit of @p model (Unit::freeze) and, for every block and
  /// every target of @p config, makes an adapter: A drawn from
  /// normal(0, 1 / sqrt(in)) with Rng(Rng::derive(config.seed, block)) in
  /// target order, B = 0. Each block's adapters share one flat parameter
  /// buffer (MemoryCategory::params) and one flat gradient buffer
  /// (MemoryCategory::grads, zeroed), laid out as A then B for each target
  /// in order; the adapter's a, b, grad_a and grad_b are views of them. Then
  /// attaches each adapter to its Linear (Linear::adapter). Throws
  /// dtp::Error, before changing the model, for a rank below 1, an unknown
  /// target, or an MLP target on a mixture-of-experts block (no adapters on
  /// experts here).
  LoraModel(GPT& model, const LoraConfig& config);
  /// Detaches the adapters from the model's Linears.
  ~LoraModel();
  /// Not copyable: the model's Linears point at its adapters.
  LoraModel(const LoraModel&) = delete;
  /// Not copyable.
  LoraModel& operator=(const LoraModel&) = delete;

  /// One ParamBuffer per block, named "block.<i>.lora" (the flat buffers):
  /// what the optimizer updates and data parallelism averages.
  std::vector<ParamBuffer> buffers() const;
  /// Parameters in all adapters: blocks x sum over targets of r (in + out).
  std::int64_t trainable_parameters() const;
  /// Sets every adapter gradient to zero (Trainer::on_zero_grad).
  void zero_grad();
  /// The adapter on block @p block's Linear @p target; throws naming the
  /// adapted targets when there is none.
  const LoraLinear& adapter(int block, const std::string& target) const;
  /// The config it was built with.
  const LoraConfig& config() const { return config_; }

  /// Puzzle 8.2 on the whole model: folds every adapter into its weight
  /// (merge) and detaches it, so the model runs at the base's speed. Throws
  /// when already merged.
  void merge_all();
  /// Undoes merge_all(): unmerges every weight and re-attaches the
  /// adapters. Throws when not merged.
  void unmerge_all();
  /// True between merge_all() and unmerge_all().
  bool merged() const { return merged_; }

 private:
  struct Target {
    int block = 0;
    std::string name;
    Linear* linear = nullptr;
    std::unique_ptr<LoraLinear> adapter;
  };
  GPT& model_;
  LoraConfig config_;
  std::vector<Tensor> params_;  // per block
  std::vector<Tensor> grads_;   // per block
  std::vector<Target> targets_;
  bool merged_ = false;
};

/// The Linear called @p target ("attn.q", ...) in @p block; throws naming
/// the accepted names. Provided.
Linear& target_linear(Block& block, const std::string& target);

/// What LoraModel::trainable_parameters() will be for a model of @p model's
/// shape, from the shapes alone: layers x sum over targets of r (in + out).
/// Throws for an unknown target. Provided.
std::int64_t lora_parameter_count(const GPTConfig& model, const LoraConfig& config);

// --- 8.4 LoRA under data parallelism ---------------------------------------------------

/// Puzzle 8.4. Averages the adapters' gradients over the ranks, overlapped
/// with backward; the frozen base weights never travel.
///
/// The constructor installs a grad-ready hook on @p model: when block i's
/// gradients are final (its adapters' too), it starts one asynchronous
/// all-reduce (ReduceOp::avg) of block i's adapter gradient buffer, a
/// natural bucket (chapter 02, puzzle 2.3). finish() waits for every one
/// (Trainer::on_after_backward). Communication per step: one all-reduce per
/// adapted block, whose bytes add up to the adapters' gradient bytes exactly.
class LoraDataParallel {
 public:
  /// @p comm, @p model and @p lora must outlive it.
  LoraDataParallel(Comm& comm, GPT& model, LoraModel& lora);
  /// Waits for requests still in flight and removes the grad-ready hooks.
  ~LoraDataParallel();
  /// Not copyable: the hook refers to this object.
  LoraDataParallel(const LoraDataParallel&) = delete;
  /// Not copyable.
  LoraDataParallel& operator=(const LoraDataParallel&) = delete;
  /// Waits for every block's all-reduce; throws dtp::Error naming a block
  /// whose hook did not run since the last finish().
  void finish();

 private:
  void on_unit_ready(Unit& unit);
  Comm& comm_;
  GPT& model_;
  LoraModel& lora_;
  std::vector<Request> requests_;  // per block
  std::vector<bool> started_;      // per block
};

}  // namespace dtp::ch08
