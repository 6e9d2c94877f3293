// dtp-train: train the small GPT, on one device or with a chapter's
// strategy; shows progress, a per-rank table after each kept step, and a
// summary. `dtp-train --help` lists every strategy and flag.
//   dtp train --steps 300 --batch 16 --seq 64 [--data FILE] [--trace t.json] [--json log.jsonl]
//   dtp train --strategy ddp --world 4 [--impl puzzles|reference]
//   dtp train --strategy pp --pp 4 --microbatches 8 --schedule 1f1b
// Built twice from this source (apps/CMakeLists.txt): bin/dtp-train runs the
// puzzles, bin/dtp-train-reference the reference. The strategies are
// registered in drivers/CMakeLists.txt; this file knows none by name.
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>

#include "drivers/checkpointing.h"
#include "drivers/strategy.h"
#include "dtp/error.h"
#include "dtp/fault.h"
#include "dtp/launch.h"
#include "dtp/train_run.h"
#include "train/options.h"
#include "train/processes.h"
#include "train/progress.h"

namespace {

using namespace dtp::train_app;

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnsolved = 3;

// "puzzle 2.2 flat_ddp is not solved yet" when the run stopped at a stub.
// A rank's NotSolved reaches here wrapped in RankFailure; on other MPI
// processes only its message arrives.
std::string unsolved_puzzle(const std::exception& error) {
  const std::exception* original = &error;
  if (const auto* failure = dynamic_cast<const dtp::RankFailure*>(&error)) {
    try {
      std::rethrow_exception(failure->original());
    } catch (const std::exception& e) {
      original = &e;
      if (dynamic_cast<const dtp::NotSolved*>(original)) return e.what();
    } catch (...) {
    }
  }
  if (dynamic_cast<const dtp::NotSolved*>(original)) return original->what();
  const std::string text = error.what();
  const auto at = text.find("puzzle ");
  const auto end = text.find(" is not solved yet");
  if (at != std::string::npos && end != std::string::npos && end > at)
    return text.substr(at, end - at) + " is not solved yet";
  return "";
}

// What the run reads and writes beside the data: which steps it trains.
std::string checkpoint_line(const Options& o) {
  const dtp::TrainConfig& config = o.config;
  std::string text;
  auto add = [&text](const std::string& part) { text += (text.empty() ? "" : "; ") + part; };
  if (!config.load_path.empty())
    add("starting from " + config.load_path + "'s parameters (" + o.strategy->load_note() + ")");
  if (!config.resume_path.empty())
    add("continuing " + config.resume_path + " from the step it saved (its settings checked)");
  if (config.stop_after > 0)
    add("stopping after step " + std::to_string(config.stop_after) + " of " +
        std::to_string(config.steps));
  if (!config.save_path.empty()) {
    const std::string note = o.strategy->save_note();
    add("saving to " + config.save_path + " at the end" + (note.empty() ? "" : " (" + note + ")"));
  }
  return text;
}

void print_header(const Options& o, const ProcessRole& role) {
  const dtp::TrainConfig& config = o.config;
  const dtp::GPTConfig model = config.resolved_model();
  const bool has_puzzles = !o.strategy->chapter().empty();
  const std::string impl = this_impl();
  std::printf(
      "dtp train: strategy %s, %s%s\n", o.strategy->name().c_str(), model.device.str().c_str(),
      has_puzzles ? (", " + impl + (impl == "puzzles" ? " (your code in puzzles/)" : "")).c_str()
                  : "");
  const std::string strategy = o.strategy->header(config, role.mpi ? "mpi" : "thread");
  if (!strategy.empty()) std::printf("%s\n", strategy.c_str());
  std::printf("model: %s (%lld parameters)\n", model.describe().c_str(),
              static_cast<long long>(model.parameter_count()));
  const std::string checkpointing =
      dtp::drivers::checkpoint_header(config.checkpoint, model.layers);
  if (!checkpointing.empty()) std::printf("%s\n", checkpointing.c_str());
  std::printf("data: %s; batch %lld x seq %lld = %lld tokens per step\n",
              config.data_path.empty() ? "synthetic phrases" : config.data_path.c_str(),
              static_cast<long long>(config.batch), static_cast<long long>(config.seq),
              static_cast<long long>(config.batch * config.seq));
  std::printf("optimizer: %s, lr %.2e, warm-up %lld steps, cosine to %.2e, clip %.2f, seed %llu\n",
              config.optimizer.c_str(), config.lr, static_cast<long long>(config.warmup),
              config.lr * config.min_lr_ratio, config.grad_clip,
              static_cast<unsigned long long>(config.seed));
  const std::vector<dtp::fault::Fault> faults = dtp::fault::plan();
  if (!faults.empty())
    std::printf("faults: %s (DTP_FAULT: each fires once, at the start of its step)\n",
                dtp::fault::plan_text(faults).c_str());
  const std::string checkpoint = checkpoint_line(o);
  if (!checkpoint.empty()) std::printf("checkpoint: %s\n", checkpoint.c_str());
  std::fflush(stdout);
}

// A kept step's report: the per-rank table, the strategy's lines, and what
// it prints once per run.
void print_report(const dtp::drivers::StepReport& report, std::set<std::string>& printed_once) {
  std::fputs(report.ranks.str().c_str(), stdout);
  for (const std::string& line : report.lines) std::printf("    %s\n", line.c_str());
  if (!report.once.empty() && printed_once.insert(report.once).second)
    std::fputs(report.once.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  ProcessRole role;
  try {
    // Before anything else: --impl may name the sibling binary.
    run_impl(find_flag(argc, argv, "--impl"), argv);
    options = parse_arguments(argc, argv);
    // The log's config line records how to run this again.
    options.config.command_line.assign(argv, argv + argc);
    options.config.git_revision = DTP_GIT_REV;
    role = join_processes(options);
    if (role.reports) check_options(options);
    (void)dtp::fault::plan();  // DTP_FAULT, read and checked before the run
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-train: error: %s\n", e.what());
    return kExitUsage;
  }

  const dtp::TrainConfig& config = options.config;
  Progress progress(config.steps, options.log_every, role.reports && isatty(STDOUT_FILENO));
  std::set<std::string> printed_once;
  try {
    if (role.reports) print_header(options, role);
    dtp::TrainResult result;
    try {
      result = dtp::drivers::run_strategy(config, *options.strategy,
                                          [&](const dtp::drivers::StepReport& report) {
                                            if (!role.reports) return;
                                            progress.show(report.record);
                                            if (progress.keeps(report.record.step))
                                              print_report(report, printed_once);
                                          });
    } catch (const std::exception&) {
      // A failed run keeps its trace too, every process's part of it.
      try {
        merge_trace_parts(config.trace_path, role);
      } catch (const std::exception&) {
      }
      throw;
    }
    merge_trace_parts(config.trace_path, role);
    if (role.reports) {
      std::printf("%s\n", dtp::format_summary(result).c_str());
      if (!config.trace_path.empty()) std::printf("trace: %s\n", config.trace_path.c_str());
      if (!config.json_path.empty()) std::printf("log: %s\n", config.json_path.c_str());
    }
  } catch (const std::exception& e) {
    progress.break_line();
    const std::string puzzle = unsolved_puzzle(e);
    if (!role.reports) return puzzle.empty() ? kExitFailed : kExitUnsolved;
    if (!puzzle.empty()) {
      // The run stopped at the first stub it called; name the first in the chapter's order.
      const std::string first = dtp::drivers::first_unsolved(*options.strategy, config, puzzle);
      std::fprintf(stderr, "dtp-train: %s; `--impl reference` runs the reference\n", first.c_str());
      return kExitUnsolved;
    }
    std::fprintf(stderr, "dtp-train: error: %s\n", e.what());
    return kExitFailed;
  }
  return 0;
}
