// Chapter 09's policies for `dtp train --checkpoint` (drivers/checkpointing.h).
#include "09_activation_checkpointing/checkpointing.h"
#include "drivers/checkpointing.h"

namespace dtp::strategies {

drivers::CheckpointPolicies checkpointing() {
  static const ch09::FullRecomputation full;
  static const ch09::SelectiveRecomputation selective;
  static const ch09::OffloadedActivations offload;
  return {&full, &selective, &offload, &ch09::checkpoint_every};
}

}  // namespace dtp::strategies
