// The chapter 02 checkers' own pieces; the shared training checks (tiny
// config, single-device reference, first-step verdicts, run_and_report) are
// in tests/support/training.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "02_ddp/ddp.h"
#include "support/training.h"

namespace dtp::testing::ch02 {

// The first-step check for a strategy that plugs into the trainer: `install`
// registers its synchronization (hooks, on_after_backward) and returns
// whatever must live as long as the trainer. The checker's own after-backward
// hook, registered last, reads the gradients right after the strategy's.
using Install = std::function<std::shared_ptr<void>(Comm&, Trainer&)>;

inline void expect_first_step_gradients(const std::string& what, const Install& install) {
  const TrainConfig config = tiny_config(12, 1);
  const UnitGradients expected = first_step_gradients(config);
  for (int world : {2, 3, 4}) {
    run_and_report(
        what + ", first-step gradients vs the single-device mean", world, [&](Comm& comm) {
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

// "" when every step issued exactly `calls` all-reduces of `bytes` in total
// and no other collective.
inline std::string check_step_comm(const std::vector<StepComm>& steps, std::int64_t calls,
                                   std::int64_t bytes, const std::string& formula, int rank) {
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const StepComm& c = steps[s];
    if (c.all_reduces != calls || c.bytes != bytes || c.other_collectives != 0)
      return "rank " + std::to_string(rank) + ", step " + std::to_string(s + 1) + ": expected " +
             std::to_string(calls) + " all-reduce(s) (" + formula + ") moving " +
             std::to_string(bytes) + " bytes (the gradient size) and no other collective; got " +
             std::to_string(c.all_reduces) + " all-reduce(s), " + std::to_string(c.bytes) +
             " bytes, " + std::to_string(c.other_collectives) + " other collective call(s)";
  }
  return "";
}

}  // namespace dtp::testing::ch02
