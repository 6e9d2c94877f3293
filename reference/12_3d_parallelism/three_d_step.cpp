// Puzzles 12.2 and 12.3: one step's gradients on the 3D mesh, and their
// norm. The pipeline runs inside each (pipeline, TP) slice of the mesh; the
// reductions go over the group whose ranks saw different data for the same
// parameters: TP for the replicated parameters under sequence parallelism
// (different tokens), DP for everything (different rows).
#include <cmath>

#include "12_3d_parallelism/three_d.h"

namespace dtp::ch12 {

double three_d_step(Mesh& mesh, ThreeDModel& model, const Batch& batch) {
  const double loss =
      ch05::execute_schedule(mesh.pp, model.schedule(), model.chunks(), model.microbatches(batch));
  // Once per step, after the last micro-batch: earlier, a partial sum would
  // be counted again by the next reduction.
  if (model.sequence_parallel()) {
    for (ch04::TensorParallelBlock* block : model.blocks()) block->reduce_replicated_gradients();
    if (ch04::TensorParallelHead* head = model.head())
      for (Tensor gradient : {head->ln.weight_grad, head->ln.bias_grad})
        mesh.tp.all_reduce(gradient);
  }
  if (mesh.dp.size() > 1)
    for (Unit* unit : model.units()) mesh.dp.all_reduce(unit->grads(), ReduceOp::avg);
  return loss;
}

double clip_grad_norm_3d(Mesh& mesh, ThreeDModel& model, double max_norm) {
  double squares = 0;
  for (Unit* unit : model.units())
    for (const ParamView& p : unit->parameters())
      if (!ch04::is_replicated(p.name) || mesh.tp.rank() == 0) squares += ops::sum_squares(p.grad);
  squares = all_reduce_value(mesh.tp, squares, ReduceOp::sum);
  const double norm = std::sqrt(all_reduce_value(mesh.pp, squares, ReduceOp::sum));
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm)) {
    const double factor = max_norm / (norm + 1e-6);
    for (Unit* unit : model.units()) ops::scale(unit->grads(), factor);
  }
  return norm;
}

}  // namespace dtp::ch12
