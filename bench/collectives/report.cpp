#include "report.h"

#include <cmath>
#include <cstdio>

#include "dtp/json.h"

namespace dtp::bench::collectives {
namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 3) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, bytes == std::floor(bytes) ? "%.0f %s" : "%.1f %s", bytes,
                units[unit]);
  return text;
}

void print_header_row() {
  std::printf("#%12s %12s %6s %6s %4s %-17s %11s %9s %9s %7s %9s %6s %11s\n", "size", "count",
              "type", "redop", "root", "impl", "time", "algbw", "busbw", "#wrong", "roofline",
              "%roof", "model");
  std::printf("#%12s %12s %6s %6s %4s %-17s %11s %9s %9s %7s %9s %6s %11s\n", "(B)", "(elements)",
              "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(GB/s)", "", "(us)");
}

}  // namespace

void print_run_header(const Context& ctx, int world, bool on_cpu) {
  const Options& o = ctx.options;
  const int n = world;
  const char* averages[] = {"rank 0's", "the mean of the ranks'", "the fastest rank's",
                            "the slowest rank's"};
  std::printf(
      "# dtp-bench-collectives: backend %s, device %s, world %d, dtype %s, iters %d, warmup %d, "
      "check %d\n",
      ctx.backend.c_str(), ctx.device.c_str(), n, dtp::dtype_name(o.dtype), o.iters, o.warmup,
      o.check_iters);
  std::printf("# date %s, host %s, cpu %s, git %s\n", ctx.date.c_str(), ctx.host.c_str(),
              ctx.cpu.c_str(), ctx.git.c_str());
  std::printf("# time: per call, %s time (-a %d)\n", averages[static_cast<int>(o.average)],
              static_cast<int>(o.average));
  std::printf(
      "# busbw = algbw x (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; "
      "others 1)\n");
  std::printf(
      "# roofline: the busbw at the %s bound (fewest bytes moved / bandwidth of every rank copying "
      "at once)\n",
      on_cpu ? "memcpy" : "device-to-device copy");
  std::printf("# model: alpha-beta prediction, alpha %.3g us, beta %s\n", o.alpha_us,
              o.beta_GBps > 0 ? (std::to_string(o.beta_GBps) + " GB/s").c_str()
                              : "1 / (the per-rank copy rate measured at each size)");
  if (n == 1)
    std::printf(
        "# one rank: nothing moves between ranks, so busbw is 0 (as in nccl-tests); an in-place "
        "collective\n"
        "# has nothing to do (no roofline: N/A) and an out-of-place one is a copy (its roofline is "
        "memcpy)\n");
}

void print_table_title(const Collective& collective, int world, bool has_rows) {
  std::printf("#\n# %s (%s), busbw factor %.4g\n", collective.name, collective.placement(),
              collective.busbw_factor(world));
  if (!has_rows)
    std::printf("# (none of the requested implementations applies to %s)\n", collective.name);
  else
    print_header_row();
}

void print_row(const Row& row, const Options& o) {
  char wrong[24], roofline[16], fraction[16];
  if (row.wrong < 0)
    std::snprintf(wrong, sizeof wrong, "N/A");
  else
    std::snprintf(wrong, sizeof wrong, "%lld", static_cast<long long>(row.wrong));
  // A collective with nothing to move (one rank, in place) has no bound to compare with.
  if (row.bound_seconds > 0) {
    std::snprintf(roofline, sizeof roofline, "%9.3f", row.roofline_busbw / kGiga);
    std::snprintf(fraction, sizeof fraction, "%5.1f%%", 100 * row.fraction);
  } else {
    std::snprintf(roofline, sizeof roofline, "%9s", "N/A");
    std::snprintf(fraction, sizeof fraction, "%6s", "N/A");
  }
  std::printf(" %12lld %12lld %6s %6s %4d %-17s %11.2f %9.3f %9.3f %7s %s %s %11.2f\n",
              static_cast<long long>(row.bytes), static_cast<long long>(row.count),
              dtp::dtype_name(o.dtype), row.collective->redop_column(row.redop).c_str(),
              row.collective->root_column(o.root), row.impl.c_str(), row.seconds * 1e6,
              row.algbw / kGiga, row.busbw / kGiga, wrong, roofline, fraction,
              row.predicted_seconds * 1e6);
  std::fflush(stdout);
}

