// Reference for 7.3: dynamic loss scaling with GradScaler's semantics.
#include "07_mixed_precision/mixed_precision.h"

#include "dtp/nn_ops.h"
#include "dtp/ops.h"
#include "dtp/optim.h"

namespace dtp::ch07 {

bool LossScaler::unscale(const std::vector<Tensor>& grads) {
  for (const Tensor& g : grads) {
    Tensor view = g;  // shares g's storage: unscaling it unscales the gradient
    ops::scale(view, 1.0 / scale_);
  }
  // One check over all of them: on a GPU, one wait instead of one per unit.
  return !ops::all_finite(grads);
}

void LossScaler::update(bool found_non_finite) {
  if (found_non_finite) {
    scale_ *= config_.backoff_factor;
    good_steps_ = 0;
    return;
  }
  if (++good_steps_ == config_.growth_interval) {
    scale_ *= config_.growth_factor;
    good_steps_ = 0;
  }
}

bool LossScaler::step(Optimizer& optimizer, double lr, double max_norm) {
  // Unscale before anything reads the gradients: the clipping threshold is
  // a norm of the true gradients, not of scale() times them.
  const bool found_non_finite = unscale(grad_tensors(optimizer.buffers()));
  if (!found_non_finite) {
    optimizer.clip_gradients(max_norm);
    optimizer.step(lr);
  }
  update(found_non_finite);
  return !found_non_finite;
}

}  // namespace dtp::ch07
