// dtp-schedule: draw a pipeline schedule without training.
//   dtp schedule --kind 1f1b --stages 4 --microbatches 8 [--chunks 2] [--costs 1,2,1]
//                [--impl puzzles|reference]
// Builds the schedule (your puzzles 5.3-5.6 in bin/dtp-schedule, the
// reference in bin/dtp-schedule-reference), runs the verifier and prints the
// ASCII Gantt chart, the bubble against the lesson's formula and the peak
// micro-batches alive per rank. A schedule the verifier rejects is printed
// with its problem (exit 1).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "05_pipeline/pipeline.h"
#include "dtp_cli.h"

namespace dtp::schedule_app {
/// "puzzles" or "reference": the library this binary is linked with (schedule/impl.cpp).
const char* this_impl();
}  // namespace dtp::schedule_app

namespace {

constexpr int kExitFailed = 1, kExitUsage = 2, kExitUnsolved = 3;

// "F,B,W" into @p costs: F > 0, W > 0 and B > W (B is the whole backward).
// Each cost is in [0.01, 100] and at most 100 times the smallest (F, W and
// B - W): the chart's column is the smallest cost, so this bounds its width.
void parse_costs(const std::string& text, dtp::ch05::ActionCosts& costs) {
  auto bad = [&text](const std::string& why) {
    return CLI::ValidationError(
        "--costs", "expects F,B,W, three decimal numbers in [0.01, 100] with W < B " +
                       std::string("(B is the whole backward)") + why + ", got '" + text + "'");
  };
  double value[3];
  std::size_t from = 0;
  for (int i = 0; i < 3; ++i) {
    const std::size_t comma = i < 2 ? text.find(',', from) : text.size();
    if (comma == std::string::npos) throw bad("");
    const std::optional<double> number = dtp::cli::parse_real_text(text.substr(from, comma - from));
    if (!number || *number < 0.01 || *number > 100) throw bad("");
    value[i] = *number;
    from = comma + 1;
  }
  const double f = value[0], b = value[1], w = value[2];
  if (!(b > w)) throw bad("");
  const double smallest = std::min({f, w, b - w}), largest = std::max({f, b, w});
  if (largest > 100 * smallest)
    throw bad(" and the largest of F, B, W at most 100 times the smallest of F, W, B - W");
  costs = {f, b, b - w, w};
}

// The chart's time unit: one column per unit cost, or per the smallest
// action where that is shorter (so that no action is narrower than a column).
double chart_unit(const dtp::ch05::ActionCosts& costs) {
  return std::min({1.0, costs.forward, costs.backward_input, costs.backward_weight});
}

// This program's own path (not argv[0], which holds no folder when it was
// found through PATH).
std::string own_path() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace

int main(int argc, char** argv) {
  std::string kind_name, impl = "puzzles";
  int stages = 0, microbatches = 0, chunks = 2;
  dtp::ch05::ActionCosts costs;
  const std::string name =
      std::string("dtp-schedule") +
      (std::string(dtp::schedule_app::this_impl()) == "reference" ? "-reference" : "");
  CLI::App app{
      "Builds a pipeline schedule (chapter 05), checks it with the verifier, and prints its Gantt "
      "chart "
      "(one row per rank, one column per unit of time), its bubble next to the lesson's formula "
      "and the "
      "micro-batches each rank holds at most. --kind, --stages and --microbatches are required.",
      name};
  app.add_option("--kind", kind_name, "the schedule")
      ->check(CLI::IsMember({"afab", "1f1b", "interleaved", "zb-h1"}))
      ->type_name("KIND");
  app.add_option("--stages", stages, "pipeline ranks p")
      ->check(dtp::cli::Range(1, 64))
      ->type_name("P");
  app.add_option("--microbatches", microbatches, "micro-batches per step m")
      ->check(dtp::cli::Range(1, 512))
      ->type_name("M");
  app.add_option("--chunks", chunks, "model chunks per rank v (interleaved)")
      ->check(dtp::cli::Range(2, 16))
      ->type_name("V")
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--costs", [&costs](const std::string& text) { parse_costs(text, costs); },
         "clock cost of a forward, a whole backward and (zb-h1) each half; default 1,2,1 (a split "
         "B costs B - W)")
      ->type_name("F,B,W");
  app.add_option("--impl", impl,
                 "whose schedules: yours in puzzles/ (bin/dtp-schedule) or the reference "
                 "(bin/dtp-schedule-reference)")
      ->check(CLI::IsMember({"puzzles", "reference"}))
      ->capture_default_str();
  app.footer(
      "Exit status: 0 drawn; 1 the verifier rejected the schedule; 2 a bad command line; 3 the "
      "schedule's "
      "puzzle is not solved yet.\nExample: dtp schedule --kind 1f1b --stages 4 --microbatches 8");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  for (const char* flag : {"--kind", "--stages", "--microbatches"})
    if (app.count(flag) == 0) {
      std::fprintf(
          stderr,
          "%s: error: missing %s: --kind, --stages and --microbatches are required (see --help)\n",
          name.c_str(), flag);
      return kExitUsage;
    }
  if (app.count("--chunks") > 0 && kind_name != "interleaved") {
    std::fprintf(
        stderr,
        "%s: error: --chunks sets v of --kind interleaved; --kind %s has one chunk per rank\n",
        name.c_str(), kind_name.c_str());
    return kExitUsage;
  }
  if (impl == "puzzles" && app.count("--impl") > 0 &&
      std::string(dtp::schedule_app::this_impl()) == "reference") {
    std::fprintf(
        stderr,
        "%s: error: --impl puzzles: this program draws the reference; dtp-schedule draws yours\n",
        name.c_str());
    return kExitUsage;
  }
  if (impl == "reference" && std::string(dtp::schedule_app::this_impl()) != "reference") {
    // The other library's schedules live in the sibling binary.
    const std::string self = own_path();
    const std::string sibling = self.substr(0, self.rfind('/') + 1) + "dtp-schedule-reference";
    execv(sibling.c_str(), argv);
    std::fprintf(stderr, "%s: error: cannot start %s: %s\n", name.c_str(), sibling.c_str(),
                 std::strerror(errno));
    return kExitUsage;
  }
  try {
    const dtp::ch05::ScheduleKind kind = dtp::ch05::parse_schedule_kind(kind_name);
    const dtp::ch05::Schedule schedule =
        dtp::ch05::make_schedule(kind, stages, microbatches, chunks);
    const dtp::ch05::ScheduleReport report = dtp::ch05::simulate_schedule(schedule, costs);
    char weight[32];
    std::snprintf(weight, sizeof weight, "%g", costs.backward_weight);
    std::printf("%s schedule, p %d, m %d%s (%s), costs F %g, B %g%s\n", schedule.name.c_str(),
                stages, microbatches,
                schedule.chunks > 1 ? (", v " + std::to_string(schedule.chunks)).c_str() : "",
                dtp::schedule_app::this_impl(), costs.forward,
                schedule.split_backward ? costs.backward_input : costs.backward,
                schedule.split_backward ? (", W " + std::string(weight)).c_str() : "");
    if (!report.ok()) {
      std::printf("the verifier rejects it: %s\n", report.problem.c_str());
      return kExitFailed;
    }
    std::printf("%s", dtp::ch05::gantt_chart(schedule, report, chart_unit(costs)).c_str());
    const bool unit_costs = costs.forward == 1 && costs.backward == 2 &&
                            costs.backward_input == 1 && costs.backward_weight == 1;
    const char* formula = kind == dtp::ch05::ScheduleKind::interleaved ? "(p-1)/(v m+p-1)"
                          : kind == dtp::ch05::ScheduleKind::zb_h1
                              ? "((p-1)+max(0,p-m))/(3m+(p-1)+max(0,p-m))"
                              : "(p-1)/(m+p-1)";
    if (unit_costs)
      std::printf("lesson: bubble %s = %.1f%%\n", formula,
                  100.0 * dtp::ch05::bubble_formula(kind, stages, microbatches, chunks));
    else
      std::printf(
          "lesson: the formula %s assumes the unit costs (--costs 1,2,1); the chart above is the "
          "verifier's "
          "run with yours\n",
          formula);
  } catch (const dtp::NotSolved& e) {
    std::fprintf(stderr, "%s: %s; `--impl reference` draws the reference\n", name.c_str(),
                 e.what());
    return kExitUnsolved;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), e.what());
    return kExitFailed;
  }
  return 0;
}
