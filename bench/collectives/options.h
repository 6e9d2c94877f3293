// dtp-bench-collectives' command line. The flags nccl-tests has keep its
// meanings (-b -e -f -i -n -w -c -d -o -r -g -a); what it does with one
// program per collective, --collective does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtp/dtp.h"

namespace dtp::bench::collectives {

/// nccl-tests' -a: how the ranks' times make the time of a measurement.
enum class Average { rank0 = 0, mean = 1, min = 2, max = 3 };

struct Options {
  std::int64_t min_bytes = 32 << 20;  // -b
  std::int64_t max_bytes = 32 << 20;  // -e
  double factor = 2.0;                // -f: next size = size * factor
  std::int64_t step_bytes = 0;        // -i: next size = size + step (overrides -f)
  int iters = 20;                     // -n
  int warmup = 5;                     // -w
  int check_iters = 1;                // -c: checked calls after the timed ones (0: none)
  int world = 4;                      // -g (thread backend; mpi uses the MPI world)
  bool world_given = false;           // -g on the command line
  int root = 0;                       // -r: root of broadcast and reduce
  Average average = Average::mean;    // -a
  std::vector<dtp::ReduceOp> redops{dtp::ReduceOp::sum};  // -o
  std::vector<std::string> ops{"all_reduce"};  // --collective, names of the collective table
  std::vector<std::string> impls;              // --impl; empty = every one that applies
  DType dtype = DType::f32;                    // -d
  std::string json_path;                       // --json (appended to)
  double alpha_us = 5.0;                       // --alpha-us
  double beta_GBps = 0.0;                      // --beta-GBps; 0 = per-rank copy rate measured here
};

/// Reads the command line into @p o. Returns the exit status when the
/// program must stop (help: 0, bad flags: 2), std::nullopt when it may run.
std::optional<int> parse_options(Options& o, int argc, char** argv);

/// The sizes S of the sweep: -b, then times -f (or plus -i) up to -e.
std::vector<std::int64_t> sizes(const Options& o);

}  // namespace dtp::bench::collectives
