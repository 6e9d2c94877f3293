// Chapter 07 — mixed precision: your code.
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 07
// to see which puzzles pass. The contract is in
// chapters/07_mixed_precision/mixed_precision.h; the lesson (the formats bit
// by bit, with worked examples of every rounding case) is in
// chapters/07_mixed_precision/README.md.
//
// Tools you may use in 7.1:
//   std::bit_cast<std::uint32_t>(x)      an f32's 32 bits (and back: std::bit_cast<float>(u))
//   std::isnan(x), std::isinf(x)
//   shifts, masks and integer adds
// Not allowed: dtp::float_to_bf16, dtp::float_to_f16 and their inverses in
// dtp/dtype.h (the runtime's own casts), and _Float16 / __bf16 casts: the
// puzzle is to do it yourself.
// The `(void)x;` lines only silence unused-parameter warnings: delete them.
#include "07_mixed_precision/mixed_precision.h"

#include <bit>
#include <cmath>
#include <cstdint>

#include "dtp/error.h"
#include "dtp/nn_ops.h"
#include "dtp/ops.h"
#include "dtp/optim.h"

namespace dtp::ch07 {

std::uint16_t f32_to_bf16_bits(float x) {
  // About 8 lines.
  // NaN first: return the top 16 bits with the top mantissa bit (0x0040) set.
  // Otherwise add 0x7FFF plus the lowest kept bit ((bits >> 16) & 1) to the
  // 32 bits and keep the top 16: below half rounds down, above half carries
  // up, and an exact half carries up only when the kept part is odd.
  (void)x;
  throw dtp::NotSolved("7.1 f32_to_bf16_bits");
}

float bf16_bits_to_f32(std::uint16_t bits) {
  // About 1 line: the bf16 bits are the top half of an f32.
  (void)bits;
  throw dtp::NotSolved("7.1 bf16_bits_to_f32");
}

std::uint16_t f32_to_f16_bits(float x) {
  // About 25 lines.
  // Split the f32 into sign, exponent e (unbiased: field - 127) and the 24-bit
  // significand m = 0x800000 | mantissa (for a normal f32).
  // - NaN: sign | 0x7E00. Infinity: sign | 0x7C00.
  // - e >= 16: infinity. e >= -14: normal f16; keep the top 11 bits of m,
  //   round away the low 13 to nearest even, rebias the exponent (+15). If
  //   rounding carries the mantissa to 2^11, the exponent goes up by one
  //   (and 65520 and above become infinity that way).
  // - e < -14: subnormal; the kept part is m >> (-14 - e + 13), rounded to
  //   nearest even on the bits shifted out; a carry into bit 10 makes it the
  //   smallest normal, which the same bit pattern already says.
  // - |x| < 2^-25 (or an f32 subnormal): signed zero.
  (void)x;
  throw dtp::NotSolved("7.1 f32_to_f16_bits");
}

float f16_bits_to_f32(std::uint16_t bits) {
  // About 12 lines.
  // exponent field 31: infinity or NaN; 0: mantissa x 2^-24 (zero or
  // subnormal); else (1 + mantissa / 1024) x 2^(exponent - 15). Build the f32
  // bits (exponent - 15 + 127, mantissa << 13), or compute the subnormal
  // value with std::ldexp. Keep the sign.
  (void)bits;
  throw dtp::NotSolved("7.1 f16_bits_to_f32");
}

// --- 7.3 the dynamic loss scaler ------------------------------------------------
// Tools:
//   ops::scale(t, factor)                t *= factor, in place (dtp/ops.h)
//   ops::all_finite(t)                   no inf or NaN in t (dtp/nn_ops.h)
//   grad_tensors(optimizer.buffers())    the optimizer's gradients (dtp/optim.h)
//   optimizer.clip_gradients(max_norm)   clips by the global norm (none if max_norm <= 0)
//   optimizer.step(lr)                   the update itself
// Members: scale_, good_steps_, config_ (see mixed_precision.h).

bool LossScaler::unscale(const std::vector<Tensor>& grads) {
  // About 6 lines.
  // Multiply each gradient by 1 / scale_ (exact when the scale is a power of
  // two) and remember whether any of them is not all finite. Do not stop at
  // the first bad one: every gradient must be unscaled. grads holds handles:
  // `Tensor g = grads[i];` views the same storage, so ops::scale(g, ...)
  // scales the gradient itself (ops::scale takes a non-const Tensor&).
  (void)grads;
  throw dtp::NotSolved("7.3 LossScaler::unscale");
}

void LossScaler::update(bool found_non_finite) {
  // About 8 lines.
  // Bad step: scale_ *= backoff_factor, good_steps_ = 0. Good step:
  // ++good_steps_, and at growth_interval: scale_ *= growth_factor,
  // good_steps_ = 0.
  (void)found_non_finite;
  throw dtp::NotSolved("7.3 LossScaler::update");
}

bool LossScaler::step(Optimizer& optimizer, double lr, double max_norm) {
  // About 8 lines.
  // Unscale first: clipping must see the true gradients, not scale_ times
  // them. Skip both clipping and the optimizer step when something is not
  // finite (a norm of inf would scale every gradient to 0 or NaN). Update the
  // schedule either way.
  (void)optimizer;
  (void)lr;
  (void)max_norm;
  throw dtp::NotSolved("7.3 LossScaler::step");
}

// --- 7.2 the mixed-precision step ------------------------------------------------
// Tools:
//   model.units()                        the units, in the order of masters.buffers()
//   unit->grads(), unit->params()        a unit's flat 16-bit buffers
//   Tensor::empty(shape, DType::f32, device, MemoryCategory::other)
//   ops::cast(src, dst)                  converts, rounding to nearest even (dtp/nn_ops.h)
//   optimizer.set_grads(i, grads)        attaches buffer i's gradients (dtp/optim.h)
//   global_grad_norm(grad_tensors(optimizer.buffers()))
// Members: model_ (GPT*), buffers_ (the masters, see mixed_precision.h).

void MasterWeights::grads_to_master(Optimizer& optimizer) const {
  // About 7 lines.
  // For unit i: a new f32 tensor shaped like its grads, on the same device,
  // charged to MemoryCategory::other; cast the 16-bit gradients into it;
  // attach it as buffer i's gradients.
  (void)optimizer;
  throw dtp::NotSolved("7.2 MasterWeights::grads_to_master");
}

void MasterWeights::master_to_model() {
  // About 3 lines: cast buffers_[i].params (f32) into unit i's params.
  throw dtp::NotSolved("7.2 MasterWeights::master_to_model");
}

MixedStep mixed_precision_step(MasterWeights& masters, Optimizer& optimizer, LossScaler* scaler,
                               const Batch& batch, double lr, double max_norm) {
  // About 18 lines.
  // model = masters.model(); zero its gradients; result.loss = model.forward(
  // batch.inputs, batch.targets); backward with the scale (1 without a
  // scaler); cast the gradients up; result.grad_norm = their global norm /
  // the scale; then scaler->step(...) or clip_gradients + step; release the
  // f32 gradients; cast the masters down only if the step was taken.
  (void)masters;
  (void)optimizer;
  (void)scaler;
  (void)batch;
  (void)lr;
  (void)max_norm;
  throw dtp::NotSolved("7.2 mixed_precision_step");
}

// --- 7.4 mixed precision under DDP -------------------------------------------------
// Tools:
//   comm.all_reduce(t, ReduceOp::sum or ReduceOp::max), comm.size(), comm.device()
//   Tensor::full(Shape{1}, value, DType::f32, comm.device()), t.item(0)
//   ops::scale(t, factor)
//   scaler->unscale(grads), scaler->update(found)   the pieces of LossScaler::step

bool found_on_any_rank(Comm& comm, bool found) {
  // About 3 lines: a one-element flag, all-reduced with max.
  (void)comm;
  (void)found;
  throw dtp::NotSolved("7.4 found_on_any_rank");
}

MixedStep ddp_mixed_precision_step(Comm& comm, MasterWeights& masters, Optimizer& optimizer,
                                   LossScaler* scaler, const Batch& batch, double lr,
                                   double max_norm, DType reduce_dtype) {
  // About 25 lines: 7.2's step with the average between backward and the
  // update. First refuse a reduce_dtype that is neither the model's dtype
  // (masters.model().config().dtype) nor f32, naming reduce_dtype and both. In 16 bits, average
  // each unit's grads before grads_to_master; in f32, average the optimizer's gradients after it.
  // With a scaler, the found flag goes through found_on_any_rank before anyone decides.
  (void)comm;
  (void)masters;
  (void)optimizer;
  (void)scaler;
  (void)batch;
  (void)lr;
  (void)max_norm;
  (void)reduce_dtype;
  throw dtp::NotSolved("7.4 ddp_mixed_precision_step");
}

}  // namespace dtp::ch07
