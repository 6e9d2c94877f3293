// One command-line parser for every DTP program (apps/ and bench/): CLI11,
// used the same way everywhere. -h/--help prints the usage and exits 0
// before anything runs; an unknown flag, a stray argument or a value that
// does not convert or is out of range is an error that names the flag and
// exits 2.
//
//   CLI::App app{"what the program does", "dtp-bench-ddp-step"};
//   app.add_option("--world", world, "ranks")->check(CLI::Range(1, 1024));
//   if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "dtp/device.h"

namespace dtp::cli {

/// Parses @p argv into @p app. Returns the exit status when the program must
/// stop now: 0 after --help (the usage is on stdout), 2 after a bad command
/// line ("PROGRAM: error: MESSAGE (see --help)" on stderr). std::nullopt:
/// the options are set, go on.
std::optional<int> parse(CLI::App& app, int argc, char** argv);

/// A --device option ("cpu", "cuda" or "cuda:k") read by dtp::parse_device,
/// whose error it reports.
CLI::Option* add_device_option(CLI::App& app, Device& device, const std::string& help = "cpu or cuda[:k]");

/// A comma-list option ("--worlds 1,2,4") read into @p values, shown in the
/// help as @p items ("N,..."). The caller adds its check (each item is
/// checked), and capture_default_str() or expected(n) where they apply.
template <typename T>
CLI::Option* add_list_option(CLI::App& app, const std::string& name, std::vector<T>& values, const std::string& help,
                             const std::string& items) {
  return app.add_option(name, values, help)->delimiter(',')->allow_extra_args(false)->type_name(items);
}

}  // namespace dtp::cli
