/// @file mixed_precision.h
/// @brief Chapter 07 contract: mixed precision. 7.1 is the two 16-bit
/// formats themselves: converting an f32 to bf16 and to f16 by hand, with
/// round-to-nearest-even, subnormals, overflow to infinity and NaN kept NaN,
/// and back.
///
/// A 16-bit value is passed as its bit pattern (std::uint16_t), an f32 as a
/// float; std::bit_cast<std::uint32_t>(x) gives an f32's 32 bits.
///
/// | format | sign | exponent (bias) | mantissa | largest finite | smallest normal | epsilon |
/// |---|---|---|---|---|---|---|
/// | f32  | 1 | 8 (127) | 23 | 3.4e38 | 2^-126 | 2^-23 |
/// | bf16 | 1 | 8 (127) | 7  | 3.39e38 | 2^-126 | 2^-7 |
/// | f16  | 1 | 5 (15)  | 10 | 65504 | 2^-14 | 2^-10 |
///
/// 7.3 is dynamic loss scaling with the semantics of PyTorch's GradScaler:
/// the loss is multiplied by a large scale before backward so that small
/// f16 gradients do not flush to zero; the gradients are divided by it
/// before anything reads them (clipping included); a step whose gradients
/// hold an inf or NaN is skipped and the scale halved; after a run of good
/// steps the scale doubles.
///
/// 7.2 is the mixed-precision step: a bf16 or f16 model runs forward and
/// backward; the optimizer updates f32 master weights from the gradients
/// cast up; the masters are cast down into the model after the update.
///
/// 7.4 is the same step on data-parallel ranks: the gradients are averaged
/// in a chosen precision, and every rank takes the same skip decision.
///
/// See chapters/07_mixed_precision/README.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/data.h"
#include "dtp/nn.h"
#include "dtp/optim.h"
#include "dtp/tensor.h"
#include "dtp/trainer.h"

namespace dtp::ch07 {

/// 7.1 The bf16 nearest to @p x, as its 16 bits. bf16 is the top half of
/// an f32, so this is the top 16 bits of x after rounding away the low 16:
/// to nearest, and on an exact tie to the even one (the one whose lowest
/// kept bit is 0). A value that rounds past the largest finite bf16 becomes
/// infinity with its sign. f32 subnormals round like any other value. A NaN
/// stays a NaN with its sign (rounding must not carry its mantissa into the
/// exponent and make it an infinity).
std::uint16_t f32_to_bf16_bits(float x);

/// 7.1 The f32 equal to the bf16 with bits @p bits (always exact).
float bf16_bits_to_f32(std::uint16_t bits);

/// 7.1 The f16 nearest to @p x, as its 16 bits: 1 sign bit, 5 exponent bits
/// (bias 15), 10 mantissa bits. Rounding to nearest, ties to even. Normal
/// f16 values are [2^-14, 65504]; below 2^-14 the exponent field is 0 and
/// the value is mantissa x 2^-24 (subnormal), so |x| below 2^-25 rounds to
/// 0 (exactly 2^-25 is a tie and goes to the even 0). |x| that rounds to
/// 65536 or more (|x| >= 65520) becomes infinity with its sign. Infinity
/// stays infinity; a NaN stays a NaN with its sign.
std::uint16_t f32_to_f16_bits(float x);

/// 7.1 The f32 equal to the f16 with bits @p bits (always exact: subnormal
/// f16 values become normal f32 values).
float f16_bits_to_f32(std::uint16_t bits);

/// The settings of the loss scaler: PyTorch GradScaler's defaults. A
/// growth and a backoff factor of 1 make a static scale (`--loss-scale N`),
/// which still skips the steps that overflow.
struct ScalerConfig {
  double initial_scale = 65536.0;  ///< 2^16
  double growth_factor = 2.0;      ///< applied after growth_interval good steps in a row (>= 1)
  double backoff_factor = 0.5;     ///< applied after a step with a non-finite gradient (in (0, 1])
  std::int64_t growth_interval = 2000;  ///< good steps in a row before the scale grows (>= 1)
};

/// 7.3 The dynamic loss scaler. Use: multiply the loss by scale() before
/// backward (so every gradient is scale() times too large), then call
/// step() instead of the optimizer's own step.
class LossScaler {
 public:
  /// Provided: checks @p config (a dtp::Error names the bad field).
  explicit LossScaler(ScalerConfig config = {});

  /// The factor the loss is multiplied by before backward.
  double scale() const { return scale_; }
  /// Good steps in a row since the scale last changed (or since the start).
  std::int64_t good_steps() const { return good_steps_; }
  /// The settings.
  const ScalerConfig& config() const { return config_; }
  /// Provided: continues a saved run's schedule (a checkpoint holds scale()
  /// and good_steps()). Throws dtp::Error for a scale that is not finite and
  /// positive or a count outside [0, growth_interval).
  void restore(double scale, std::int64_t good_steps);

  /// 7.3 Divides every element of every gradient in @p grads by scale(), in
  /// place, and returns true when any element of any of them is an inf or a
  /// NaN. Every gradient is unscaled, even after a non-finite one is found.
  bool unscale(const std::vector<Tensor>& grads);

