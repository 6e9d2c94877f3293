// dtp-bench-collectives' flags, parsed with dtp::cli (CLI11): a bad value
// exits 2 naming the flag, as in every DTP program.
#include "options.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "collective_table.h"
#include "dtp_cli.h"

namespace dtp::bench::collectives {
namespace {

/// "32M" -> 33554432: K, M, G are powers of 1024 (nccl-tests' convention).
std::int64_t parse_bytes(const std::string& text) {
  // The number is the text before the suffix, in decimal ("1.5K" is 1536).
  const std::size_t number_end = text.find_first_not_of("0123456789.eE+-");
  const std::string number = text.substr(0, number_end);
  const std::optional<double> value = dtp::cli::parse_real_text(number);
  if (!value || *value < 0)
    throw CLI::ValidationError("expected a size in bytes such as 4096, 64K, 32M or 1G, got '" +
                               text + "'");
  const std::string suffix = number_end == std::string::npos ? "" : text.substr(number_end);
  double scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB")
    scale = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MB" || suffix == "MiB")
    scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GB" || suffix == "GiB")
    scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() && suffix != "B")
    throw CLI::ValidationError("unknown size suffix in '" + text +
                               "': use K, M or G (powers of 1024)");
  const double bytes = *value * scale;
  if (bytes > 1e15) throw CLI::ValidationError("'" + text + "' is more than a petabyte");
  if (bytes != std::floor(bytes))
    throw CLI::ValidationError("'" + text + "' is " + std::to_string(bytes) +
                               " bytes: a size is a whole number of bytes");
  return static_cast<std::int64_t>(bytes);
}

/// Reads a comma list against the accepted names ("all": every one).
std::vector<std::string> parse_names(const std::string& text,
                                     const std::vector<std::string>& accepted, const char* what) {
  if (text == "all") return accepted;
  std::vector<std::string> names = split_list(text);
  std::string expected;
  for (const std::string& a : accepted) expected += (expected.empty() ? "" : ", ") + a;
  if (names.empty())
    throw CLI::ValidationError(std::string("expected ") + what + ": " + expected + " or all");
  for (const std::string& name : names)
    if (std::find(accepted.begin(), accepted.end(), name) == accepted.end())
      throw CLI::ValidationError(std::string("unknown ") + what + " '" + name + "': expected " +
                                 expected + ", a comma list of them, or all");
  return names;
}

std::vector<dtp::ReduceOp> parse_redops(const std::string& text) {
  if (text == "prod" || text == "mulsum")
    throw CLI::ValidationError("nccl-tests' '" + text +
                               "' has no counterpart: DTP's Comm reduces with sum, avg, "
                               "max or min");
  std::vector<dtp::ReduceOp> ops;
  for (const std::string& name : parse_names(text, {"sum", "avg", "max", "min"}, "reduction"))
    ops.push_back(name == "sum"   ? dtp::ReduceOp::sum
                  : name == "avg" ? dtp::ReduceOp::avg
                  : name == "max" ? dtp::ReduceOp::max
                                  : dtp::ReduceOp::min);
  return ops;
}

}  // namespace

