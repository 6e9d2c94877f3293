// dtp-bench-collectives: measures collectives the way nccl-tests does, and
// against the machine's memory roofline in the same run.
//
//   dtp-bench-collectives -g 4 -b 1K -e 64M -f 4 --collective all_reduce --json out.jsonl
//
// For every collective, size and implementation it prints one table row and
// writes one JSON line. Definitions (the same as nccl-tests'):
//   S      the size column: bytes of the buffer nccl-tests names for that
//          collective (all_reduce, broadcast, reduce, all_to_all, sendrecv:
//          one rank's buffer; all_gather: the gathered output;
//          reduce_scatter: the input that is scattered). Never the sum over ranks.
//   t      seconds per call: every rank times `iters` back-to-back calls after
//          a barrier; t combines the ranks' averages as -a says.
//   algbw  = S / t.
//   busbw  = algbw * factor, the factor that makes busbw comparable to link
//          bandwidth whatever the collective: all_reduce 2(n-1)/n; all_gather,
//          reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, sendrecv 1.
//
// The memory roofline: at every size, every rank copies its own S-byte buffer
// at the same time (memcpy on the host, a device-to-device copy on a GPU),
// which gives B_copy, the bytes read plus written per second by all ranks
// together. Each collective has a fewest-bytes count (its table entry): the
// reads and writes no implementation can avoid. bound_time = bytes_moved /
// B_copy is how fast the collective could be if it moved memory as well as
// memcpy does, and fraction_of_roofline = bound_time / t. The "roofline" busbw
// printed next to each row is the busbw the collective would have at
// bound_time, so %roofline = busbw / roofline busbw. It is a practical bound,
// not a hard one: memcpy reads its destination lines before writing them
// (write-allocate) and touches twice the memory of an in-place collective, so
// a well-fused in-place all-reduce can pass 100%.
//
// The alpha-beta prediction: each implementation's message schedule costs
// rounds * alpha + bytes-on-the-critical-path * beta (the formulas of chapter
// 01, in alpha_beta.h). alpha is --alpha-us (default 5 us); beta is
// 1 / --beta-GBps, by default 1 / (B_copy / 2n): the rate at which one rank
// copies bytes while all ranks copy at once, since moving a message between
// ranks of one machine is at least one copy.
//
// The files: options (the flags); collective_table (one entry per
// collective: its facts, buffers, checks and calls), with alpha_beta (the
// models the entries name), check_values (the values of a checked call) and
// native_peers, native_mpi, native_nccl (the backends' own libraries);
// timing; report (the table and the JSON); and this one, the sweep.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bench_common.h"
#include "check_values.h"
#include "collective_table.h"
#include "dtp/dtp.h"
#include "options.h"
#include "report.h"
#include "timing.h"

