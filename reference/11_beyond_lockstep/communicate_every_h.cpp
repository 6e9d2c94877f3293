// Local SGD (11.3) and DiLoCo (11.4): ranks that train alone for h steps and
// then communicate once, one all-reduce per unit, instead of every step.
#include <cstddef>
#include <vector>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "dtp/nn_ops.h"

namespace dtp::ch11 {

StepRecord LocalSgd::step() {
  StepRecord record = trainer_.step();
  if (trainer_.steps_done() % h_ != 0) return record;
  // The parameters become the mean of the ranks' models; each rank's
  // optimizer state (SGD's momentum) stays its own.
  for (Unit* unit : trainer_.model().units()) comm_.all_reduce(unit->params(), ReduceOp::avg);
  ++averages_;
  return record;
}

StepRecord DiLoCo::step() {
  StepRecord record = trainer_.step();
  if (trainer_.steps_done() % h_ != 0) return record;
  std::vector<Unit*> units = trainer_.model().units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    Tensor& params = units[u]->params();
    Tensor& theta = theta_[u];
    Tensor& m = momentum_[u];
    // delta = theta - params: how far h steps of AdamW moved this rank,
    // pointing back where it started, like a gradient.
    Tensor delta = theta.clone();
    ops::axpy(delta, -1.0, params);
    comm_.all_reduce(delta, ReduceOp::avg);
    // m = momentum * m + delta; theta -= lr * (delta + momentum * m).
    ops::scale(m, outer_.momentum);
    ops::axpy(m, 1.0, delta);
    ops::axpy(delta, outer_.momentum, m);
    ops::axpy(theta, -outer_.lr, delta);
    params.copy_from(theta);
  }
  ++outer_steps_;
  return record;
}

}  // namespace dtp::ch11
