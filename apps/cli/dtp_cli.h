// One command-line parser for every DTP program (apps/ and bench/): CLI11,
// used the same way everywhere. -h/--help prints the usage and exits 0
// before anything runs; an unknown flag, a stray argument, a flag given
// twice or a value that does not convert or is out of range is an error that
// names the flag and exits 2.
//
//   CLI::App app{"what the program does", "dtp-bench-ddp-step"};
//   app.add_option("--world", world, "ranks")->check(dtp::cli::Range(1, 1024));
//   if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "dtp/device.h"
#include "number_text.h"

namespace dtp::cli {

/// CLI::Range made strict: the value must be all of its text, in decimal,
/// and finite (CLI11's own conversion takes "0x10" and " 4" as integers and
/// "nan" as a number, and nan passes CLI::Range because every comparison
/// with it is false). Integer bounds make an integer option ("expects an
/// integer in [1, 64], got '4abc'"); floating-point bounds a number one.
class Range : public CLI::Validator {
 public:
  template <typename T>
  Range(T low, T high)
      : Range(static_cast<long double>(low), static_cast<long double>(high),
              std::is_integral_v<T>) {}

 private:
  Range(long double low, long double high, bool integer);
};

/// Parses @p argv into @p app. Returns the exit status when the program must
/// stop now: 0 after --help (the usage is on stdout), 2 after a bad command
/// line ("PROGRAM: error: MESSAGE (see --help)" on stderr). std::nullopt:
/// the options are set, go on. Every INT, UINT or FLOAT option gets the
/// strict syntax of Range (whole text, decimal, finite) if it has no Range.
std::optional<int> parse(CLI::App& app, int argc, char** argv);

/// A model's --d-model and --heads (the variables they set): after parsing,
/// a width that the heads do not divide is a bad command line, said before
/// the model is built. Takes the app's one final callback.
void require_heads_divide_width(CLI::App& app, const int& d_model, const int& heads);

/// CLI11's message for @p error, in DTP's words where CLI11's mislead ("At
/// Most 1 required but received 2" for a flag given twice).
std::string error_text(const CLI::ParseError& error);

/// A --device option ("cpu", "cuda" or "cuda:k") read by dtp::parse_device,
/// whose error it reports.
CLI::Option* add_device_option(CLI::App& app, Device& device,
                               const std::string& help = "cpu or cuda[:k]");

/// A comma-list option ("--worlds 1,2,4") read into @p values, shown in the
/// help as @p items ("N,..."). The caller adds its check (each item is
/// checked), and capture_default_str() or expected(n) where they apply.
template <typename T>
CLI::Option* add_list_option(CLI::App& app, const std::string& name, std::vector<T>& values,
                             const std::string& help, const std::string& items) {
  return app.add_option(name, values, help)
      ->delimiter(',')
      ->allow_extra_args(false)
      ->type_name(items);
}

}  // namespace dtp::cli
