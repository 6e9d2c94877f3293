#include "dtp/flops.h"

#include "dtp/memory.h"

namespace dtp {

namespace {
thread_local FlopCounts counts;
}  // namespace

FlopCounts flop_counts() { return counts; }
void reset_flop_counts() { counts = FlopCounts{}; }

void count_flops(std::int64_t flops) {
  counts.total += flops;
  if (recomputing()) counts.recompute += flops;
}

}  // namespace dtp