void write_json(Context& ctx, const Row& row, const std::string& what, int world, double alpha,
                double beta_rate) {
  if (!ctx.json.is_open()) return;
  const Options& o = ctx.options;
  const Collective& c = *row.collective;
  dtp::JsonLine line(6);  // 6 significant digits
  line.add("what", what)
      .add("op", c.name)
      .add("redop", c.redop_column(row.redop))
      .add("root", c.root_column(o.root))
      .add("placement", c.placement())
      .add("impl", row.impl)
      .add("backend", ctx.backend)
      .add("device", ctx.device)
      .add("world", world)
      .add("bytes", row.bytes)
      .add("count", row.count)
      .add("dtype", dtp::dtype_name(o.dtype))
      .add("time_us", row.seconds * 1e6)
      .add("average", static_cast<int>(o.average))
      .add("algbw_GBps", row.algbw / kGiga)
      .add("busbw_GBps", row.busbw / kGiga);
  if (row.wrong < 0)
    line.raw("wrong", "null");
  else
    line.add("wrong", row.wrong);
  line.add("copy_GBps", row.copy_bw / kGiga)
      .add("bytes_moved", c.bytes_moved(world, static_cast<double>(row.bytes)))
      .add("bound_time_us", row.bound_seconds * 1e6)
      .add("roofline_GBps", row.roofline_busbw / kGiga);
  if (row.bound_seconds > 0)
    line.add("fraction_of_roofline", row.fraction);
  else
    line.raw("fraction_of_roofline", "null");
  line.add("predicted_time_us", row.predicted_seconds * 1e6)
      .add("predicted_busbw_GBps", row.predicted_seconds > 0 ? row.bytes / row.predicted_seconds *
                                                                   c.busbw_factor(world) / kGiga
                                                             : 0.0)
      .add("alpha_us", alpha * 1e6)
      .add("beta_GBps", beta_rate / kGiga)
      .add("iters", o.iters)
      .add("warmup", o.warmup)
      .add("check_iters", o.check_iters)
      .add("git", ctx.git)
      .add("date", ctx.date)
      .add("hostname", ctx.host)
      .add("cpu", ctx.cpu);
  ctx.json << line.str() << '\n';
  ctx.json.flush();
  DTP_CHECK(ctx.json.good(), "cannot write the --json file ", ctx.options.json_path,
            " (a full disk?)");
}

void print_summary(const Collective& collective, const std::map<std::string, Row>& largest,
                   std::int64_t wrong, double busbw_sum, int rows, int world) {
  const int n = world;
  // nccl-tests ends its table with these two lines; here every table does.
  std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong),
              wrong == 0 ? "OK" : "FAILED");
  std::printf("# Avg bus bandwidth    : %.4g  (GB/s, the mean busbw of this table's %d rows)\n",
              rows > 0 ? busbw_sum / rows / kGiga : 0.0, rows);
  const Row& any = largest.begin()->second;
  std::printf(
      "# %s at %s per rank, %d rank%s: copy bandwidth %.3f GB/s (all ranks), bound %.2f us\n",
      collective.name, human_bytes(static_cast<double>(any.bytes)).c_str(), n, n == 1 ? "" : "s",
      any.copy_bw / kGiga, any.bound_seconds * 1e6);
  for (const auto& [label, row] : largest) {
    char roof[48] = "no roofline (nothing to move)";
    if (row.bound_seconds > 0)
      std::snprintf(roof, sizeof roof, "%5.1f%% of the roofline", 100 * row.fraction);
    std::printf(
        "#   %-26s %11.2f us  busbw %8.3f GB/s  %s  (model %.2f us)%s\n",
        (collective.reduces ? collective.redop_column(row.redop) + " " + row.impl : row.impl)
            .c_str(),
        row.seconds * 1e6, row.busbw / kGiga, roof, row.predicted_seconds * 1e6,
        row.wrong > 0 ? "  WRONG RESULTS" : "");
  }
}

}  // namespace dtp::bench::collectives
