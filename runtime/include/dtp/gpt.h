/// @file gpt.h
/// @brief The GPT: its units (the embedding, one per transformer block, the
/// head) and the model that runs them in order, forward and backward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtp/gpt_config.h"
#include "dtp/layers.h"
#include "dtp/moe.h"
#include "dtp/tensor.h"
#include "dtp/unit.h"

namespace dtp {

/// Positions [start, start + length) of a sequence: a sequence-parallel
/// rank holds one such range, or two (the zigzag layout).
struct PositionRange {
  std::int64_t start = 0;   ///< first global position
  std::int64_t length = 0;  ///< number of positions
  /// One past the last position.
  std::int64_t end() const { return start + length; }
};

/// What the embedding keeps for its backward.
struct EmbeddingSaved {
  Tensor ids;                         ///< i32 [B, T]
  std::vector<PositionRange> ranges;  ///< the positions of the T tokens, in order
};

/// Token embedding [vocab, C] plus learned positions [context, C].
class Embedding : public Unit {
 public:
  /// Unit "embedding" (index 0), initialized from config.seed.
  explicit Embedding(const GPTConfig& config);
  /// x [B, T, C] (activations) for ids i32 [B, T]; positions start at
  /// @p start_position (sequence parallelism runs a later slice of a sequence).
  Tensor forward(const Tensor& ids, EmbeddingSaved& saved, std::int64_t start_position = 0) const;
  /// The same for tokens at the positions @p ranges, in order (their lengths
  /// sum to T): a zigzag rank's two chunks.
  Tensor forward(const Tensor& ids, EmbeddingSaved& saved,
                 const std::vector<PositionRange>& ranges) const;
  /// Accumulates the table gradients; releases saved.
  void backward(const Tensor& dx, EmbeddingSaved& saved);

  Tensor tokens;          ///< token table [vocab, C]
  Tensor positions;       ///< position table [context, C]
  Tensor tokens_grad;     ///< gradient of tokens
  Tensor positions_grad;  ///< gradient of positions

 private:
  void bind() override;
};

/// A host copy an offloading ActivationPolicy made of one saved tensor.
struct OffloadedTensor {
  Tensor host;             ///< the copy, in host memory
  Device device;           ///< where the tensor lived, and goes back to
  std::vector<int> slots;  ///< every slot of saved_tensor_slots() that held it
};

/// What one block keeps between its forward and backward.
struct BlockSaved {
  LayerNormSaved ln1;   ///< input: the block input
  LayerNormSaved ln2;   ///< input: x + attention
  AttentionSaved attn;  ///< attention's own
  MlpSaved mlp;         ///< the MLP's own (a dense block)
  MoeSaved moe;         ///< the mixture of experts' own (config.experts > 0)
  /// Weight-gradient work queued by a deferred backward.
  PendingWeightGrads pending;
  /// The block input, kept by an ActivationPolicy that drops the layers'
  /// tensors after the forward and makes them again in the backward.
  Tensor checkpoint;
  /// Host copies of the layers' tensors, kept by an ActivationPolicy that
  /// moves them out of device memory after the forward and back before the
  /// backward.
  std::vector<OffloadedTensor> offloaded;
  /// Drops every saved tensor (and pending work).
  void clear() { *this = BlockSaved{}; }
};

/// Every tensor slot the layers of a dense block fill in @p saved, in a fixed
/// order (LayerNorm 1, attention, LayerNorm 2, MLP; a Linear's input, then
/// what its adapter kept), defined or not. Slots may share a tensor: q, k and
/// v's inputs are the one LayerNorm output. Throws dtp::Error for a
/// mixture-of-experts block's saved tensors.
std::vector<Tensor*> saved_tensor_slots(BlockSaved& saved);

/// Whether a block's backward computes weight gradients at once or queues them.
enum class WeightGrads { immediate, deferred };

class Block;

/// How a block keeps what its backward needs (chapter 09). Installed on a
/// block (Block::policy, not owned), it runs in place of the block's own
/// forward and backward wherever they are called: by GPT, by a pipeline
/// stage, between FSDP's hooks. It does the block's work through
/// Block::run_forward() and Block::run_backward(), and decides what stays in
/// the BlockSaved between the two: everything (no policy), only the block
/// input (full recomputation), all but the attention probabilities
/// (selective recomputation). One policy object may serve many blocks and
/// many micro-batches: what it keeps goes in the BlockSaved, never in itself.
class ActivationPolicy {
 public:
  virtual ~ActivationPolicy() = default;
  /// The block's output for x; leaves in @p saved what backward() needs.
  virtual Tensor forward(const Block& block, const Tensor& x, BlockSaved& saved) const = 0;
  /// dx for dy, as Block::run_backward() gives it, from what forward() left
  /// in @p saved; leaves @p saved empty (but for deferred weight work).
  virtual Tensor backward(const Block& block, const Tensor& dy, BlockSaved& saved, WeightGrads mode,
                          double loss_scale) const = 0;
};

/// Pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(.)).
class Block : public Unit {
 public:
  /// Unit "block.<layer>" (index layer + 1), initialized from config.seed.
  Block(const GPTConfig& config, int layer);
  /// Which block this is, from 0.
  int layer() const { return layer_; }
  /// Block output [B, T, C] for x [B, T, C] (activations): policy->forward()
  /// when a policy is installed, run_forward() otherwise.
  Tensor forward(const Tensor& x, BlockSaved& saved) const;
  /// The block's layers, forward: output [B, T, C] for x [B, T, C]
  /// (activations); fills every layer's part of saved. A mixture-of-experts
  /// block also leaves its load-balancing loss in saved.moe.aux_loss, which
  /// the model adds to its loss.
  Tensor run_forward(const Tensor& x, BlockSaved& saved) const;
  /// dx for dy = d(block output): policy->backward() when a policy is
  /// installed, run_backward() otherwise.
  Tensor backward(const Tensor& dy, BlockSaved& saved, WeightGrads mode = WeightGrads::immediate,
                  double loss_scale = 1.0) const;
  /// The block's layers, backward: dx for dy = d(block output), from the
  /// layers' saved tensors. With WeightGrads::deferred the linear
  /// layers' weight gradients are queued in saved.pending (LayerNorm's are
  /// computed at once); call backward_weight(saved) to finish the unit.
  /// @p loss_scale scales the load-balancing loss's gradient the way dy is
  /// scaled (GPT::backward passes its own); a dense block ignores it.
  /// Releases the saved activations.
  Tensor run_backward(const Tensor& dy, BlockSaved& saved,
                      WeightGrads mode = WeightGrads::immediate, double loss_scale = 1.0) const;
  /// True when the MLP half is a mixture of experts (config.experts > 0).
  bool is_moe() const { return config_.experts > 0; }
  /// Runs queued weight-gradient work.
  void backward_weight(BlockSaved& saved) const;

