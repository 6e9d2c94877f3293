// Reference for 7.2: the mixed-precision step. The 16-bit model computes;
// the f32 masters accumulate the updates.
#include "07_mixed_precision/mixed_precision.h"

#include "dtp/nn_ops.h"
#include "dtp/trace.h"

namespace dtp::ch07 {

void MasterWeights::grads_to_master(Optimizer& optimizer) const {
  std::vector<Unit*> units = model_->units();
  for (std::size_t i = 0; i < units.size(); ++i) {
    const Tensor& grads16 = units[i]->grads();
    Tensor grads32 =
        Tensor::empty(grads16.shape(), DType::f32, grads16.device(), MemoryCategory::other);
    ops::cast(grads16, grads32);
    optimizer.set_grads(i, grads32);
  }
}

void MasterWeights::master_to_model() {
  std::vector<Unit*> units = model_->units();
  for (std::size_t i = 0; i < units.size(); ++i) ops::cast(buffers_[i].params, units[i]->params());
}

MixedStep mixed_precision_step(MasterWeights& masters, Optimizer& optimizer, LossScaler* scaler,
                               const Batch& batch, double lr, double max_norm) {
  GPT& model = masters.model();
  MixedStep result;
  model.zero_grad();
  result.loss = model.forward(batch.inputs, batch.targets);
  const double scale = scaler ? scaler->scale() : 1.0;
  model.backward(scale);
  masters.grads_to_master(optimizer);
  if (scaler) {
    result.grad_norm = global_grad_norm(grad_tensors(optimizer.buffers())) / scale;
    result.stepped = scaler->step(optimizer, lr, max_norm);
  } else {
    // Unscaled gradients: clipping measures the same norm, so it is read once.
    result.grad_norm = optimizer.clip_gradients(max_norm);
    optimizer.step(lr);
    result.stepped = true;
  }
  masters.release_grads(optimizer);
  // A skipped step changed no master: the model already equals them cast down.
  if (result.stepped) masters.master_to_model();
  return result;
}

}  // namespace dtp::ch07
