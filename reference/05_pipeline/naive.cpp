// Puzzle 5.2: the naive pipeline. One micro-batch walks down the stages and
// its gradient walks back up: at any moment one rank computes and the p - 1
// others wait, a bubble of (p-1)/p.
#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {

double naive_pipeline_step(Comm& pp, StageModule& stage, const MicroBatch& batch) {
  const int rank = pp.rank(), last = pp.size() - 1;
  Tensor input = batch.inputs;
  if (rank > 0) {
    input = stage.boundary_tensor(batch);
    pp.recv(input, rank - 1, pipeline_tag(false, 0, rank - 1));
  }
  Tensor output = stage.forward(0, input, batch);
  double loss = 0;
  Tensor output_grad;
  if (rank < last) {
    pp.send(output, rank + 1, pipeline_tag(false, 0, rank));
    output_grad = stage.boundary_tensor(batch, /*gradient=*/true);
    pp.recv(output_grad, rank + 1, pipeline_tag(true, 0, rank + 1));
  } else {
    loss = stage.loss(0);  // before backward releases what the forward saved
  }
  Tensor input_grad = stage.backward(0, output_grad, 1.0);
  if (rank > 0) pp.send(input_grad, rank - 1, pipeline_tag(true, 0, rank));
  return loss;
}

}  // namespace dtp::ch05