namespace dtp::bench::collectives {
namespace {

// The world size: -g ranks on the thread backend; on mpi and nccl every rank
// the launcher can start (MPI processes, or one rank per GPU), or the first -g
// of them when -g asks for fewer.
int world_size_for(const dtp::World& world, const Options& o) {
  if (world.backend == dtp::Backend::thread) return o.world;
  const int available = dtp::max_world_size(world.backend);
  DTP_CHECK(available >= 1, "the ", dtp::backend_name(world.backend),
            " backend has no ranks to run here");
  return o.world_given && o.world < available ? o.world : available;
}

/// Zeroes every buffer: timed calls then compute on values that never grow
/// (an in-place sum repeated `iters` times would overflow a pattern).
void zero_buffers(Buffers& buffers) {
  for (dtp::Tensor* t : {&buffers.a, &buffers.b})
    if (t->defined()) fill_with(*t, [](std::int64_t) { return 0.0; });
}

/// What a table gathers over its sizes, for its closing lines.
struct TableTotals {
  std::map<std::string, Row> largest;  // per redop/impl, the row at the largest size
  double busbw_sum = 0;                // for the table's "Avg bus bandwidth", as nccl-tests
  int rows = 0;
  std::int64_t wrong = 0;
};

/// Times @p call, then, as nccl-tests, makes -c calls on known values and
/// counts the wrong elements over every rank. Fills the row's time and #wrong.
void time_and_check(dtp::Comm& comm, const Options& o, const Collective& collective, CallArgs& args,
                    const Call& call, Row& row) {
  zero_buffers(args.buffers);
  row.seconds = time_calls(comm, call, o.warmup, o.iters, o.average);
  if (o.check_iters == 0) return;
  row.wrong = 0;
  for (int check = 0; check < o.check_iters; ++check) {
    collective.fill_for_check(args.buffers, comm, o.root);
    synchronize(comm);
    comm.barrier();
    call();
    synchronize(comm);
    const std::int64_t wrong = collective.wrong_elements(args.redop, args.buffers, comm, o.root);
    row.wrong +=
        static_cast<std::int64_t>(combine(comm, static_cast<double>(wrong), dtp::ReduceOp::sum));
  }
}

/// One table: @p collective at every size, reduction and implementation.
void measure_collective(dtp::Comm& comm, Context& ctx, const Collective& collective,
                        std::map<std::int64_t, double>& copy_rates, std::set<std::string>& noted) {
  const Options& o = ctx.options;
  const int n = comm.size();
  const bool lead = comm.rank() == 0;
  const double alpha = o.alpha_us * 1e-6;
  std::vector<const Implementation*> implementations;
  for (const Implementation& i : collective.implementations)
    if (o.impls.empty() || std::find(o.impls.begin(), o.impls.end(), i.name) != o.impls.end())
      implementations.push_back(&i);
  if (lead) print_table_title(collective, n, !implementations.empty());
  if (implementations.empty()) return;

  const std::vector<dtp::ReduceOp> redops =
      collective.reduces ? o.redops : std::vector<dtp::ReduceOp>{dtp::ReduceOp::sum};
  const auto element = static_cast<std::int64_t>(dtp::dtype_size(o.dtype));
  TableTotals totals;
  for (std::int64_t size : sizes(o)) {
    std::int64_t count = std::max<std::int64_t>(1, size / element);
    if (collective.equal_chunks) count = (count + n - 1) / n * n;
    const std::int64_t bytes = count * element;

    if (!copy_rates.count(bytes))
      copy_rates[bytes] = copy_bandwidth(comm, bytes, o.warmup, o.iters);
    const double copy_bw = copy_rates[bytes];
    const double beta_rate = o.beta_GBps > 0 ? o.beta_GBps * kGiga : copy_bw / (2.0 * n);
    const double bound = collective.bytes_moved(n, static_cast<double>(bytes)) / copy_bw;
    const double factor = collective.busbw_factor(n);

    CallArgs args{
        .buffers = collective.make_buffers(count, comm, o.dtype), .comm = &comm, .root = o.root};
    for (dtp::ReduceOp redop : redops) {
      args.redop = redop;
      for (const Implementation* implementation : implementations) {
        std::string why_not;
        const Call call = make_call(collective, *implementation, args, why_not);
        const std::string label = std::string(collective.name) + "/" +
                                  collective.redop_column(redop) + "/" + implementation->name;
        if (!call) {
          if (lead && noted.insert(label).second)
            std::printf("# %s %s%s: skipped, %s\n", collective.name, implementation->name,
                        collective.reduces ? (" " + collective.redop_column(redop)).c_str() : "",
                        why_not.c_str());
          continue;
        }
        Row row{.collective = &collective,
                .impl = implementation->name,
                .redop = redop,
                .bytes = bytes,
                .count = count};
        time_and_check(comm, o, collective, args, call, row);
        row.algbw = bytes / row.seconds;
        row.busbw = row.algbw * factor;
        row.copy_bw = copy_bw;
        row.bound_seconds = bound;
        row.roofline_busbw = bound > 0 ? bytes / bound * factor : 0.0;
        row.fraction = bound / row.seconds;
        row.predicted_seconds = implementation->predicted_seconds(n, static_cast<double>(bytes),
                                                                  alpha, 1.0 / beta_rate);
        totals.largest[label] = row;
        totals.busbw_sum += row.busbw;
        ++totals.rows;
        if (lead) {
          if (row.wrong > 0) {
            ++ctx.wrong_rows;
            totals.wrong += row.wrong;
            ctx.wrong_elements += row.wrong;
          }
          print_row(row, o);
          write_json(ctx, row, "collective", n, alpha, beta_rate);
        }
      }
    }
    if (lead && bound > 0) {
      // The roofline itself: one JSON object per size, with the copy as the impl.
      const double roof_algbw = bytes / bound, roof_busbw = roof_algbw * factor;
      const Row roof{.collective = &collective,
                     .impl = comm.device().is_cpu() ? "memcpy" : "d2d_copy",
                     .bytes = bytes,
                     .count = count,
                     .seconds = bound,
                     .algbw = roof_algbw,
                     .busbw = roof_busbw,
                     .copy_bw = copy_bw,
                     .bound_seconds = bound,
                     .roofline_busbw = roof_busbw,
                     .fraction = 1.0};
      write_json(ctx, roof, "roofline", n, alpha, beta_rate);
    }
  }
  if (lead && !totals.largest.empty())
    print_summary(collective, totals.largest, totals.wrong, totals.busbw_sum, totals.rows, n);
}

void run_rank(dtp::Comm& comm, Context& ctx) {
  const Options& o = ctx.options;
  DTP_CHECK(o.root < comm.size(), "-r ", o.root, " is outside the world of ", comm.size(),
            " ranks");
  if (comm.rank() == 0) print_run_header(ctx, comm.size(), comm.device().is_cpu());
  std::map<std::int64_t, double> copy_rates;  // B_copy by size, measured once per size
  std::set<std::string> noted;                // implementations already reported as skipped
  for (const std::string& name : o.ops)
    measure_collective(comm, ctx, find_collective(name), copy_rates, noted);
  if (comm.rank() == 0) std::fflush(stdout);
}

}  // namespace
}  // namespace dtp::bench::collectives

