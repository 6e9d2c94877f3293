// Schedules as data: names, the empty schedule the puzzles fill, the costs
// of an action, the schedule kinds and their bubble formulas. Provided code,
// not a puzzle (see drivers/README.md).
#include <algorithm>
#include <cmath>

#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {

const char* action_letter(ActionKind kind) {
  switch (kind) {
    case ActionKind::forward:
      return "F";
    case ActionKind::backward:
      return "B";
    case ActionKind::weight:
      return "W";
  }
  return "?";
}

std::string action_name(const Action& action, int chunks) {
  std::string name = action_letter(action.kind) + std::to_string(action.microbatch);
  if (chunks > 1 || action.chunk != 0) name += "c" + std::to_string(action.chunk);
  return name;
}

Schedule empty_schedule(const std::string& name, int stages, int microbatches, int chunks,
                        bool split_backward) {
  DTP_CHECK(stages >= 1, name, " schedule: stages (p) must be at least 1, got ", stages);
  DTP_CHECK(microbatches >= 1, name, " schedule: micro-batches (m) must be at least 1, got ",
            microbatches);
  DTP_CHECK(chunks >= 1, name, " schedule: chunks per rank (v) must be at least 1, got ", chunks);
  Schedule schedule;
  schedule.name = name;
  schedule.stages = stages;
  schedule.microbatches = microbatches;
  schedule.chunks = chunks;
  schedule.split_backward = split_backward;
  schedule.actions.assign(static_cast<std::size_t>(stages), {});
  return schedule;
}

double ActionCosts::of(ActionKind kind, bool split_backward) const {
  switch (kind) {
    case ActionKind::forward:
      return forward;
    case ActionKind::backward:
      return split_backward ? backward_input : backward;
    case ActionKind::weight:
      return backward_weight;
  }
  return 0;
}

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::afab:
      return "afab";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved";
    case ScheduleKind::zb_h1:
      return "zb-h1";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  for (ScheduleKind kind : {ScheduleKind::afab, ScheduleKind::one_f_one_b,
                            ScheduleKind::interleaved, ScheduleKind::zb_h1})
    if (name == schedule_kind_name(kind)) return kind;
  throw Error("unknown schedule '" + name + "'; accepted: afab, 1f1b, interleaved, zb-h1");
}

Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int chunks) {
  switch (kind) {
    case ScheduleKind::afab:
      return afab_schedule(stages, microbatches);
    case ScheduleKind::one_f_one_b:
      return one_f_one_b_schedule(stages, microbatches);
    case ScheduleKind::interleaved:
      return interleaved_schedule(stages, microbatches, chunks);
    case ScheduleKind::zb_h1:
      return zb_h1_schedule(stages, microbatches);
  }
  throw Error("make_schedule: unknown kind");
}

double bubble_formula(ScheduleKind kind, int stages, int microbatches, int chunks) {
  const double p = stages, m = microbatches, v = chunks;
  switch (kind) {
    case ScheduleKind::afab:
    case ScheduleKind::one_f_one_b:
      return (p - 1) / (m + p - 1);
    case ScheduleKind::interleaved:
      return (p - 1) / (v * m + p - 1);
    case ScheduleKind::zb_h1: {
      // Idle per rank, in units of F = B = W: p - 1, plus p - m more when
      // there are too few micro-batches to fill the warm-up.
      const double idle = (p - 1) + std::max(0.0, p - m);
      return idle / (3 * m + idle);
    }
  }
  return 0;
}

int pipeline_tag(bool gradient, int microbatch, int sender) {
  DTP_CHECK(microbatch >= 0 && microbatch < kMaxMicrobatches, "pipeline_tag: micro-batch ",
            microbatch, " is outside [0, ", kMaxMicrobatches, ")");
  DTP_CHECK(sender >= 0 && sender < kMaxVirtualStages, "pipeline_tag: virtual stage ", sender,
            " is outside [0, ", kMaxVirtualStages, ")");
  return (sender * kMaxMicrobatches + microbatch) * 2 + (gradient ? 1 : 0);
}

std::string describe_pipeline_tag(int tag) {
  if (tag < 0 || tag >= 2 * kMaxVirtualStages * kMaxMicrobatches) return "not a pipeline tag";
  const bool gradient = tag % 2 == 1;
  const int packed = tag / 2, sender = packed / kMaxMicrobatches,
            microbatch = packed % kMaxMicrobatches;
  if (gradient && sender == 0)
    return "not a tag of a pipeline message (it would be an input gradient sent back by virtual "
           "stage 0, "
           "which has no stage before it)";
  return std::string(gradient ? "the input gradient" : "the activation") + " of micro-batch " +
         std::to_string(microbatch) + " sent by virtual stage " + std::to_string(sender) +
         (gradient ? " back to " : " on to ") + "virtual stage " +
         std::to_string(gradient ? sender - 1 : sender + 1);
}

}  // namespace dtp::ch05