  /// 7.3 Moves the schedule one step: after a step with a non-finite
  /// gradient (@p found_non_finite) the scale is multiplied by
  /// backoff_factor and the count of good steps restarts at 0; after a good
  /// step the count goes up, and when it reaches growth_interval the scale is
  /// multiplied by growth_factor and the count restarts at 0.
  void update(bool found_non_finite);

  /// 7.3 One optimizer step from the gradients of the scaled loss:
  /// unscale @p optimizer's gradients, clip them to a global norm of
  /// @p max_norm (none when max_norm <= 0) through optimizer.clip_gradients,
  /// take optimizer.step(lr) only if every gradient is finite, then update().
  /// Returns true when the step was taken. A skipped step leaves the
  /// parameters and the optimizer's state exactly as they were.
  bool step(Optimizer& optimizer, double lr, double max_norm);

 private:
  ScalerConfig config_;
  double scale_;
  std::int64_t good_steps_ = 0;
};

// --- 7.2 the mixed-precision step ----------------------------------------------

/// The f32 master weights of a bf16 or f16 model: one f32 copy of each
/// unit's flat parameter buffer. They are optimizer state (lesson section
/// 5): charged to MemoryCategory::optimizer.
class MasterWeights {
 public:
  /// Provided: copies every unit's parameters of @p model (bf16 or f16; a
  /// dtp::Error otherwise) up to f32. @p model must outlive this object.
  explicit MasterWeights(GPT& model);

  /// One buffer per unit, in model().units() order and named after it:
  /// params is the f32 master, grads is undefined. Build the optimizer over
  /// these: make_optimizer(config, masters.buffers()).
  const std::vector<ParamBuffer>& buffers() const { return buffers_; }
  /// The 16-bit model.
  GPT& model() { return *model_; }

  /// 7.2 Casts each unit's 16-bit gradients up into a new f32 tensor
  /// (MemoryCategory::other: it lives for one update) and attaches it to
  /// @p optimizer as buffer i's gradients (Optimizer::set_grads), unit i =
  /// buffer i.
  void grads_to_master(Optimizer& optimizer) const;

  /// Provided: detaches the f32 gradients from @p optimizer, which frees them.
  void release_grads(Optimizer& optimizer) const;

  /// 7.2 Casts each f32 master down into its unit's 16-bit parameters
  /// (round to nearest even: ops::cast).
  void master_to_model();

 private:
  GPT* model_;
  std::vector<ParamBuffer> buffers_;
};

/// What one mixed-precision step did.
struct MixedStep {
  double loss = 0;  ///< the batch's mean loss (unscaled)
  double grad_norm =
      0;  ///< global norm of the true (unscaled) gradients before clipping; inf or NaN on overflow
  bool stepped = false;  ///< false when the step was skipped (a non-finite gradient)
};

/// 7.2 One training step of a 16-bit model with f32 master weights:
/// zero the model's gradients; forward @p batch; backward with the loss
/// multiplied by the scaler's scale (1 without a scaler); cast the
/// gradients up (grads_to_master); measure grad_norm (the f32 gradients'
/// global norm divided by that scale); then with @p scaler: its step
/// (unscale, clip, step or skip, update), without: clip to @p max_norm and
/// step; release the f32 gradients; and, when the step was taken, cast the
/// masters down into the model (master_to_model). @p optimizer is built over
/// masters.buffers(); @p scaler may be null (bf16 needs none).
MixedStep mixed_precision_step(MasterWeights& masters, Optimizer& optimizer, LossScaler* scaler,
                               const Batch& batch, double lr, double max_norm);

// --- 7.4 mixed precision under DDP --------------------------------------------------

/// 7.4 True on every rank when @p found is true on at least one rank of
/// @p comm: one all_reduce of a one-element flag with ReduceOp::max.
/// Collective: every rank calls it.
bool found_on_any_rank(Comm& comm, bool found);

/// 7.4 mixed_precision_step on each data-parallel rank's slice of the
/// batch, with the gradients averaged over @p comm's ranks between backward
/// and the update, in @p reduce_dtype:
/// - the model's dtype (bf16 or f16): each unit's 16-bit gradients are
///   all-reduced (sum) and divided by the world size before grads_to_master:
///   half the bytes of f32;
/// - f32: the gradients are cast up first (grads_to_master), and the f32
///   gradients the optimizer holds are all-reduced and divided.
/// With a scaler the skip decision is every rank's: unscale, then
/// found_on_any_rank, then clip and step only when no rank found a
/// non-finite gradient, then update. Every rank then keeps the same
/// masters, model and scale. grad_norm is the norm of the averaged gradients;
/// loss is this rank's slice's mean loss (not averaged over the ranks).
MixedStep ddp_mixed_precision_step(Comm& comm, MasterWeights& masters, Optimizer& optimizer,
                                   LossScaler* scaler, const Batch& batch, double lr,
                                   double max_norm, DType reduce_dtype);

}  // namespace dtp::ch07
