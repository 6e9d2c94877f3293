// Puzzle 2.1: naive DDP. After backward every rank holds the gradient of its
// own slice of the batch; the mean over ranks is the gradient of the whole
// batch (the slices are equal in size). One all-reduce per parameter: simple,
// and slow, because every call pays the latency alpha (see the lesson).
#include "02_ddp/ddp.h"

namespace dtp::ch02 {

void naive_all_reduce_gradients(Comm& comm, GPT& model) {
  for (Unit* unit : model.units()) {
    for (const ParamView& parameter : unit->parameters()) {
      Tensor grad = parameter.grad;  // a view: the all-reduce writes the unit's buffer
      comm.all_reduce(grad, ReduceOp::avg);
    }
  }
}

}  // namespace dtp::ch02
