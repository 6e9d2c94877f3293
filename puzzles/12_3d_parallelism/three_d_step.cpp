// Chapter 12 — 3D parallelism: one step on the mesh (12.2) and the global
// gradient norm (12.3).
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 12
// The contract is in chapters/12_3d_parallelism/three_d.h; the lesson is in
// chapters/12_3d_parallelism/README.md. These run your chapter 04 units and
// your chapter 05 executor: solve 4.1-4.7 and 5.7 first.
//
// Tools you may use:
//   mesh.tp, mesh.pp, mesh.dp     the three groups (Comm); .rank(), .size()
//   model.schedule(), model.chunks(), model.microbatches(batch)
//   model.units()                 every unit this rank holds
//   model.blocks(), model.head()  the TP blocks, the head (nullptr when not held)
//   model.sequence_parallel()
//   ch05::execute_schedule(pp, schedule, chunks, microbatches)     your 5.7
//   block->reduce_replicated_gradients()                           your 4.7
//   head->ln.weight_grad, head->ln.bias_grad
//   unit->grads()                 one flat tensor of the unit's gradients
//   unit->parameters()            ParamView{name, value, grad, shape}
//   ch04::is_replicated(name)     true for a parameter every TP rank holds whole
//   comm.all_reduce(x, ReduceOp::sum | ReduceOp::avg)
//   all_reduce_value(comm, double, ReduceOp::sum)
//   ops::sum_squares(tensor), ops::scale(tensor, factor)
#include "12_3d_parallelism/three_d.h"

namespace dtp::ch12 {

double three_d_step(Mesh& mesh, ThreeDModel& model, const Batch& batch) {
  // About 10 lines: the schedule over the pipeline group; then which
  // gradients are partial, over which group, and when.
  (void)mesh;
  (void)model;
  (void)batch;
  throw dtp::NotSolved("12.2 three_d_step");
}

double clip_grad_norm_3d(Mesh& mesh, ThreeDModel& model, double max_norm) {
  // About 12 lines: each rank's sum of squares, counted once per element of
  // the whole model; the groups that hold different elements; then clip.
  (void)mesh;
  (void)model;
  (void)max_norm;
  throw dtp::NotSolved("12.3 clip_grad_norm_3d");
}

}  // namespace dtp::ch12
