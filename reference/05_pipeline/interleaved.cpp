// Puzzle 5.5: interleaved 1F1B (Megatron-LM). Each rank holds v chunks, so
// a micro-batch visits every rank v times and each visit is 1/v of the work:
// the warm-up and drain shrink v-fold, and so does the bubble, for v times
// the messages.
//
// The k-th forward of a rank is micro-batch (k / (p v)) p + k % p on chunk
// (k / p) % v: groups of p micro-batches go through chunk 0, then chunk 1,
// ... The k-th backward walks the same order with the chunks reversed.
#include <algorithm>

#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {

Schedule interleaved_schedule(int stages, int microbatches, int chunks) {
  Schedule schedule = empty_schedule("interleaved", stages, microbatches, chunks);
  DTP_CHECK(chunks >= 2, "interleaved schedule: ", chunks,
            " chunk per rank is plain 1F1B; interleaving needs v >= 2 chunks per rank");
  DTP_CHECK(stages >= 2,
            "interleaved schedule: 1 stage has nobody to interleave with; it needs p >= 2 stages");
  DTP_CHECK(microbatches % stages == 0, "interleaved schedule: m = ", microbatches,
            " micro-batches must be a multiple of p = ", stages,
            " stages (they go through each chunk in groups of p)");
  const int p = stages, v = chunks, total = microbatches * chunks;
  const auto forward = [&](int k) { return F((k / (p * v)) * p + k % p, (k / p) % v); };
  const auto backward = [&](int k) { return B((k / (p * v)) * p + k % p, v - 1 - (k / p) % v); };
  for (int r = 0; r < p; ++r) {
    auto& list = schedule.actions[static_cast<std::size_t>(r)];
    const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    int forwards = 0;
    while (forwards < warmup) list.push_back(forward(forwards++));
    for (int backwards = 0; backwards < total; ++backwards) {
      if (forwards < total) list.push_back(forward(forwards++));
      list.push_back(backward(backwards));
    }
  }
  return schedule;
}

}  // namespace dtp::ch05