  LayerNorm ln1;             ///< before attention
  LayerNorm ln2;             ///< before the MLP
  CausalSelfAttention attn;  ///< the attention half
  Mlp mlp;                   ///< the MLP half of a dense block
  MoeMlp moe;                ///< the MLP half of a mixture-of-experts block
  /// Runs the mixture of experts (with moe's weights) when set (not owned;
  /// see MoeCore). Only WeightGrads::immediate backward then.
  MoeCore* moe_core = nullptr;
  /// Decides what the forward keeps for the backward when set (not owned;
  /// see ActivationPolicy).
  const ActivationPolicy* policy = nullptr;

 private:
  void bind() override;
  int layer_;
};

/// What the head keeps for its backward.
struct HeadSaved {
  LayerNormSaved ln;       ///< final LayerNorm
  LinearSaved lm;          ///< LM head input (the LayerNorm output)
  CrossEntropySaved loss;  ///< logits and targets
};

/// Final LayerNorm, LM head (vocab x C, no bias, not tied to the embedding)
/// and cross-entropy.
class Head : public Unit {
 public:
  /// Unit "head" (index layers + 1), initialized from config.seed.
  explicit Head(const GPTConfig& config);
  /// Mean loss over all positions of x [B, T, C] against targets i32 [B, T].
  double forward(const Tensor& x, const Tensor& targets, HeadSaved& saved) const;
  /// d(loss_scale * mean loss)/dx; accumulates the head's gradients; releases saved.
  Tensor backward(HeadSaved& saved, double loss_scale = 1.0) const;
  /// Logits [B, T, vocab] without saving anything (MemoryCategory::other).
  Tensor logits(const Tensor& x) const;

  LayerNorm ln;       ///< final LayerNorm
  Linear lm;          ///< LM head [vocab, C], no bias
  CrossEntropy loss;  ///< the loss

 private:
  void bind() override;
};

// --- the model ----------------------------------------------------------------------

/// The whole GPT: embedding, blocks, head. forward() saves what backward()
/// needs; backward() accumulates gradients unit by unit in reverse and calls
/// every grad-ready hook as soon as a unit's gradients are final.
///
/// Unit hooks let a strategy act around each unit without owning the loop
/// (FSDP gathers a unit's parameters before it runs and frees them after;
/// DDP reduces gradients as they become ready). For a model with blocks
/// 0..L-1, forward() and logits() call, for each unit in forward order
/// (embedding, block.0, ..., block.L-1, head):
///
///     before-forward hooks(unit), the unit's forward, after-forward hooks(unit)
///
/// and backward() calls, for each unit in reverse order (head, block.L-1,
/// ..., block.0, embedding):
///
///     before-backward hooks(unit), the unit's backward, grad-ready hooks(unit)
///
/// Hooks of one kind run in the order they were added, outside the unit's
/// trace span (so communication they start is not counted as the unit's
/// compute). A hook may replace the unit's buffers (Unit::set_buffers).
class GPT {
 public:
  /// Builds the units; each is initialized from (config.seed, unit index).
  explicit GPT(const GPTConfig& config);
  /// The config the model was built with.
  const GPTConfig& config() const { return config_; }

