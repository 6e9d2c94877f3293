// Reference for 7.4: mixed precision under data parallelism. The gradients
// are averaged in the precision asked for; the skip decision is taken by
// all ranks together, so the replicas never drift apart.
#include "07_mixed_precision/mixed_precision.h"

#include "dtp/error.h"
#include "dtp/nn_ops.h"
#include "dtp/ops.h"

namespace dtp::ch07 {

bool found_on_any_rank(Comm& comm, bool found) {
  Tensor flag = Tensor::full(Shape{1}, found ? 1.0 : 0.0, DType::f32, comm.device());
  comm.all_reduce(flag, ReduceOp::max);
  return flag.item(0) != 0;
}

namespace {
void average(Comm& comm, Tensor& grads) {
  comm.all_reduce(grads, ReduceOp::sum);
  ops::scale(grads, 1.0 / comm.size());
}
}  // namespace

MixedStep ddp_mixed_precision_step(Comm& comm, MasterWeights& masters, Optimizer& optimizer,
                                   LossScaler* scaler, const Batch& batch, double lr,
                                   double max_norm, DType reduce_dtype) {
  GPT& model = masters.model();
  const DType model_dtype = model.config().dtype;
  DTP_CHECK(reduce_dtype == model_dtype || reduce_dtype == DType::f32,
            "ddp_mixed_precision_step: reduce_dtype must be the model's ", dtype_name(model_dtype),
            " or f32, got ", dtype_name(reduce_dtype));
  MixedStep result;
  model.zero_grad();
  result.loss = model.forward(batch.inputs, batch.targets);
  const double scale = scaler ? scaler->scale() : 1.0;
  model.backward(scale);
  if (reduce_dtype == model_dtype)
    for (Unit* unit : model.units()) average(comm, unit->grads());
  masters.grads_to_master(optimizer);
  std::vector<Tensor> grads = grad_tensors(optimizer.buffers());
  if (reduce_dtype == DType::f32)
    for (Tensor& g : grads) average(comm, g);
  result.grad_norm = global_grad_norm(grads) / scale;

  bool found = false;
  if (scaler) found = found_on_any_rank(comm, scaler->unscale(grads));
  if (!found) {
    optimizer.clip_gradients(max_norm);
    optimizer.step(lr);
  }
  if (scaler) scaler->update(found);
  result.stepped = !found;
  masters.release_grads(optimizer);
  if (result.stepped) masters.master_to_model();
  return result;
}

}  // namespace dtp::ch07
