// Puzzle 5.6: ZB-H1. Split each backward into B (the input gradient, which
// the previous stage is waiting for) and W (the weight gradients, which
// nobody waits for). Rank r runs 1F1B with B in place of the whole backward
// but holds back its first r W's; they fill the drain, where 1F1B idles.
// Rank r then holds at most (p - r) + r = p micro-batches: 1F1B's peak.
#include <algorithm>

#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {

Schedule zb_h1_schedule(int stages, int microbatches) {
  Schedule schedule = empty_schedule("zb-h1", stages, microbatches, 1, /*split_backward=*/true);
  for (int r = 0; r < stages; ++r) {
    auto& list = schedule.actions[static_cast<std::size_t>(r)];
    const int warmup = std::min(stages - r - 1, microbatches);
    int forwards = 0, weights = 0;
    while (forwards < warmup) list.push_back(F(forwards++));
    for (int backwards = 0; backwards < microbatches; ++backwards) {
      if (forwards < microbatches) list.push_back(F(forwards++));
      list.push_back(B(backwards));
      if (backwards >= r) list.push_back(W(weights++));
    }
    while (weights < microbatches) list.push_back(W(weights++));
  }
  return schedule;
}

}  // namespace dtp::ch05
