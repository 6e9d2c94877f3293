// Puzzles 5.3 and 5.4: the two classic schedules. Both have the bubble
// (p-1)/(m+p-1); they differ in memory. AFAB keeps all m micro-batches
// alive at the turn; 1F1B starts each backward as early as it can, so rank r
// never holds more than the p - r micro-batches still in the pipe below it.
#include <algorithm>

#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {

Schedule afab_schedule(int stages, int microbatches) {
  Schedule schedule = empty_schedule("afab", stages, microbatches);
  for (auto& list : schedule.actions) {
    for (int mb = 0; mb < microbatches; ++mb) list.push_back(F(mb));
    for (int mb = 0; mb < microbatches; ++mb) list.push_back(B(mb));
  }
  return schedule;
}

Schedule one_f_one_b_schedule(int stages, int microbatches) {
  Schedule schedule = empty_schedule("1f1b", stages, microbatches);
  for (int r = 0; r < stages; ++r) {
    auto& list = schedule.actions[static_cast<std::size_t>(r)];
    // Warm-up: fill the pipe below this rank.
    const int warmup = std::min(stages - r - 1, microbatches);
    int forwards = 0;
    while (forwards < warmup) list.push_back(F(forwards++));
    // Steady state: one forward, one backward; then drain the backwards.
    for (int backwards = 0; backwards < microbatches; ++backwards) {
      if (forwards < microbatches) list.push_back(F(forwards++));
      list.push_back(B(backwards));
    }
  }
  return schedule;
}

}  // namespace dtp::ch05
