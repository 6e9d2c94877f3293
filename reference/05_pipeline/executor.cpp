// Puzzle 5.7: one executor for every schedule. The schedule says what to
// compute and in which order; the data flow says what to send and receive:
// a forward needs the previous virtual stage's output, a backward the next
// one's input gradient. Each receive sits right before the action that
// needs it, so a rank waits only for what it is about to use.
#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {

double execute_schedule(Comm& pp, const Schedule& schedule, const std::vector<StageModule*>& chunks,
                        const std::vector<MicroBatch>& microbatches) {
  const int p = schedule.stages, m = schedule.microbatches;
  DTP_CHECK(pp.size() == p, "execute_schedule: the schedule has ", p,
            " stages but the pipeline group ", pp.size(), " ranks");
  DTP_CHECK(static_cast<int>(chunks.size()) == schedule.chunks,
            "execute_schedule: the schedule has ", schedule.chunks, " chunk(s) per rank but ",
            chunks.size(), " stage modules were given");
  DTP_CHECK(static_cast<int>(microbatches.size()) == m, "execute_schedule: the schedule has ", m,
            " micro-batches but ", microbatches.size(), " were given");
  const int rank = pp.rank(), last = schedule.virtual_stages() - 1;
  const WeightGrads mode = schedule.split_backward ? WeightGrads::deferred : WeightGrads::immediate;
  double loss_sum = 0;
  for (const Action& action : schedule.actions[static_cast<std::size_t>(rank)]) {
    StageModule& stage = *chunks[static_cast<std::size_t>(action.chunk)];
    const MicroBatch& batch = microbatches[static_cast<std::size_t>(action.microbatch)];
    const int vs = schedule.virtual_stage(rank, action.chunk);
    const int mb = action.microbatch;
    switch (action.kind) {
      case ActionKind::forward: {
        Tensor input = batch.inputs;
        if (vs > 0) {
          input = stage.boundary_tensor(batch);
          pp.recv(input, (vs - 1) % p, pipeline_tag(false, mb, vs - 1));
        }
        Tensor output = stage.forward(mb, input, batch);
        if (vs < last)
          pp.send(output, (vs + 1) % p, pipeline_tag(false, mb, vs));
        else
          loss_sum += stage.loss(mb);
        break;
      }
      case ActionKind::backward: {
        Tensor output_grad;
        if (vs < last) {
          output_grad = stage.boundary_tensor(batch, /*gradient=*/true);
          pp.recv(output_grad, (vs + 1) % p, pipeline_tag(true, mb, vs + 1));
        }
        // 1/m per micro-batch: the accumulated gradient is the batch mean's.
        Tensor input_grad = stage.backward(mb, output_grad, 1.0 / m, mode);
        if (vs > 0) pp.send(input_grad, (vs - 1) % p, pipeline_tag(true, mb, vs));
        break;
      }
      case ActionKind::weight:
        stage.weight(mb);
        break;
    }
  }
  return loss_sum / m;
}

}  // namespace dtp::ch05
