// The strategies `dtp train` knows: one `dtp_strategy(NAME)` line each in
// drivers/CMakeLists.txt writes DTP_STRATEGY(NAME) into strategy_list.inc,
// and each driver file defines `dtp::strategies::NAME()`. Compiled into the
// programs that list them (dtp-train and the drivers' checkers), whose
// chapter libraries hold the driver files.
#include "drivers/strategy.h"

namespace dtp::strategies {
#define DTP_STRATEGY(name) drivers::Strategy& name();
#include "strategy_list.inc"
#undef DTP_STRATEGY
}  // namespace dtp::strategies

namespace dtp::drivers {

const std::vector<Strategy*>& registered_strategies() {
  static const std::vector<Strategy*> list = {
#define DTP_STRATEGY(name) &strategies::name(),
#include "strategy_list.inc"
#undef DTP_STRATEGY
  };
  return list;
}

Strategy* find_strategy(const std::string& name) {
  for (Strategy* strategy : registered_strategies())
    if (strategy->name() == name) return strategy;
  return nullptr;
}

}  // namespace dtp::drivers
