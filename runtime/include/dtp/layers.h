/// @file layers.h
/// @brief The layers of a GPT with explicit forward and backward: Linear,
/// LayerNorm, GELU, causal self-attention, the MLP and the cross-entropy.
/// A layer holds views of its parameters (bound by its unit) and nothing
/// else; its forward fills a `...Saved` struct with what its backward needs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtp/gpt_config.h"
#include "dtp/nn_ops.h"
#include "dtp/tensor.h"
#include "dtp/unit.h"

namespace dtp {

/// An uninitialized tensor of @p shape with @p like's dtype and device,
/// charged to MemoryCategory::activations: how a layer's forward makes its
/// output and what it saves.
Tensor new_activation(const Shape& shape, const Tensor& like);
/// The same, charged to MemoryCategory::other: how a backward makes the
/// transient gradient of its input.
Tensor new_gradient(const Shape& shape, const Tensor& like);

/// Deferred weight-gradient work (zero-bubble pipelines run input gradients
/// first and weight gradients later). Holds the tensors the work needs and
/// refers to the layers that queued it, so those must outlive it.
class PendingWeightGrads {
 public:
  /// Queues @p work.
  void add(std::function<void()> work) { work_.push_back(std::move(work)); }
  /// Runs and forgets all pending work, in the order it was added.
  void run();
  /// True when nothing is queued.
  bool empty() const { return work_.empty(); }
  /// Drops queued work without running it.
  void clear() { work_.clear(); }

 private:
  std::vector<std::function<void()>> work_;
};

/// What a Linear keeps for its backward.
struct LinearSaved {
  Tensor input;    ///< x, shared with whoever produced it (no copy)
  Tensor adapter;  ///< what the layer's LinearAdapter kept (undefined without one)
};

/// A trainable term added to a Linear's output, y = x W^T + b + adapter(x):
/// LoRA's low-rank update (chapter 08). Attached with Linear::adapter (not
/// owned); it holds its own parameters and gradients, so it trains even
/// when the Linear's unit is frozen.
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  /// Adds the adapter's term for x [..., in] to y [..., out]; returns what
  /// its backward needs (the Linear keeps it in LinearSaved::adapter).
  virtual Tensor forward(const Tensor& x, Tensor& y) const = 0;
  /// Adds the adapter's part of dx for dy into dx [..., in].
  virtual void backward_input(const Tensor& dy, Tensor& dx) const = 0;
  /// Accumulates the adapter's own gradients for dy, the layer's input x
  /// and what forward returned.
  virtual void backward_weight(const Tensor& dy, const Tensor& x, const Tensor& kept) const = 0;
};

/// y = x W^T + b with W [out, in]. The backward is split: backward_input gives
/// dx = dy W, backward_weight accumulates dW += dy^T x and db += sum(dy).
class Linear {
 public:
  Linear() = default;
  /// W [out_features, in_features], with a bias [out_features] when @p has_bias.
  Linear(std::int64_t in_features, std::int64_t out_features, bool has_bias);
  /// Appends "<prefix>.weight" (and "<prefix>.bias") to a unit layout.
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix, double weight_std) const;
  /// Points weight/bias and their gradients at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y [..., out] (MemoryCategory::activations); saves x.
  Tensor forward(const Tensor& x, LinearSaved& saved) const;
  /// dx [..., in] = dy W (MemoryCategory::other).
  Tensor backward_input(const Tensor& dy) const;
  /// dx = dy W, or dx += dy W with @p accumulate.
  void backward_input_into(const Tensor& dy, Tensor& dx, bool accumulate) const;
  /// dW += dy^T x, db += sum over rows of dy.
  void backward_weight(const Tensor& dy, const LinearSaved& saved) const;
  /// Both halves; with @p defer the weight half is queued instead and keeps dy
  /// and x alive until it runs. Releases saved.
  Tensor backward(const Tensor& dy, LinearSaved& saved, PendingWeightGrads* defer = nullptr) const;

  std::int64_t in_features = 0;   ///< columns of W
  std::int64_t out_features = 0;  ///< rows of W
  bool has_bias = true;           ///< false: no bias parameter
  bool frozen = false;            ///< no dW, db (its unit is frozen); the adapter still trains
  /// Adds its term to the output and trains beside W when set (not owned).
  const LinearAdapter* adapter = nullptr;
  Tensor weight;       ///< W [out, in], a view of the unit's params
  Tensor bias;         ///< b [out] (undefined without bias)
  Tensor weight_grad;  ///< dW, a view of the unit's grads
  Tensor bias_grad;    ///< db
};

/// What a LayerNorm keeps for its backward.
struct LayerNormSaved {
  Tensor input;  ///< x (shared, no copy)
  Tensor mean;   ///< one per row
  Tensor rstd;   ///< 1 / sqrt(var + eps), one per row
};

/// LayerNorm over the last dim with learned weight (init 1) and bias (init 0).
class LayerNorm {
 public:
  LayerNorm() = default;
  /// Normalizes over @p features (the last dim).
  LayerNorm(std::int64_t features, double eps) : features(features), eps(eps) {}
  /// Appends "<prefix>.weight" and "<prefix>.bias" to a unit layout.
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix) const;
  /// Points the parameters and their gradients at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y (activations); saves x, mean and rstd (activations).
  Tensor forward(const Tensor& x, LayerNormSaved& saved) const;
  /// dx (other); accumulates dweight, dbias; releases saved.
  Tensor backward(const Tensor& dy, LayerNormSaved& saved) const;

  std::int64_t features = 0;  ///< size of the normalized (last) dim
  double eps = 1e-5;          ///< added to the variance
  bool frozen = false;        ///< no weight or bias gradients (its unit is frozen)
  Tensor weight;              ///< gain [features], starts at 1
  Tensor bias;                ///< shift [features], starts at 0
  Tensor weight_grad;         ///< gradient of weight
  Tensor bias_grad;           ///< gradient of bias
};

