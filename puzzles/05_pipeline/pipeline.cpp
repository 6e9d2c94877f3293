// Chapter 05 — pipeline parallelism.
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 05                  (or ./dtp grade 05 --puzzle 5.3)
// The contract is in chapters/05_pipeline/pipeline.h; the lesson (the
// Gantt charts, the bubble formulas, the memory) is in
// chapters/05_pipeline/README.md. 5.1 and 5.3-5.6 are pure functions (no
// ranks, no model); 5.2, 5.7 and 5.8 run on ranks. See your schedules with
//     ./dtp schedule --kind 1f1b --stages 4 --microbatches 8
//
// Provided (drivers/05_pipeline/): the schedule data (Schedule, Action and
// the F(mb) B(mb) W(mb) shorthands, empty_schedule), the verifier
// (simulate_schedule, check_schedule, gantt_chart), StageModule (a stage's
// units run one micro-batch at a time), split_microbatches, pipeline_tag,
// the trainer and the `pp` strategy.
// Tools:
//   pp.rank(), pp.size(), pp.send(x, dst, tag), pp.recv(x, src, tag)
//   stage.forward(mb, input, batch) -> output (undefined on the last stage)
//   stage.loss(mb)                     the last stage's loss of mb (before its backward)
//   stage.backward(mb, dy, loss_scale, WeightGrads::immediate | deferred) -> dx
//   stage.weight(mb)                   the deferred weight gradients (W)
//   stage.boundary_tensor(batch[, gradient]) a receive buffer [b, T, C]
//   pipeline_tag(gradient, mb, sending virtual stage)
//   schedule.virtual_stage(rank, chunk) == chunk * p + rank
//   dp.all_gather(shard, full), dp.reduce_scatter(full, shard, ReduceOp::avg)   (5.8)
//   chunk_range(numel, parts, index), unit.set_buffers(params, grads), ops::axpy(y, 1.0, x)
#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {

// --- 5.1 partition --------------------------------------------------------------------

std::vector<UnitRange> partition_units(const std::vector<double>& costs, int stages) {
  // About 30 lines. Check stages in [1, n] and every cost finite and >= 0
  // (dtp::Error naming them). Then find the contiguous split whose most
  // expensive stage is cheapest: a table best[k][i] over "the first i units
  // in k stages", or a binary search on the answer with a greedy check.
  (void)costs, (void)stages;
  throw dtp::NotSolved("5.1 partition_units");
}

// --- 5.2 the naive pipeline ---------------------------------------------------------------

double naive_pipeline_step(Comm& pp, StageModule& stage, const MicroBatch& batch) {
  // About 20 lines. recv (unless rank 0), forward, send (unless last);
  // the last rank reads stage.loss(0) before backward; recv the gradient
  // (unless last), backward with loss_scale 1, send it back (unless rank 0).
  (void)pp, (void)stage, (void)batch;
  throw dtp::NotSolved("5.2 naive_pipeline_step");
}

// --- 5.3 and 5.4: AFAB and 1F1B ---------------------------------------------------------

Schedule afab_schedule(int stages, int microbatches) {
  // About 6 lines. Start from empty_schedule("afab", stages, microbatches).
  (void)stages, (void)microbatches;
  throw dtp::NotSolved("5.3 afab_schedule");
}

Schedule one_f_one_b_schedule(int stages, int microbatches) {
  // About 12 lines. Start from empty_schedule("1f1b", stages, microbatches).
  // Warm-up forwards, then F and B in turn, then the rest of the B's.
  (void)stages, (void)microbatches;
  throw dtp::NotSolved("5.4 one_f_one_b_schedule");
}

// --- 5.5 interleaved 1F1B -------------------------------------------------------------------

Schedule interleaved_schedule(int stages, int microbatches, int chunks) {
  // About 20 lines. Check the conditions first (v >= 2, p >= 2, m % p == 0),
  // then 1F1B over the m v (micro-batch, chunk) pairs in the order the
  // contract gives, with the longer warm-up.
  (void)stages, (void)microbatches, (void)chunks;
  throw dtp::NotSolved("5.5 interleaved_schedule");
}

// --- 5.6 ZB-H1 ----------------------------------------------------------------------------------

Schedule zb_h1_schedule(int stages, int microbatches) {
  // About 14 lines. 1F1B with split_backward = true, each rank r holding
  // back its first r W's until the end.
  (void)stages, (void)microbatches;
  throw dtp::NotSolved("5.6 zb_h1_schedule");
}

// --- 5.7 the executor ----------------------------------------------------------------------------

double execute_schedule(Comm& pp, const Schedule& schedule, const std::vector<StageModule*>& chunks,
                        const std::vector<MicroBatch>& microbatches) {
  // About 40 lines. For each action of schedule.actions[pp.rank()]: find its
  // virtual stage vs = schedule.virtual_stage(rank, chunk); its neighbours
  // are on ranks (vs - 1) % p and (vs + 1) % p (asked for only when they
  // exist). Check the arguments first. Receive what it needs, compute, send
  // what the neighbour needs. Needs 5.1 and 5.3-5.6 solved for its checkers.
  (void)pp, (void)schedule, (void)chunks, (void)microbatches;
  throw dtp::NotSolved("5.7 execute_schedule");
}

// --- 5.8 pipeline x FSDP -------------------------------------------------------------------------

PipelineFsdp::PipelineFsdp(Comm& dp, StageModule& stage) : dp_(dp), stage_(stage) {
  // About 30 lines with the members below. Copy out the shards, release the
  // units' buffers, install the four hooks (stage.on_before_forward, ...).
  // A unit's position in the stage: unit.index() - stage.range().first.
  throw dtp::NotSolved("5.8 pipeline_fsdp");
}

PipelineFsdp::~PipelineFsdp() { stage_.clear_hooks(); }

void PipelineFsdp::zero_grad() {
  for (Tensor& shard : gradient_shards_) shard.fill(0.0);
}

void PipelineFsdp::gather_unit(int u) {
  // About 6 lines: all-gather unit u's shards into a fresh buffer and install it.
  (void)u;
  throw dtp::NotSolved("5.8 pipeline_fsdp");
}

}  // namespace dtp::ch05
