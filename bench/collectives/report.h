// What dtp-bench-collectives prints and writes: nccl-tests' table, one row
// per size and implementation, and one JSON line per row.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>

#include "collective_table.h"
#include "options.h"

namespace dtp::bench::collectives {

constexpr double kGiga = 1e9;  // GB/s as nccl-tests counts them: 10^9 bytes

/// The run: its options, where and when it measured, the JSON file, and the
/// wrong results found so far (counted on rank 0).
struct Context {
  Options options;
  std::string backend, device, git, date, host, cpu;
  std::ofstream json;
  int wrong_rows = 0;  // rows whose check failed
  std::int64_t wrong_elements =
      0;  // wrong elements over every row (nccl-tests' "out of bounds values")
};

/// One measurement: a collective at one size, one reduction and one implementation.
struct Row {
  const Collective* collective = nullptr;
  std::string impl;
  dtp::ReduceOp redop = dtp::ReduceOp::sum;
  std::int64_t bytes = 0, count = 0;
  double seconds = 0, algbw = 0, busbw = 0;
  std::int64_t wrong = -1;  // -1: not checked
  double copy_bw = 0, bound_seconds = 0, roofline_busbw = 0, fraction = 0;
  double predicted_seconds = 0;
};

/// The lines above every table: the run, and what the columns mean.
void print_run_header(const Context& ctx, int world, bool on_cpu);

/// A table's title and its column headers (or why it has no rows).
void print_table_title(const Collective& collective, int world, bool has_rows);

void print_row(const Row& row, const Options& o);

/// Appends @p row to the --json file (nothing without one). @p what is
/// "collective" for a measurement, "roofline" for the bound itself.
void write_json(Context& ctx, const Row& row, const std::string& what, int world, double alpha,
                double beta_rate);

/// nccl-tests' two closing lines, then every implementation at the largest
/// size (@p largest: by redop/impl label).
void print_summary(const Collective& collective, const std::map<std::string, Row>& largest,
                   std::int64_t wrong, double busbw_sum, int rows, int world);

}  // namespace dtp::bench::collectives
