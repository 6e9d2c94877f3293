/// @file unit.h
/// @brief A unit of the model: a group of parameters in one flat parameter
/// buffer and one flat gradient buffer, every named parameter a view into
/// them (the granularity of DDP buckets, ZeRO shards and FSDP units).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtp/tensor.h"

namespace dtp {

/// How a parameter starts.
enum class ParamInit { zeros, ones, normal };

/// One entry of a unit's flat layout.
struct ParamSpec {
  std::string name;                   ///< e.g. "attn.q.weight"
  Shape shape;                        ///< its shape
  ParamInit init = ParamInit::zeros;  ///< how it starts
  double std = 0;                     ///< for ParamInit::normal
  /// false: drawn at init (so that the parameters after it start as in the
  /// whole unit) but given no memory and no view; an expert another rank holds.
  bool held = true;
};

/// One named parameter: where it sits in the unit's flat buffers, and views of them.
struct ParamView {
  std::string name;         ///< e.g. "attn.q.weight"
  Shape shape;              ///< its shape
  std::int64_t offset = 0;  ///< elements from the start of the flat buffers
  Tensor value;             ///< view of Unit::params() (undefined when params are)
  Tensor grad;              ///< view of Unit::grads() (undefined when grads are)
};

/// A group of parameters with one flat parameter buffer and one flat gradient
/// buffer (the granularity of DDP hooks and FSDP units).
class Unit {
 public:
  virtual ~Unit() = default;
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  /// "embedding", "block.0", ..., "head".
  const std::string& name() const { return name_; }
  /// Position in the model: 0 embedding, 1..layers the blocks, layers + 1 the head.
  int index() const { return index_; }
  /// The config of the model the unit belongs to.
  const GPTConfig& config() const { return config_; }
  /// The flat parameter buffer (1-D, MemoryCategory::params); undefined
  /// while released (see set_buffers()).
  Tensor& params() { return params_; }
  /// The flat parameter buffer.
  const Tensor& params() const { return params_; }
  /// The flat gradient buffer (1-D, MemoryCategory::grads), laid out like params().
  Tensor& grads() { return grads_; }
  /// The flat gradient buffer.
  const Tensor& grads() const { return grads_; }
  /// Parameters in this unit (elements of each flat buffer).
  std::int64_t numel() const { return numel_; }
  /// Every parameter in layout order.
  const std::vector<ParamView>& parameters() const { return views_; }
  /// Every parameter in layout order, writable, so that
  /// `for (ParamView& p : unit->parameters()) comm.all_reduce(p.grad, ...)`
  /// compiles (collectives take a Tensor&). Write into the views' values;
  /// never reassign a view (it would stop aliasing the flat buffers).
  std::vector<ParamView>& parameters() { return views_; }
  /// The parameter called @p name; throws listing the names this unit has.
  const ParamView& parameter(const std::string& name) const;
  /// Sets the gradient buffer to zero (nothing while it is released).
  void zero_grad();
  /// Re-initializes every parameter from the model seed (the same values as at
  /// construction, independent of other units). Throws while the parameters
  /// are released.
  void reset_parameters();
  /// Replaces the flat buffers (same numel and dtype) and re-points every
  /// view and layer at them. Either may be an undefined tensor: the buffer is
  /// then released, and the unit keeps no reference to the old storage (its
  /// views and layers become undefined too), so the memory is freed as soon
  /// as the caller drops its own handles. FSDP gathers full parameters into a
  /// fresh buffer and installs it here before a unit's forward or backward,
  /// and releases it afterwards. Saved activations never refer to
  /// parameters, so releasing between forward and backward is fine.
  void set_buffers(Tensor params, Tensor grads);
  /// False while the parameters are released: forward and backward then
  /// throw dtp::Error.
  bool has_params() const { return params_.defined(); }
  /// False while the gradients are released: backward then throws (unless
  /// the unit is frozen), and zero_grad() skips the unit.
  bool has_grads() const { return grads_.defined(); }
  /// Stops computing this unit's parameter gradients for good and releases
  /// its gradient buffer: its backward still passes gradients on to earlier
  /// units (and to any LinearAdapter attached to its layers), but never
  /// computes its own. LoRA (chapter 08) freezes the whole base model, so
  /// the base takes no gradient and no optimizer memory.
  void freeze();
  /// True after freeze().
  bool frozen() const { return frozen_; }

 protected:
  /// Allocates zeroed flat buffers for @p layout; the derived constructor
  /// then calls finish_construction().
  Unit(std::string name, int index, const GPTConfig& config, std::vector<ParamSpec> layout);
  /// Derived units point their layers at the current views.
  virtual void bind() = 0;
  /// The value view of parameter @p name.
  Tensor value(const std::string& name) const { return parameter(name).value; }
  /// The gradient view of parameter @p name.
  Tensor grad(const std::string& name) const { return parameter(name).grad; }
  /// Finishes construction: initializes parameters and binds. Derived
  /// constructors call it last.
  void finish_construction();
  /// Throws dtp::Error when the parameters are released; @p pass is
  /// "forward" or "backward", for the message.
  void require_params(const char* pass) const;

  GPTConfig config_;  ///< the model's config

 private:
  void make_views();
  std::string name_;
  int index_;
  std::vector<ParamSpec> layout_;
  std::int64_t numel_ = 0;
  bool frozen_ = false;
  Tensor params_;
  Tensor grads_;
  std::vector<ParamView> views_;
};

}  // namespace dtp