int main(int argc, char** argv) {
  using namespace dtp::bench::collectives;
  Context ctx;
  if (auto status = parse_options(ctx.options, argc, argv)) return *status;
  try {
    dtp::World world = dtp::World::from_env(ctx.options.world);
    world.size = world_size_for(world, ctx.options);
    ctx.backend = dtp::backend_name(world.backend);
    ctx.device = world.device.str();
    ctx.git = dtp::bench::git_revision();
    ctx.date = dtp::bench::utc_now();
    ctx.host = dtp::bench::host_name();
    ctx.cpu = dtp::bench::cpu_model();
    dtp::launch(world, [&](dtp::Comm& comm) {
      if (comm.rank() == 0 && !ctx.options.json_path.empty()) {
        ctx.json.open(ctx.options.json_path, std::ios::app);
        DTP_CHECK(ctx.json.is_open(), "cannot open ", ctx.options.json_path, " for appending");
      }
      run_rank(comm, ctx);
    });
    if (ctx.json.is_open()) {
      ctx.json.close();
      DTP_CHECK(!ctx.json.fail(), "cannot write the --json file ", ctx.options.json_path);
      std::printf("# JSON lines appended to %s\n", ctx.options.json_path.c_str());
    }
    if (ctx.wrong_rows > 0) {
      std::fprintf(stderr,
                   "dtp-bench-collectives: %d measurements had wrong results (#wrong column)\n",
                   ctx.wrong_rows);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "dtp-bench-collectives: %s\n", e.what());
    return 1;
  }
  return 0;
}
