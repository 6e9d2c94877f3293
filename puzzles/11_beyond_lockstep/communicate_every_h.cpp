// Chapter 11 — beyond lockstep: local SGD (11.3) and DiLoCo (11.4).
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 11
// to see which puzzles pass. The contract is in
// chapters/11_beyond_lockstep/beyond_lockstep.h; the lesson (why
// communicating every h steps still trains, and what DiLoCo's outer step
// adds) is in chapters/11_beyond_lockstep/README.md. The constructors are
// provided: LocalSgd keeps comm_, trainer_ and h_; DiLoCo also outer_, and
// theta_ (a copy of the starting parameters) and momentum_ (zeros), one
// flat tensor per unit.
//
// Tools you may use:
//   trainer_.step()                        one local step; returns its StepRecord
//   trainer_.steps_done()                  steps taken so far (after step(): 1, 2, ...)
//   trainer_.model().units()               embedding, block.0, ..., head (forward order)
//   unit->params()                         the unit's flat parameter buffer
//   comm_.all_reduce(t, ReduceOp::avg)     every rank's t becomes the mean over the ranks
//   t.clone()                              a copy in new storage
//   dst.copy_from(src)                     copies src's elements into dst
//   ops::axpy(y, alpha, x)                 y += alpha x      (dtp/nn_ops.h)
//   ops::scale(x, factor)                  x *= factor
#include "11_beyond_lockstep/beyond_lockstep.h"
#include "dtp/nn_ops.h"

namespace dtp::ch11 {

StepRecord LocalSgd::step() {
  // About 6 lines: one local step; when it completes a period of h_ steps,
  // all-reduce every unit's parameters (avg) and count the average. Return
  // the step's record.
  throw dtp::NotSolved("11.3 local_sgd");
}

StepRecord DiLoCo::step() {
  // About 15 lines: one inner step; when it completes a period of h_ steps,
  // the contract's five lines per unit (delta, its all-reduce, m, theta,
  // params), then count the outer step. Return the inner step's record.
  throw dtp::NotSolved("11.4 diloco");
}

}  // namespace dtp::ch11
