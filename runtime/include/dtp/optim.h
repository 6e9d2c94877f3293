/// @file optim.h
/// @brief Optimizers over flat buffers, the learning-rate schedule, and
/// clipping by global gradient norm.
///
/// An optimizer updates a list of (params, grads) buffer pairs: whole units in
/// single-device training, shards under ZeRO, buckets wherever convenient. Its
/// state has the layout of the params and is charged to MemoryCategory::optimizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtp/checkpoint.h"
#include "dtp/nn.h"
#include "dtp/tensor.h"

namespace dtp {

/// A flat parameter buffer and the gradient buffer laid out like it.
struct ParamBuffer {
  std::string name;  ///< e.g. the unit name
  Tensor params;     ///< updated in place
  Tensor grads;      ///< read
};

/// One ParamBuffer per unit of @p model (forward order), named after the unit.
std::vector<ParamBuffer> param_buffers(GPT& model);
/// One ParamBuffer per unit of @p units, in order, named after the unit: a
/// parallel model's units (this rank's slices, or its stages' units).
std::vector<ParamBuffer> param_buffers(const std::vector<Unit*>& units);

/// The gradient buffers of @p buffers; throws naming a buffer that has none.
std::vector<Tensor> grad_tensors(const std::vector<ParamBuffer>& buffers);

/// Base of SGD and AdamW.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Applies one update with learning rate @p lr to every buffer, from its grads.
  virtual void step(double lr) = 0;
  /// "sgd" or "adamw".
  virtual std::string name() const = 0;
  /// Scales the gradients of buffers() so that their global norm is at most
  /// @p max_norm (no clipping when max_norm <= 0); returns the norm before
  /// clipping. Default: clip_grad_norm over buffers()' gradients. A sharded
  /// optimizer (ZeRO) overrides it to sum the squares over every rank's
  /// shard, so all ranks clip by the norm of the whole model.
  virtual double clip_gradients(double max_norm);
  /// Updates applied so far.
  std::int64_t steps() const { return steps_; }
  /// Sets the count of updates applied: a resumed run continues AdamW's bias
  /// correction from the step it was saved at. At least 0.
  void set_steps(std::int64_t steps);
  /// The state step() keeps, as named views of it ("<buffer>.m" and
  /// "<buffer>.v" for AdamW, "<buffer>.momentum" for SGD with momentum), for
  /// checkpoints: copying into them restores the state.
  virtual std::vector<NamedTensor> state() const { return {}; }
  /// The buffers this optimizer updates.
  const std::vector<ParamBuffer>& buffers() const { return buffers_; }
  /// Points buffer @p i at gradients @p grads (its params' dtype, element
  /// count and device), or at none with an undefined tensor. A buffer may be
  /// built without gradients and get them only for an update: mixed
  /// precision (chapter 07) attaches f32 gradients cast up from a 16-bit
  /// model for one step and frees them after it. step() and
  /// clip_gradients() throw while a buffer has none.
  void set_grads(std::size_t i, Tensor grads);

 protected:
  /// Checks that each buffer's params and grads (when defined) match.
  explicit Optimizer(std::vector<ParamBuffer> buffers);
  /// A zeroed state buffer like buffers()[i].params (MemoryCategory::optimizer).
  Tensor new_state(std::size_t i) const;
  std::vector<ParamBuffer> buffers_;  ///< what step() updates
  std::int64_t steps_ = 0;            ///< updates applied so far
};

/// The kinds of state @p optimizer keeps per buffer, as Optimizer::state()
/// suffixes them: {"m", "v"} for AdamW, {"momentum"} for SGD with momentum,
/// none for plain SGD. What a strategy that moves state between ranks
/// (a consolidated checkpoint) walks.
std::vector<std::string> state_kinds(const Optimizer& optimizer);
/// @p optimizer's state tensor "<buffer>.<kind>"; throws dtp::Error naming
/// it when there is none.
Tensor state_tensor(const Optimizer& optimizer, const std::string& buffer, const std::string& kind);

/// Settings of SGD.
struct SGDConfig {
  double momentum = 0.9;      ///< 0 disables momentum (and its state)
  double weight_decay = 0.0;  ///< L2 added to the gradient
  bool nesterov = false;      ///< Nesterov momentum
};

/// SGD with (optionally Nesterov) momentum; see ops::sgd_update.
class SGD : public Optimizer {
 public:
  /// Allocates a momentum buffer per buffer (none with momentum 0).
  SGD(std::vector<ParamBuffer> buffers, SGDConfig config = {});
  void step(double lr) override;
  std::string name() const override { return "sgd"; }
  std::vector<NamedTensor> state() const override;
  /// The momentum buffer of buffer @p i (undefined with momentum 0).
  const Tensor& momentum_buffer(std::size_t i) const { return momentum_.at(i); }
  /// The settings.
  const SGDConfig& config() const { return config_; }

 private:
  SGDConfig config_;
  std::vector<Tensor> momentum_;
};

/// Settings of AdamW.
struct AdamWConfig {
  double beta1 = 0.9;         ///< decay of the first moment
  double beta2 = 0.95;        ///< decay of the second moment
  double eps = 1e-8;          ///< added to sqrt(v^)
  double weight_decay = 0.0;  ///< decoupled: p -= lr * weight_decay * p, applied to every element
};

/// Adam with bias correction and decoupled weight decay; see ops::adamw_update.
class AdamW : public Optimizer {
 public:
  /// Allocates m and v per buffer (2x the parameters, MemoryCategory::optimizer).
  AdamW(std::vector<ParamBuffer> buffers, AdamWConfig config = {});
  void step(double lr) override;
  std::string name() const override { return "adamw"; }
  std::vector<NamedTensor> state() const override;
  /// m of buffer @p i.
  const Tensor& first_moment(std::size_t i) const { return m_.at(i); }
  /// v of buffer @p i.
  const Tensor& second_moment(std::size_t i) const { return v_.at(i); }
  /// The settings.
  const AdamWConfig& config() const { return config_; }

 private:
  AdamWConfig config_;
  std::vector<Tensor> m_, v_;
};

/// Linear warm-up from max_lr / warmup_steps to max_lr over warmup_steps,
/// then cosine decay to min_lr at total_steps (and min_lr after).
struct LRSchedule {
  double max_lr = 1e-3;           ///< peak, reached at the end of warm-up
  double min_lr = 1e-4;           ///< floor, reached at total_steps
  std::int64_t warmup_steps = 0;  ///< linear warm-up length
  std::int64_t total_steps = 1;   ///< where the cosine ends
  /// The learning rate of step @p step, counted from 0.
  double at(std::int64_t step) const;
};

/// sqrt of the sum of squares of every element of every tensor (in double).
double global_grad_norm(const std::vector<Tensor>& grads);
/// Scales every gradient by max_norm / norm when the global norm exceeds
/// @p max_norm (no clipping when max_norm <= 0). Returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm);

class Comm;
/// clip_grad_norm() of a gradient split over @p comm's ranks, each holding
/// the pieces @p shards (ZeRO's gradient shards; pieces of different
/// parameters or of one): the norm is the root of the sum over ranks of
/// each rank's sum of squares, one all-reduce of one f64, the same on every
/// rank. Collective over @p comm. Returns the norm before clipping.
double clip_sharded_grad_norm(Comm& comm, const std::vector<Tensor>& shards, double max_norm);

}  // namespace dtp
