// dtp-train's command line: its own flags (the run, checkpoints, the model,
// the optimizer) and every registered strategy's (drivers/strategy.h), one
// parser for all, and the checks between them. Every error is a
// cli::UsageError that names the flag and what it accepts; main() prints it
// and exits with status 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "drivers/strategy.h"
#include "dtp/trainer.h"
#include "flag_group.h"

namespace dtp::train_app {

using cli::UsageError;

/// Everything the command line sets.
struct Options {
  TrainConfig config;
  std::int64_t log_every = 0;  ///< 0: about ten lines per run
  std::string impl;            ///< "puzzles", "reference" or "" (this binary's)
  /// The strategy the run trains with (--strategy, or a flag that chooses
  /// one); its own flags are set in it.
  drivers::Strategy* strategy = nullptr;
  std::vector<cli::GivenFlag> given;  ///< every flag given, in order
};

/// The --help text, generated from dtp-train's flags and every registered
/// strategy's.
std::string usage();

/// Parses argv: sets dtp-train's flags, chooses the strategy and sets its
/// flags (a flag of another strategy is an error naming the strategies that
/// take it). Throws UsageError. Prints --help and exits on -h/--help.
Options parse_arguments(int argc, char** argv);

/// Checks the settings between flags (once the strategy has resolved its
/// own, join_processes): the strategy's own checks, the model, the data
/// file, the checkpoint files and the outputs (no file both read and
/// written), the environment. Throws UsageError.
void check_options(const Options& options);

/// The value of "--flag VALUE" or "--flag=VALUE" in argv, or "" (a quick look
/// for --impl before anything else runs).
std::string find_flag(int argc, char** argv, const std::string& flag);

/// The run's files, before it starts: --data readable and long enough,
/// --resume and --load regular files, --save's folder writable, and no file
/// both read and written or written twice (apps/train/files.cpp). Throws
/// UsageError.
void check_files(const Options& options);
/// Creates --trace and --json now (appending), so that a path that cannot be
/// written fails before the run. Throws UsageError.
void check_outputs_writable(const Options& options);

}  // namespace dtp::train_app
