// dtp-schedule: draw a pipeline schedule without training.
//   dtp schedule --kind 1f1b --stages 4 --microbatches 8 [--chunks 2] [--impl puzzles|reference]
// Builds the schedule (your puzzles 5.3-5.6 in bin/dtp-schedule, the
// reference in bin/dtp-schedule-reference), runs the verifier and prints the
// ASCII Gantt chart, the bubble against the lesson's formula and the peak
// micro-batches alive per rank. A schedule the verifier rejects is printed
// with its problem (exit 1).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "05_pipeline/pipeline.h"

namespace {

constexpr int kExitFailed = 1, kExitUsage = 2, kExitUnsolved = 3;

const char* const kUsage = R"(Usage: dtp schedule --kind KIND --stages P --microbatches M [OPTIONS]

Builds a pipeline schedule, checks it with the verifier, and prints its Gantt
chart (one row per rank, one column per unit of time), its bubble next to the
lesson's formula and the micro-batches each rank holds at most.

  --kind KIND             afab, 1f1b, interleaved or zb-h1
  --stages P              pipeline ranks, 1 to 64
  --microbatches M        micro-batches per step, 1 to 512
  --chunks V              model chunks per rank (interleaved), 2 to 16 (default 2)
  --costs F,B,W           clock cost of a forward, a whole backward and (zb-h1)
                          each half; default 1,2,1 (a split B costs B - W)
  --impl puzzles|reference
                          whose schedules: yours in puzzles/ (default) or the reference
  -h, --help              this text

Exit status: 0 drawn; 1 the verifier rejected the schedule; 2 a bad command
line; 3 the schedule's puzzle is not solved yet.
)";

int parse_int(const std::string& flag, const std::string& text, int low, int high) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < low || value > high)
    throw dtp::Error(flag + " expects an integer in [" + std::to_string(low) + ", " + std::to_string(high) +
                     "], got '" + text + "'");
  return static_cast<int>(value);
}

}  // namespace

int main(int argc, char** argv) {
  std::string kind_name, impl;
  int stages = 0, microbatches = 0, chunks = 2;
  dtp::ch05::ActionCosts costs;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "-h" || flag == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (i + 1 >= argc) throw dtp::Error(flag + " needs a value (see --help)");
      const std::string value = argv[++i];
      if (flag == "--kind") kind_name = value;
      else if (flag == "--stages") stages = parse_int(flag, value, 1, 64);
      else if (flag == "--microbatches") microbatches = parse_int(flag, value, 1, 512);
      else if (flag == "--chunks") chunks = parse_int(flag, value, 2, 16);
      else if (flag == "--impl") impl = value;
      else if (flag == "--costs") {
        double f = 0, b = 0, w = 0;
        char extra = 0;
        if (std::sscanf(value.c_str(), "%lf,%lf,%lf%c", &f, &b, &w, &extra) != 3 || f <= 0 || b <= w || w <= 0)
          throw dtp::Error("--costs expects F,B,W with F > 0, W > 0 and B > W (B is the whole backward), got '" +
                           value + "'");
        costs = {f, b, b - w, w};
      } else {
        throw dtp::Error("unknown option '" + flag + "' (see --help)");
      }
    }
    if (impl == "reference" && std::string(DTP_SCHEDULE_IMPL) != "reference") {
      // The other library's schedules live in the sibling binary.
      std::string self = argv[0];
      const std::string sibling = self.substr(0, self.rfind('/') + 1) + "dtp-schedule-reference";
      execv(sibling.c_str(), argv);
      throw dtp::Error("cannot start " + sibling + ": " + std::strerror(errno));
    }
    if (!impl.empty() && impl != "puzzles" && impl != "reference")
      throw dtp::Error("--impl accepts puzzles or reference, got '" + impl + "'");
    if (kind_name.empty() || stages == 0 || microbatches == 0)
      throw dtp::Error("--kind, --stages and --microbatches are required (see --help)");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-schedule: error: %s\n", e.what());
    return kExitUsage;
  }
  try {
    const dtp::ch05::ScheduleKind kind = dtp::ch05::parse_schedule_kind(kind_name);
    const dtp::ch05::Schedule schedule = dtp::ch05::make_schedule(kind, stages, microbatches, chunks);
    const dtp::ch05::ScheduleReport report = dtp::ch05::simulate_schedule(schedule, costs);
    char weight[32];
    std::snprintf(weight, sizeof weight, "%g", costs.backward_weight);
    std::printf("%s schedule, p %d, m %d%s (%s), costs F %g, B %g%s\n", schedule.name.c_str(), stages,
                microbatches, schedule.chunks > 1 ? (", v " + std::to_string(schedule.chunks)).c_str() : "",
                DTP_SCHEDULE_IMPL, costs.forward, schedule.split_backward ? costs.backward_input : costs.backward,
                schedule.split_backward ? (", W " + std::string(weight)).c_str() : "");
    if (!report.ok()) {
      std::printf("the verifier rejects it: %s\n", report.problem.c_str());
      return kExitFailed;
    }
    std::printf("%s", dtp::ch05::gantt_chart(schedule, report).c_str());
    const bool unit_costs = costs.forward == 1 && costs.backward == 2 && costs.backward_input == 1 &&
                            costs.backward_weight == 1;
    const char* formula = kind == dtp::ch05::ScheduleKind::interleaved ? "(p-1)/(v m+p-1)"
                          : kind == dtp::ch05::ScheduleKind::zb_h1     ? "((p-1)+max(0,p-m))/(3m+(p-1)+max(0,p-m))"
                                                                       : "(p-1)/(m+p-1)";
    if (unit_costs)
      std::printf("lesson: bubble %s = %.1f%%\n", formula,
                  100.0 * dtp::ch05::bubble_formula(kind, stages, microbatches, chunks));
    else
      std::printf("lesson: the formula %s assumes the unit costs (--costs 1,2,1); the chart above is the verifier's "
                  "run with yours\n",
                  formula);
  } catch (const dtp::NotSolved& e) {
    std::fprintf(stderr, "dtp-schedule: %s; `--impl reference` draws the reference\n", e.what());
    return kExitUnsolved;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-schedule: error: %s\n", e.what());
    return kExitFailed;
  }
  return 0;
}
