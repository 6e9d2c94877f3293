// The chapter 02 checkers' own pieces; the shared training checks (tiny
// config, single-device reference, first-step verdicts, run_and_report and
// the tolerances of each comparison per dtype) are in tests/support/training.h.
//
// Where they run: models and data on the rank's device (comm.device(); the
// single-device reference on checker_device()) in checker_dtype(): f64 on
// the CPU, f32 under DTP_CHECK_DTYPE=f32 and on a GPU. Communication counts,
// bytes (elements x the dtype's element size), bucket plans and the replicas'
// bitwise agreement are exact in both dtypes.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "02_ddp/ddp.h"
#include "support/checker_precision.h"
#include "support/training.h"

namespace dtp::testing::ch02 {

// tiny_config with its model and data on @p device in checker_dtype(device).
inline TrainConfig ddp_config(std::int64_t global_batch = 12, std::int64_t steps = 3,
                              Device device = checker_device()) {
  return on_device(tiny_config(global_batch, steps), device);
}

// The first-step check for a strategy that plugs into the trainer: `install`
// registers its synchronization (hooks, on_after_backward) and returns
// whatever must live as long as the trainer. The checker's own after-backward
// hook, registered last, reads the gradients right after the strategy's.
using Install = std::function<std::shared_ptr<void>(Comm&, Trainer&)>;

inline void expect_first_step_gradients(const std::string& what, const Install& install) {
  const UnitGradients expected = first_step_gradients(ddp_config(12, 1));
  for (int world : {2, 3, 4}) {
    run_and_report(
        what + ", first-step gradients vs the single-device mean", world, [&](Comm& comm) {
          const TrainConfig config = ddp_config(12, 1, comm.device());
          const UnitGradients local = first_step_gradients(config, comm.rank(), comm.size());
          Trainer trainer(config, comm.rank(), comm.size());
          const std::shared_ptr<void> keep = install(comm, trainer);
          std::string failure = "rank " + std::to_string(comm.rank()) + ": backward never finished";
          trainer.on_after_backward([&] {
            failure = check_first_step_gradients(expected, local, trainer.model(), comm.rank(),
                                                 comm.size());
          });
          trainer.step();
          return failure;
        });
  }
}

// The bytes one step's gradient synchronization moves: every parameter
// element once, at the element size of the model's dtype (8 for f64, 4 for
// f32), counted by the checker from the model's shapes.
inline std::int64_t expected_gradient_bytes(GPT& model, DType dtype) {
  std::int64_t elements = 0;
  for (Unit* unit : model.units()) elements += unit->params().numel();
  return elements * static_cast<std::int64_t>(dtype_size(dtype));
}

// "" when every step issued exactly `calls` all-reduces moving the whole
// gradient (expected_gradient_bytes) and no other collective.
inline std::string check_step_comm(const std::vector<StepComm>& steps, std::int64_t calls,
                                   GPT& model, DType dtype, const std::string& formula, int rank) {
  const std::int64_t bytes = expected_gradient_bytes(model, dtype);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const StepComm& c = steps[s];
    if (c.all_reduces != calls || c.bytes != bytes || c.other_collectives != 0)
      return "rank " + std::to_string(rank) + ", step " + std::to_string(s + 1) + ": expected " +
             std::to_string(calls) + " all-reduce(s) (" + formula + ") moving " +
             std::to_string(bytes) + " bytes (the gradient: " +
             std::to_string(bytes / static_cast<std::int64_t>(dtype_size(dtype))) + " elements x " +
             std::to_string(dtype_size(dtype)) + " bytes of " + dtype_name(dtype) +
             ") and no other collective; got " + std::to_string(c.all_reduces) +
             " all-reduce(s), " + std::to_string(c.bytes) + " bytes, " +
             std::to_string(c.other_collectives) + " other collective call(s)";
  }
  return "";
}

// "" when every rank holds bitwise the same parameters after @p trainer's
// config().steps steps: DDP replicas apply the same averaged gradient, so
// they may not drift apart even by one ulp, in any dtype. Every rank takes
// part; rank 0 reports (each rank would find the same).
inline std::string check_parameters_replicated(Comm& comm, Trainer& trainer) {
  std::vector<std::pair<std::string, Tensor>> parameters;
  for (Unit* unit : trainer.model().units())
    parameters.push_back({"unit '" + unit->name() + "' parameters", unit->params()});
  const std::string m = check_replicas_agree(
      comm, parameters,
      "Every rank must end each step with the same averaged gradient (is one rank's gradient "
      "left out of the all-reduce, or reduced in a different order on each rank?)",
      "DP");
  if (comm.rank() != 0 || m.empty()) return "";
  return "after step " + std::to_string(trainer.config().steps) +
         ", the parameters differ across the ranks:" + m;
}

// Two failure messages as one ("" when both are empty).
inline std::string joined(const std::string& first, const std::string& second) {
  if (first.empty() || second.empty()) return first + second;
  return first + "\n    " + second;
}

}  // namespace dtp::testing::ch02
