// The strategies `dtp train` knows: one `dtp_strategy(NAME)` line each in
// drivers/CMakeLists.txt writes DTP_STRATEGY(NAME) into strategy_list.inc,
// and each driver file defines `dtp::strategies::NAME()`. Compiled into the
// programs that list them (dtp-train and the drivers' checkers), whose
// chapter libraries hold the driver files. A `dtp_checkpoint_policies(NAME)`
// line names the driver function that gives `--checkpoint` its policies.
#include "drivers/checkpointing.h"
#include "drivers/strategy.h"

namespace dtp::strategies {
#define DTP_STRATEGY(name) drivers::Strategy& name();
#define DTP_CHECKPOINT_POLICIES(name) drivers::CheckpointPolicies name();
#include "strategy_list.inc"
#undef DTP_CHECKPOINT_POLICIES
#undef DTP_STRATEGY
}  // namespace dtp::strategies

namespace dtp::drivers {

const std::vector<Strategy*>& registered_strategies() {
  static const std::vector<Strategy*> list = {
#define DTP_STRATEGY(name) &strategies::name(),
#define DTP_CHECKPOINT_POLICIES(name)
#include "strategy_list.inc"
#undef DTP_CHECKPOINT_POLICIES
#undef DTP_STRATEGY
  };
  return list;
}

namespace {
// Hands chapter 09's policies to --checkpoint when the program starts.
const bool policies_registered = [] {
#define DTP_STRATEGY(name)
#define DTP_CHECKPOINT_POLICIES(name) set_checkpoint_policies(strategies::name());
#include "strategy_list.inc"
#undef DTP_CHECKPOINT_POLICIES
#undef DTP_STRATEGY
  return true;
}();
}  // namespace

Strategy* find_strategy(const std::string& name) {
  for (Strategy* strategy : registered_strategies())
    if (strategy->name() == name) return strategy;
  return nullptr;
}

}  // namespace dtp::drivers