  /// Mean cross-entropy of predicting targets i32 [B, T] from tokens i32
  /// [B, T] (T <= context), plus, for a mixture-of-experts model, every
  /// block's load-balancing loss (aux_loss() alone). Saves activations for
  /// backward().
  double forward(const Tensor& tokens, const Tensor& targets);
  /// The same for a sequence-parallel rank: tokens and targets [B, T_local]
  /// sit at the global positions @p positions (in order; their lengths sum to
  /// T_local, each ends at most at context). The loss is the mean over these
  /// positions; attention reaches the other positions through each block's
  /// AttentionCore.
  double forward(const Tensor& tokens, const Tensor& targets,
                 const std::vector<PositionRange>& positions);
  /// Accumulates d(loss_scale * loss)/d(parameters) into the grads, unit by
  /// unit from the head to the embedding; after each unit, calls the
  /// grad-ready hooks with it. Releases the saved activations as it goes.
  /// For gradient accumulation over k micro-batches pass loss_scale = 1/k.
  void backward(double loss_scale = 1.0);
  /// Logits [B, T, vocab] (MemoryCategory::other), no activations kept.
  /// Calls the before- and after-forward hooks like forward(), which may
  /// change the units' buffers even though the model is const here.
  Tensor logits(const Tensor& tokens) const;
  /// The load-balancing part of the last forward()'s loss (0 for a dense model).
  double aux_loss() const { return aux_loss_; }
  /// True between forward() and backward().
  bool has_saved_activations() const { return has_saved_; }
  /// Drops saved activations without a backward (e.g. after an eval forward).
  void release_activations();

  /// Zeroes every unit's gradient buffer.
  void zero_grad();
  /// A hook called with one unit (see the class comment for when).
  using UnitHook = std::function<void(Unit&)>;
  /// The same as UnitHook, under the name chapter 02 uses.
  using GradReadyHook = UnitHook;
  /// Adds a hook called before each unit's forward, in forward order
  /// (embedding, block.0, ..., head), by forward() and logits().
  void on_before_forward(UnitHook hook) { before_forward_hooks_.push_back(std::move(hook)); }
  /// Adds a hook called after each unit's forward, in forward order, by
  /// forward() and logits().
  void on_after_forward(UnitHook hook) { after_forward_hooks_.push_back(std::move(hook)); }
  /// Adds a hook called before each unit's backward, in reverse order (head,
  /// block.L-1, ..., block.0, embedding).
  void on_before_backward(UnitHook hook) { before_backward_hooks_.push_back(std::move(hook)); }
  /// Adds a hook called after each unit's backward, once its gradients are
  /// complete, in reverse order: head, block.L-1, ..., block.0, embedding.
  /// DDP all-reduces there; FSDP reduce-scatters and frees the parameters.
  void on_grad_ready(GradReadyHook hook) { grad_ready_hooks_.push_back(std::move(hook)); }
  /// Removes every grad-ready hook (the other kinds stay).
  void clear_grad_ready_hooks() { grad_ready_hooks_.clear(); }
  /// Removes every hook of every kind, grad-ready included.
  void clear_hooks();

  /// All units in forward order: embedding, blocks, head.
  std::vector<Unit*> units();
  /// All units in forward order.
  std::vector<const Unit*> units() const;
  /// The embedding unit.
  Embedding& embedding() { return *embedding_; }
  /// Block @p layer (from 0); throws for a block the model does not have.
  Block& block(int layer);
  /// The head unit.
  Head& head() { return *head_; }
  /// Number of transformer blocks.
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  /// Parameters in all units.
  std::int64_t parameter_count() const;

 private:
  void check_tokens(const Tensor& tokens, const char* what) const;
  /// Calls each of @p hooks with @p unit, in order.
  static void run_hooks(const std::vector<UnitHook>& hooks, Unit& unit);
  GPTConfig config_;
  std::unique_ptr<Embedding> embedding_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<Head> head_;
  std::vector<UnitHook> before_forward_hooks_;
  std::vector<UnitHook> after_forward_hooks_;
  std::vector<UnitHook> before_backward_hooks_;
  std::vector<UnitHook> grad_ready_hooks_;
  EmbeddingSaved embedding_saved_;
  std::vector<BlockSaved> block_saved_;
  HeadSaved head_saved_;
  bool has_saved_ = false;
  double aux_loss_ = 0;
};

}  // namespace dtp