/// What a GELU keeps for its backward.
struct GeluSaved {
  Tensor input;  ///< x (shared, no copy)
};

/// GELU, tanh approximation.
class Gelu {
 public:
  /// y = gelu(x) (activations); saves x.
  Tensor forward(const Tensor& x, GeluSaved& saved) const;
  /// dx = dy * gelu'(x) (other); releases saved.
  Tensor backward(const Tensor& dy, GeluSaved& saved) const;
};

/// What attention keeps for its backward.
struct AttentionSaved {
  LinearSaved q_in;     ///< input of the q projection (the LayerNorm output)
  LinearSaved k_in;     ///< the same tensor, for k
  LinearSaved v_in;     ///< the same tensor, for v
  LinearSaved proj_in;  ///< input of the output projection: the attention output
  Tensor q;             ///< [B, T, C] query projection
  Tensor k;             ///< [B, T, C] key projection
  Tensor v;             ///< [B, T, C] value projection
  Tensor probs;         ///< naive attention: [B, H, T, T]
  Tensor row_max;       ///< flash attention: [B, H, T]
  Tensor row_sum;       ///< flash attention: [B, H, T]
};

/// The part of attention that mixes positions: for q, k, v viewed as [B, T,
/// H, D], out = softmax(q k^T / sqrt(D), causal) v. CausalSelfAttention
/// computes it itself (naive or flash) unless it is given a core: sequence
/// parallelism installs one that computes it across the ranks holding the
/// other positions. A core keeps what its backward needs between the two
/// calls, so every block needs its own.
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  /// out [B, T, H, D] for this rank's q, k, v [B, T, H, D].
  virtual Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v) = 0;
  /// Sets dq, dk, dv [B, T, H, D] from dout (writing into the tensors given,
  /// or replacing them).
  virtual void backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) = 0;
};

/// Causal multi-head self-attention with separate q, k, v projections (so
/// tensor parallelism splits heads by slicing rows of each) and an output
/// projection.
class CausalSelfAttention {
 public:
  CausalSelfAttention() = default;
  /// Sized by config.d_model and config.heads; config.attention picks the kernel.
  explicit CausalSelfAttention(const GPTConfig& config);
  /// Appends "<prefix>.{q,k,v,proj}.{weight,bias}" to a unit layout.
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix) const;
  /// Points the four projections at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y [B, T, C] for x [B, T, C] (activations); fills saved.
  Tensor forward(const Tensor& x, AttentionSaved& saved) const;
  /// dx for dy; accumulates (or, with @p defer, queues) the projections'
  /// weight gradients; releases saved.
  Tensor backward(const Tensor& dy, AttentionSaved& saved,
                  PendingWeightGrads* defer = nullptr) const;

  Linear q;                                   ///< query projection [C, C]
  Linear k;                                   ///< key projection [C, C]
  Linear v;                                   ///< value projection [C, C]
  Linear proj;                                ///< output projection [C, C]
  int heads = 1;                              ///< heads; head dim = C / heads
  AttentionKind kind = AttentionKind::naive;  ///< naive or flash
  double init_std = 0.02;                     ///< init std of q, k, v
  double proj_std = 0.02;                     ///< init std of proj (scaled for depth)
  /// Computes the attention itself when set (not owned; see AttentionCore).
  AttentionCore* core = nullptr;
};

/// What an MLP keeps for its backward.
struct MlpSaved {
  LinearSaved fc;    ///< input of fc (the LayerNorm output)
  LinearSaved proj;  ///< input of proj (the GELU output)
  GeluSaved gelu;    ///< input of the GELU (the fc output)
};

/// fc (C -> ratio C), GELU, proj (ratio C -> C).
class Mlp {
 public:
  Mlp() = default;
  /// Sized by config.d_model and config.mlp_ratio.
  explicit Mlp(const GPTConfig& config);
  /// Appends "<prefix>.{fc,proj}.{weight,bias}" to a unit layout.
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix) const;
  /// Points fc and proj at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y [.., C] (activations); fills saved.
  Tensor forward(const Tensor& x, MlpSaved& saved) const;
  /// dx for dy; weight gradients accumulated or (with @p defer) queued; releases saved.
  Tensor backward(const Tensor& dy, MlpSaved& saved, PendingWeightGrads* defer = nullptr) const;

  Linear fc;               ///< C -> ratio * C
  Linear proj;             ///< ratio * C -> C
  Gelu gelu;               ///< between them
  double init_std = 0.02;  ///< init std of fc
  double proj_std = 0.02;  ///< init std of proj (scaled for depth)
};

/// What the loss keeps for its backward.
struct CrossEntropySaved {
  Tensor logits;   ///< [B, T, V], turned into its gradient in place by backward
  Tensor targets;  ///< i32 [B, T]
};

/// Mean softmax cross-entropy over all B*T positions (fused with the softmax).
class CrossEntropy {
 public:
  /// The mean loss (computed in double); saves logits and targets.
  double forward(const Tensor& logits, const Tensor& targets, CrossEntropySaved& saved) const;
  /// d(loss_scale * mean loss)/d logits, written over the saved logits and returned.
  Tensor backward(CrossEntropySaved& saved, double loss_scale = 1.0) const;
};

}  // namespace dtp