std::optional<int> parse_options(Options& o, int argc, char** argv) {
  CLI::App app{
      "Measures collectives the way nccl-tests does (algbw, busbw, #wrong), next to the memory "
      "roofline of the same machine measured in the same run and the alpha-beta model of chapter "
      "01. "
      "The backend and device come from DTP_BACKEND (thread, mpi, nccl) and DTP_DEVICE (cpu, "
      "cuda).",
      "dtp-bench-collectives"};
  // A value callback whose errors name the flag.
  auto named = [](const char* flag, std::function<void(const std::string&)> set) {
    return [flag, set](const std::string& text) {
      try {
        set(text);
      } catch (const CLI::ValidationError& e) {
        throw CLI::ValidationError(flag, e.what());
      }
    };
  };
  auto bytes = [&named](const char* flag, std::int64_t& field) {
    return named(flag, [&field](const std::string& text) { field = parse_bytes(text); });
  };
  app.add_option_function<std::string>("-b,--minbytes", bytes("-b", o.min_bytes),
                                       "smallest size S [32M]")
      ->type_name("SIZE");
  app.add_option_function<std::string>("-e,--maxbytes", bytes("-e", o.max_bytes),
                                       "largest size S [32M]")
      ->type_name("SIZE");
  app.add_option("-f,--stepfactor", o.factor, "next size = size x F")
      ->check(dtp::cli::Range(1.0, 1024.0))
      ->capture_default_str();
  app.add_option_function<std::string>("-i,--stepbytes", bytes("-i", o.step_bytes),
                                       "next size = size + N bytes (instead of -f)")
      ->type_name("SIZE");
  app.add_option("-n,--iters", o.iters, "timed calls per measurement")
      ->check(dtp::cli::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters,--warmup", o.warmup, "untimed calls before them")
      ->check(dtp::cli::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("-c,--check", o.check_iters,
                 "checked calls after the timed ones, on values that make every mistake visible "
                 "(#wrong); 0: none")
      ->check(dtp::cli::Range(0, 1000))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "-d,--datatype,--dtype",
         named("-d",
               [&o](const std::string& text) {
                 if (text == "float" || text == "f32")
                   o.dtype = dtp::DType::f32;
                 else if (text == "double" || text == "f64")
                   o.dtype = dtp::DType::f64;
                 else
                   throw CLI::ValidationError("expected float (f32) or double (f64), got '" + text +
                                              "'");
               }),
         "float (f32) or double (f64) [float]")
      ->type_name("TYPE");
  app.add_option_function<std::string>(
         "-o,--op", named("-o", [&o](const std::string& text) { o.redops = parse_redops(text); }),
         "the reduction of all_reduce, reduce_scatter and reduce: sum, avg, max, min, a comma "
         "list, or all [sum]")
      ->type_name("REDOP");
  app.add_option_function<std::string>("--collective,--op-kind",
                                       named("--collective",
                                             [&o](const std::string& text) {
                                               o.ops = parse_names(text, collective_names(),
                                                                   "collective");
                                             }),
                                       "all_reduce, all_gather, reduce_scatter, broadcast, reduce, "
                                       "all_to_all, sendrecv, a comma list, or all "
                                       "[all_reduce] (nccl-tests has one program per collective)")
      ->type_name("LIST");
  app.add_option_function<std::string>(
         "--impl",
         named("--impl",
               [&o](const std::string& text) {
                 o.impls = text == "all"
                               ? std::vector<std::string>{}
                               : parse_names(text, implementation_names(), "implementation");
               }),
         "library, ring, tree, halving_doubling, direct, parameter_server, pairwise, native, a "
         "comma list, "
         "or all "
         "[every one that applies to the collective]")
      ->type_name("LIST");
  app.add_option_function<int>(
         "-g,--ngpus,--world",
         [&o](int n) {
           o.world = n;
           o.world_given = true;
         },
         "ranks in this process: the thread backend's world [4]; under mpi and nccl the first N "
         "ranks of the "
         "launcher's (nccl-tests: GPUs per thread)")
      ->check(dtp::cli::Range(1, 1024));
  app.add_option("-r,--root", o.root, "root of broadcast and reduce")
      ->check(dtp::cli::Range(0, 1023))
      ->capture_default_str();
  app.add_option_function<int>(
         "-a,--average", [&o](int mode) { o.average = static_cast<Average>(mode); },
         "the time of a measurement from the ranks' times: 0 rank 0's, 1 the mean, 2 the fastest, "
         "3 the slowest [1]")
      ->check(dtp::cli::Range(0, 3));
  app.add_option("--json", o.json_path, "append one JSON object per measurement to FILE")
      ->type_name("FILE");
  app.add_option("--alpha-us", o.alpha_us,
                 "alpha-beta model: the cost of one message, microseconds")
      ->check(dtp::cli::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--beta-GBps", o.beta_GBps,
                 "alpha-beta model: per-rank bandwidth in GB/s [0: the per-rank copy rate measured "
                 "at each size]")
      ->check(dtp::cli::Range(0.0, 1e6));
  app.footer(
      "Sizes: K, M and G are powers of 1024. GB/s are 10^9 bytes per second, as in nccl-tests.\n"
      "Exit status: 0 measured, 1 a check found a wrong element or the run failed, 2 a bad command "
      "line.");
  if (auto status = dtp::cli::parse(app, argc, argv)) return status;
  auto refuse = [](const std::string& why) {
    std::fprintf(stderr, "dtp-bench-collectives: error: %s (see --help)\n", why.c_str());
    return std::optional<int>(2);
  };
  if (o.min_bytes < 1 || o.max_bytes < o.min_bytes)
    return refuse("sizes: need 1 <= -b <= -e, got -b " + std::to_string(o.min_bytes) + " -e " +
                  std::to_string(o.max_bytes));
  if (o.step_bytes == 0 && o.factor <= 1 && o.min_bytes != o.max_bytes)
    return refuse("sizes: -f must be above 1 (or give -i) to go from -b to -e");
  if (o.world_given && o.root >= o.world)  // -g is the world, or the most ranks it uses
    return refuse("-r " + std::to_string(o.root) + " is outside the world of -g " +
                  std::to_string(o.world) + " ranks");
  return std::nullopt;
}

std::vector<std::int64_t> sizes(const Options& o) {
  std::vector<std::int64_t> out;
  for (double size = static_cast<double>(o.min_bytes); size <= static_cast<double>(o.max_bytes);) {
    std::int64_t bytes = static_cast<std::int64_t>(size);
    if (out.empty() || bytes != out.back()) out.push_back(bytes);
    if (o.min_bytes == o.max_bytes) break;
    size = o.step_bytes > 0 ? size + static_cast<double>(o.step_bytes) : size * o.factor;
  }
  return out;
}

}  // namespace dtp::bench::collectives
