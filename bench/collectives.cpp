// dtp-bench-collectives: measures collectives the way nccl-tests does, and
// against the machine's memory roofline in the same run.
//
//   dtp-bench-collectives -g 4 -b 1K -e 64M -f 4 -o all_reduce --json out.jsonl
//
// For every operation, size and implementation it prints one table row and
// writes one JSON line. Definitions (the same as nccl-tests'):
//   S      the size column: bytes of the buffer nccl-tests names for that
//          operation (all_reduce, broadcast, reduce, all_to_all, sendrecv: one
//          rank's buffer; all_gather: the gathered output; reduce_scatter: the
//          input that is scattered). Never the sum over ranks.
//   t      seconds per call: every rank times `iters` back-to-back calls after
//          a barrier; t is the slowest rank's average.
//   algbw  = S / t.
//   busbw  = algbw * factor, the factor that makes busbw comparable to link
//          bandwidth whatever the operation: all_reduce 2(n-1)/n; all_gather,
//          reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, sendrecv 1.
//
// The memory roofline: at every size, every rank copies its own S-byte buffer
// at the same time (memcpy on the host, a device-to-device copy on a GPU),
// which gives B_copy, the bytes read plus written per second by all ranks
// together. Each operation has a fewest-bytes count (see bytes_moved()): the
// reads and writes no implementation can avoid. bound_time = bytes_moved /
// B_copy is how fast the operation could be if it moved memory as well as
// memcpy does, and fraction_of_roofline = bound_time / t. The "roofline" busbw
// printed next to each row is the busbw the operation would have at
// bound_time, so %roofline = busbw / roofline busbw. It is a practical bound,
// not a hard one: memcpy reads its destination lines before writing them
// (write-allocate) and touches twice the memory of an in-place operation, so
// a well-fused in-place all-reduce can pass 100%.
//
// The alpha-beta prediction: each implementation's message schedule costs
// rounds * alpha + bytes-on-the-critical-path * beta (the formulas of chapter
// 01, see predicted_seconds()). alpha is --alpha-us (default 5 us); beta is
// 1 / --beta-GBps, by default 1 / (B_copy / 2n): the rate at which one rank
// copies bytes while all ranks copy at once, since moving a message between
// ranks of one machine is at least one copy.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "01_collectives/collectives.h"
#include "bench_common.h"
#include "dtp_cli.h"
#include "dtp/dtp.h"
#include "dtp/json.h"

// The runtime's own checked-call macros (runtime/src): one definition each.
#ifdef DTP_HAVE_MPI
#include <mpi.h>

#include "mpi/mpi_check.h"
#endif
#if defined(DTP_HAVE_CUDA) || defined(DTP_HAVE_NCCL)
#include "cuda/cuda_check.h"
#endif
#ifdef DTP_HAVE_NCCL
#include "nccl/nccl_check.h"
#endif

namespace {

using dtp::bench::cpu_model;
using dtp::bench::git_revision;
using dtp::bench::host_name;
using dtp::bench::split_list;
using dtp::bench::utc_now;

using dtp::Comm;
using dtp::DType;
using dtp::Shape;
using dtp::Tensor;

constexpr double kGiga = 1e9;  // GB/s as nccl-tests counts them: 10^9 bytes

// --- command line ----------------------------------------------------------------
// The flags nccl-tests has keep its meanings (-b -e -f -i -n -w -c -d -o -r
// -g -a); what it does with one binary per collective, --collective does.

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
  std::vector<std::string> ops{"all_reduce"};             // --collective
  std::vector<std::string> impls;     // --impl; empty = every one that applies
  DType dtype = DType::f32;           // -d
  std::string json_path;              // --json (appended to)
  double alpha_us = 5.0;              // --alpha-us
  double beta_GBps = 0.0;             // --beta-GBps; 0 = per-rank copy rate measured here
};

const std::vector<std::string> kAllOps = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                          "reduce",     "all_to_all", "sendrecv"};

/// Collectives that combine values, and so take a reduction operator (-o).
bool is_reduction(const std::string& op) {
  return op == "all_reduce" || op == "reduce_scatter" || op == "reduce";
}

/// In place (one buffer is input and output) or out of place (two buffers).
/// nccl-tests measures both; here each collective runs as the Comm API and
/// chapter 01 define it: all_reduce, broadcast and reduce in place, the
/// others out of place.
const char* placement(const std::string& op) {
  return op == "all_reduce" || op == "broadcast" || op == "reduce" ? "in-place" : "out-of-place";
}

// Implementations that apply to each operation, in table order. "library" is
// the backend's Comm collective (for sendrecv: Comm::send/recv), "native" the
// backend's own library (MPI_Allreduce, ncclAllReduce, ...), the rest are the
// chapter-01 reference algorithms built from send/recv.
std::vector<std::string> impls_for(const std::string& op) {
  if (op == "all_reduce") return {"library", "ring", "tree", "halving_doubling", "parameter_server", "native"};
  if (op == "all_gather" || op == "reduce_scatter") return {"library", "ring", "native"};
  if (op == "broadcast" || op == "reduce") return {"library", "tree", "native"};
  if (op == "all_to_all") return {"library", "pairwise", "native"};
  if (op == "sendrecv") return {"library", "native"};
  return {};
}

/// "32M" -> 33554432: K, M, G are powers of 1024 (nccl-tests' convention).
std::int64_t parse_bytes(const std::string& text) {
  // The number is the text before the suffix, in decimal ("1.5K" is 1536).
  const std::size_t number_end = text.find_first_not_of("0123456789.eE+-");
  const std::string number = text.substr(0, number_end);
  const std::optional<double> value = dtp::cli::parse_real_text(number);
  if (!value || *value < 0)
    throw CLI::ValidationError("expected a size in bytes such as 4096, 64K, 32M or 1G, got '" + text + "'");
  const std::string suffix = number_end == std::string::npos ? "" : text.substr(number_end);
  double scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB") scale = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MB" || suffix == "MiB") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GB" || suffix == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() && suffix != "B")
    throw CLI::ValidationError("unknown size suffix in '" + text + "': use K, M or G (powers of 1024)");
  const double bytes = *value * scale;
  if (bytes > 1e15) throw CLI::ValidationError("'" + text + "' is more than a petabyte");
  if (bytes != std::floor(bytes))
    throw CLI::ValidationError("'" + text + "' is " + std::to_string(bytes) +
                               " bytes: a size is a whole number of bytes");
  return static_cast<std::int64_t>(bytes);
}

/// Reads a comma list against the accepted names ("all": every one).
std::vector<std::string> parse_names(const std::string& text, const std::vector<std::string>& accepted,
                                     const char* what) {
  if (text == "all") return accepted;
  std::vector<std::string> names = split_list(text);
  std::string expected;
  for (const std::string& a : accepted) expected += (expected.empty() ? "" : ", ") + a;
  if (names.empty()) throw CLI::ValidationError(std::string("expected ") + what + ": " + expected + " or all");
  for (const std::string& name : names)
    if (std::find(accepted.begin(), accepted.end(), name) == accepted.end())
      throw CLI::ValidationError(std::string("unknown ") + what + " '" + name + "': expected " + expected +
                                 ", a comma list of them, or all");
  return names;
}

std::vector<dtp::ReduceOp> parse_redops(const std::string& text) {
  if (text == "prod" || text == "mulsum")
    throw CLI::ValidationError("nccl-tests' '" + text + "' has no counterpart: DTP's Comm reduces with sum, avg, "
                               "max or min");
  std::vector<dtp::ReduceOp> ops;
  for (const std::string& name : parse_names(text, {"sum", "avg", "max", "min"}, "reduction"))
    ops.push_back(name == "sum" ? dtp::ReduceOp::sum : name == "avg" ? dtp::ReduceOp::avg
                  : name == "max" ? dtp::ReduceOp::max : dtp::ReduceOp::min);
  return ops;
}

/// Returns the exit status when the program must stop (help: 0, bad flags: 2).
std::optional<int> parse_options(Options& o, int argc, char** argv) {
  CLI::App app{"Measures collectives the way nccl-tests does (algbw, busbw, #wrong), next to the memory "
               "roofline of the same machine measured in the same run and the alpha-beta model of chapter 01. "
               "The backend and device come from DTP_BACKEND (thread, mpi, nccl) and DTP_DEVICE (cpu, cuda).",
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
  app.add_option_function<std::string>("-b,--minbytes", bytes("-b", o.min_bytes), "smallest size S [32M]")
      ->type_name("SIZE");
  app.add_option_function<std::string>("-e,--maxbytes", bytes("-e", o.max_bytes), "largest size S [32M]")
      ->type_name("SIZE");
  app.add_option("-f,--stepfactor", o.factor, "next size = size x F")
      ->check(dtp::cli::Range(1.0, 1024.0))
      ->capture_default_str();
  app.add_option_function<std::string>("-i,--stepbytes", bytes("-i", o.step_bytes),
                                       "next size = size + N bytes (instead of -f)")->type_name("SIZE");
  app.add_option("-n,--iters", o.iters, "timed calls per measurement")
      ->check(dtp::cli::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("-w,--warmup_iters,--warmup", o.warmup, "untimed calls before them")
      ->check(dtp::cli::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("-c,--check", o.check_iters,
                 "checked calls after the timed ones, on values that make every mistake visible (#wrong); 0: none")
      ->check(dtp::cli::Range(0, 1000))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "-d,--datatype,--dtype",
         named("-d",
               [&o](const std::string& text) {
                 if (text == "float" || text == "f32") o.dtype = DType::f32;
                 else if (text == "double" || text == "f64") o.dtype = DType::f64;
                 else throw CLI::ValidationError("expected float (f32) or double (f64), got '" + text + "'");
               }),
         "float (f32) or double (f64) [float]")
      ->type_name("TYPE");
  app.add_option_function<std::string>(
         "-o,--op", named("-o", [&o](const std::string& text) { o.redops = parse_redops(text); }),
         "the reduction of all_reduce, reduce_scatter and reduce: sum, avg, max, min, a comma list, or all [sum]")
      ->type_name("REDOP");
  app.add_option_function<std::string>(
         "--collective,--op-kind",
         named("--collective", [&o](const std::string& text) { o.ops = parse_names(text, kAllOps, "collective"); }),
         "all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, sendrecv, a comma list, or all "
         "[all_reduce] (nccl-tests has one program per collective)")
      ->type_name("LIST");
  app.add_option_function<std::string>(
         "--impl",
         named("--impl",
               [&o](const std::string& text) {
                 const std::vector<std::string> known = {"library", "ring", "tree", "halving_doubling",
                                                         "parameter_server", "pairwise", "native"};
                 o.impls = text == "all" ? std::vector<std::string>{} : parse_names(text, known, "implementation");
               }),
         "library, ring, tree, halving_doubling, parameter_server, pairwise, native, a comma list, or all "
         "[every one that applies to the collective]")
      ->type_name("LIST");
  app.add_option_function<int>(
         "-g,--ngpus,--world",
         [&o](int n) {
           o.world = n;
           o.world_given = true;
         },
         "ranks in this process: the thread backend's world [4]; under mpi and nccl the first N ranks of the "
         "launcher's (nccl-tests: GPUs per thread)")
      ->check(dtp::cli::Range(1, 1024));
  app.add_option("-r,--root", o.root, "root of broadcast and reduce")
      ->check(dtp::cli::Range(0, 1023))
      ->capture_default_str();
  app.add_option_function<int>(
         "-a,--average", [&o](int mode) { o.average = static_cast<Average>(mode); },
         "the time of a measurement from the ranks' times: 0 rank 0's, 1 the mean, 2 the fastest, 3 the slowest [1]")
      ->check(dtp::cli::Range(0, 3));
  app.add_option("--json", o.json_path, "append one JSON object per measurement to FILE")->type_name("FILE");
  app.add_option("--alpha-us", o.alpha_us, "alpha-beta model: the cost of one message, microseconds")
      ->check(dtp::cli::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--beta-GBps", o.beta_GBps,
                 "alpha-beta model: per-rank bandwidth in GB/s [0: the per-rank copy rate measured at each size]")
      ->check(dtp::cli::Range(0.0, 1e6));
  app.footer("Sizes: K, M and G are powers of 1024. GB/s are 10^9 bytes per second, as in nccl-tests.\n"
             "Exit status: 0 measured, 1 a check found a wrong element or the run failed, 2 a bad command line.");
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
    return refuse("-r " + std::to_string(o.root) + " is outside the world of -g " + std::to_string(o.world) +
                  " ranks");
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

// --- facts about the run, for the header and the JSON -----------------------------

// The world size: -g ranks on the thread backend; on mpi and nccl every rank
// the launcher can start (MPI processes, or one rank per GPU), or the first -g
// of them when -g asks for fewer.
int world_size_for(const dtp::World& world, const Options& o) {
  if (world.backend == dtp::Backend::thread) return o.world;
  const int available = dtp::max_world_size(world.backend);
  DTP_CHECK(available >= 1, "the ", dtp::backend_name(world.backend), " backend has no ranks to run here");
  return o.world_given && o.world < available ? o.world : available;
}

// --- JSON lines ----------------------------------------------------------------

// --- what each operation costs ------------------------------------------------------

/// nccl-tests' bus-bandwidth factor: busbw = algbw * factor.
double busbw_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return double(n - 1) / n;
  return 1.0;  // broadcast, reduce, sendrecv
}

/// The fewest bytes an operation must read plus write in memory, over all n
/// ranks, with S the size column (see the top of the file). Every input byte
/// must be read once and every output byte written once; nothing is counted
/// twice and no intermediate copies are allowed:
///   all_reduce      read n inputs of S, write n outputs of S          2nS
///   all_gather      read the n shards (S in all), write n outputs of S (n+1)S
///   reduce_scatter  read n inputs of S, write n shards (S in all)      (n+1)S
///   broadcast       read root's S, write the n-1 other buffers         nS
///   reduce          read n inputs of S, write root's S                 (n+1)S
///   all_to_all      read n inputs of S, write n outputs of S          2nS
///   sendrecv        each rank reads S and writes S (n messages)        2nS
/// The memcpy roofline copies n buffers of S: 2nS bytes. For all_reduce the
/// bound is therefore exactly the memcpy time of the same buffers. A world of
/// one rank moves nothing between ranks (see the first line).
double bytes_moved(const std::string& op, int n, double S) {
  // One rank: an in-place collective has nothing to do (its input is its
  // result) and an out-of-place one is a copy of S bytes.
  if (n == 1) return std::string(placement(op)) == "in-place" ? 0.0 : 2.0 * S;
  if (op == "all_reduce" || op == "all_to_all" || op == "sendrecv") return 2.0 * n * S;
  if (op == "all_gather" || op == "reduce_scatter" || op == "reduce") return (n + 1.0) * S;
  if (op == "broadcast") return n * S;
  return 2.0 * n * S;
}

int ceil_log2(int n) {
  int rounds = 0;
  while ((1 << rounds) < n) ++rounds;
  return rounds;
}

/// The alpha-beta model's time for @p impl: alpha per message round on the
/// critical path, beta per byte a rank sends on it (chapter 01's formulas;
/// reduction arithmetic is not charged). "library" and "native" are charged as
/// the bandwidth-optimal schedule the runtime's clock uses: rings for
/// all-reduce, all-gather, reduce-scatter and all-to-all, binomial trees for
/// broadcast and reduce.
double predicted_seconds(const std::string& op, const std::string& impl, int n, double S,
                         double alpha, double beta) {
  if (n <= 1) return 0.0;
  const double share = double(n - 1) / n;
  const double log_rounds = ceil_log2(n);
  if (op == "all_reduce") {
    if (impl == "tree") return 2 * log_rounds * (alpha + S * beta);
    if (impl == "parameter_server") return 2 * (n - 1) * (alpha + S * beta);  // the root's link
    if (impl == "halving_doubling") {
      int p = 1;
      while (p * 2 <= n) p *= 2;
      const int log_p = ceil_log2(p);
      double time = 2 * log_p * alpha + 2.0 * (p - 1) / p * S * beta;
      if (p < n) time += 2 * (alpha + S * beta);  // fold the extra ranks in and back out
      return time;
    }
    return 2 * (n - 1) * alpha + 2 * share * S * beta;  // ring, library, native
  }
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all")
    return (n - 1) * alpha + share * S * beta;
  if (op == "broadcast" || op == "reduce") return log_rounds * (alpha + S * beta);
  return alpha + S * beta;  // sendrecv: one message each way
}

// --- buffers and the values that make every mistake visible ---------------------

/// Rank r's input element at flat index g. Small integers: every sum over up
/// to 1024 ranks stays exact in f32, so results are compared exactly.
double pattern(int rank, std::int64_t g) { return rank + static_cast<double>(g % 61); }
/// Sum of pattern(r, g) over the n ranks.
double pattern_sum(int n, std::int64_t g) { return n * (n - 1) / 2.0 + n * static_cast<double>(g % 61); }
/// The reduction @p op of pattern(r, g) over the n ranks: the sum, its mean
/// (a multiple of 1/2, exact in f32), the largest (rank n-1's) or the smallest (rank 0's).
double pattern_reduced(dtp::ReduceOp op, int n, std::int64_t g) {
  switch (op) {
    case dtp::ReduceOp::sum: return pattern_sum(n, g);
    case dtp::ReduceOp::avg: return pattern_sum(n, g) / n;
    case dtp::ReduceOp::max: return pattern(n - 1, g);
    case dtp::ReduceOp::min: return pattern(0, g);
  }
  return 0;
}

/// A host copy of @p t (t itself when it is already on the host).
Tensor to_host(const Tensor& t) {
  if (t.device().is_cpu()) return t;
  Tensor host = Tensor::empty(t.shape(), t.dtype(), dtp::Device::cpu());
  host.copy_from(t);
  return host;
}

/// Fills @p t with value(g) for flat index g, through a host buffer on a GPU.
void fill_with(Tensor& t, const std::function<double(std::int64_t)>& value) {
  Tensor host = t.device().is_cpu() ? t : Tensor::empty(t.shape(), t.dtype(), dtp::Device::cpu());
  auto fill = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (std::int64_t g = 0, n = host.numel(); g < n; ++g) p[g] = static_cast<T>(value(g));
  };
  if (host.dtype() == DType::f32) fill(host.data<float>());
  else fill(host.data<double>());
  if (!t.device().is_cpu()) t.copy_from(host);
}

/// Elements g of @p t in [begin, end) that differ from expected(g).
/// Exact, except that an average may divide by multiplying with 1/n: within
/// @p tolerance relative to the expected value.
std::int64_t count_wrong(const Tensor& t, std::int64_t begin, std::int64_t end,
                         const std::function<double(std::int64_t)>& expected, double tolerance = 0) {
  Tensor host = to_host(t);
  std::int64_t wrong = 0;
  auto scan = [&](const auto* p) {
    for (std::int64_t g = begin; g < end; ++g) {
      const double want = expected(g);
      if (std::abs(static_cast<double>(p[g]) - want) > tolerance * std::abs(want)) ++wrong;
    }
  };
  if (host.dtype() == DType::f32) scan(host.data<float>());
  else scan(host.data<double>());
  return wrong;
}

/// The buffers of one operation on one rank. Their meaning by operation:
///   all_reduce, broadcast, reduce   a = x (in place)
///   all_gather                      a = shard (chunk r of the count), b = full
///   reduce_scatter                  a = full, b = shard
///   all_to_all                      a = in, b = out
///   sendrecv                        a = what is sent right, b = what arrives from the left
struct Buffers {
  Tensor a, b;
};

Buffers make_buffers(const std::string& op, std::int64_t count, const Comm& comm, DType dtype) {
  const auto device = comm.device();
  const std::int64_t shard = dtp::chunk_range(count, comm.size(), comm.rank()).length;
  auto make = [&](std::int64_t numel) {
    return Tensor::zeros(Shape{numel}, dtype, device, dtp::MemoryCategory::comm);
  };
  if (op == "all_reduce" || op == "broadcast" || op == "reduce") return {make(count), Tensor()};
  if (op == "all_gather") return {make(shard), make(count)};
  if (op == "reduce_scatter") return {make(count), make(shard)};
  return {make(count), make(count)};  // all_to_all, sendrecv
}

/// Zeroes every buffer: timed calls then compute on values that never grow
/// (an in-place sum repeated `iters` times would overflow a pattern).
void zero_buffers(Buffers& buffers) {
  for (Tensor* t : {&buffers.a, &buffers.b})
    if (t->defined()) fill_with(*t, [](std::int64_t) { return 0.0; });
}

/// Fills the inputs with pattern() and the outputs with -1 before a checked call.
void fill_for_check(const std::string& op, Buffers& buffers, const Comm& comm, int root) {
  const int rank = comm.rank();
  auto own = [rank](std::int64_t g) { return pattern(rank, g); };
  auto sentinel = [](std::int64_t) { return -1.0; };
  if (op == "all_reduce" || op == "reduce") {
    fill_with(buffers.a, own);
  } else if (op == "broadcast") {
    fill_with(buffers.a, rank == root ? std::function<double(std::int64_t)>(own) : sentinel);
  } else if (op == "all_gather") {
    // The shard holds this rank's pattern at its place in the full buffer.
    const std::int64_t offset = dtp::chunk_range(buffers.b.numel(), comm.size(), rank).offset;
    fill_with(buffers.a, [&](std::int64_t j) { return pattern(rank, offset + j); });
    fill_with(buffers.b, sentinel);
  } else {  // reduce_scatter, all_to_all, sendrecv
    fill_with(buffers.a, own);
    fill_with(buffers.b, sentinel);
  }
}

/// Wrong elements on this rank after a checked call.
std::int64_t wrong_elements(const std::string& op, dtp::ReduceOp redop, const Buffers& buffers, const Comm& comm,
                            int root) {
  const int n = comm.size(), rank = comm.rank();
  const double tolerance = redop == dtp::ReduceOp::avg ? (buffers.a.dtype() == DType::f32 ? 1e-6 : 1e-14) : 0;
  auto reduced = [n, redop](std::int64_t g) { return pattern_reduced(redop, n, g); };
  if (op == "all_reduce") return count_wrong(buffers.a, 0, buffers.a.numel(), reduced, tolerance);
  if (op == "reduce") {
    if (rank != root) return 0;  // other ranks' x is scratch for some algorithms
    return count_wrong(buffers.a, 0, buffers.a.numel(), reduced, tolerance);
  }
  if (op == "broadcast")
    return count_wrong(buffers.a, 0, buffers.a.numel(), [root](std::int64_t g) { return pattern(root, g); });
  if (op == "all_gather") {
    const std::int64_t count = buffers.b.numel();
    const std::int64_t chunk = (count + n - 1) / n;  // chunk_range: ceil-sized chunks
    return count_wrong(buffers.b, 0, count,
                       [&](std::int64_t g) { return pattern(static_cast<int>(g / chunk), g); });
  }
  if (op == "reduce_scatter") {
    const std::int64_t offset = dtp::chunk_range(buffers.a.numel(), n, rank).offset;
    return count_wrong(buffers.b, 0, buffers.b.numel(),
                       [&](std::int64_t j) { return pattern_reduced(redop, n, offset + j); }, tolerance);
  }
  if (op == "all_to_all") {
    // out chunk i, element k came from rank i's in chunk `rank`, element k.
    const std::int64_t chunk = buffers.b.numel() / n;
    return count_wrong(buffers.b, 0, buffers.b.numel(), [&](std::int64_t g) {
      return pattern(static_cast<int>(g / chunk), rank * chunk + g % chunk);
    });
  }
  // sendrecv: what arrived is the left neighbour's buffer.
  const int left = (rank - 1 + n) % n;
  return count_wrong(buffers.b, 0, buffers.b.numel(), [left](std::int64_t g) { return pattern(left, g); });
}

// --- the native peers -----------------------------------------------------------------

#ifdef DTP_HAVE_MPI
MPI_Datatype mpi_type(DType dtype) { return dtype == DType::f64 ? MPI_DOUBLE : MPI_FLOAT; }

/// Element counts and offsets of every rank's chunk, as MPI's v-collectives want them.
void mpi_chunks(std::int64_t count, int n, std::vector<int>& counts, std::vector<int>& offsets) {
  counts.resize(n);
  offsets.resize(n);
  for (int r = 0; r < n; ++r) {
    dtp::ChunkRange range = dtp::chunk_range(count, n, r);
    DTP_CHECK(range.offset + range.length <= 0x7fffffff, "MPI counts are ints: ", count,
              " elements is too many");
    counts[r] = static_cast<int>(range.length);
    offsets[r] = static_cast<int>(range.offset);
  }
}

std::function<void()> mpi_native(const std::string& op, dtp::ReduceOp redop, Buffers& b, Comm& comm, int root,
                                 std::string& why_not) {
  if (redop == dtp::ReduceOp::avg && is_reduction(op)) {
    why_not = "MPI has no average reduction";
    return nullptr;
  }
  const MPI_Op reduce_op = redop == dtp::ReduceOp::max ? MPI_MAX : redop == dtp::ReduceOp::min ? MPI_MIN : MPI_SUM;
  MPI_Comm mpi_comm = *static_cast<MPI_Comm*>(comm.native_handle());
  const MPI_Datatype type = mpi_type(b.a.dtype());
  const int n = comm.size(), rank = comm.rank();
  DTP_CHECK(b.a.numel() <= 0x7fffffff && (!b.b.defined() || b.b.numel() <= 0x7fffffff),
            "MPI counts are ints: the buffer is too large");
  const int count_a = static_cast<int>(b.a.numel());
  if (op == "all_reduce")
    return [=]() mutable { DTP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, b.a.raw(), count_a, type, reduce_op, mpi_comm)); };
  if (op == "broadcast")
    return [=]() mutable { DTP_MPI_CHECK(MPI_Bcast(b.a.raw(), count_a, type, root, mpi_comm)); };
  if (op == "reduce")
    return [=]() mutable {
      if (rank == root)
        DTP_MPI_CHECK(MPI_Reduce(MPI_IN_PLACE, b.a.raw(), count_a, type, reduce_op, root, mpi_comm));
      else
        DTP_MPI_CHECK(MPI_Reduce(b.a.raw(), nullptr, count_a, type, reduce_op, root, mpi_comm));
    };
  if (op == "all_gather") {
    // Chunks may be uneven (chunk_range), so the v-variant.
    auto counts = std::make_shared<std::vector<int>>(), offsets = std::make_shared<std::vector<int>>();
    mpi_chunks(b.b.numel(), n, *counts, *offsets);
    return [=]() mutable {
      DTP_MPI_CHECK(MPI_Allgatherv(b.a.raw(), count_a, type, b.b.raw(), counts->data(),
                                   offsets->data(), type, mpi_comm));
    };
  }
  if (op == "reduce_scatter") {
    auto counts = std::make_shared<std::vector<int>>(), offsets = std::make_shared<std::vector<int>>();
    mpi_chunks(b.a.numel(), n, *counts, *offsets);
    return [=]() mutable {
      DTP_MPI_CHECK(MPI_Reduce_scatter(b.a.raw(), b.b.raw(), counts->data(), type, reduce_op, mpi_comm));
    };
  }
  if (op == "all_to_all") {
    const int chunk = count_a / n;
    return [=]() mutable { DTP_MPI_CHECK(MPI_Alltoall(b.a.raw(), chunk, type, b.b.raw(), chunk, type, mpi_comm)); };
  }
  // sendrecv
  const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
  return [=]() mutable {
    DTP_MPI_CHECK(MPI_Sendrecv(b.a.raw(), count_a, type, right, 0, b.b.raw(), count_a, type, left, 0,
                               mpi_comm, MPI_STATUS_IGNORE));
  };
}
#endif

#ifdef DTP_HAVE_NCCL
std::function<void()> nccl_native(const std::string& op, dtp::ReduceOp redop, Buffers& b, Comm& comm, int root,
                                  std::string& why_not) {
  const ncclRedOp_t reduce_op = redop == dtp::ReduceOp::avg   ? ncclAvg
                                : redop == dtp::ReduceOp::max ? ncclMax
                                : redop == dtp::ReduceOp::min ? ncclMin
                                                              : ncclSum;
  ncclComm_t nccl_comm = *static_cast<ncclComm_t*>(comm.native_handle());
  const ncclDataType_t type = b.a.dtype() == DType::f64 ? ncclFloat64 : ncclFloat32;
  const int n = comm.size(), rank = comm.rank();
  const std::size_t count_a = static_cast<std::size_t>(b.a.numel());
  // The legacy default stream, not the backend's own (which is private): the
  // measurement synchronizes the device before and after the calls it times,
  // so the stream only has to be the same for every native call.
  const cudaStream_t stream = nullptr;
  if (op == "all_reduce")
    return [=]() mutable { DTP_NCCL_CHECK(ncclAllReduce(b.a.raw(), b.a.raw(), count_a, type, reduce_op, nccl_comm, stream)); };
  if (op == "broadcast")
    return [=]() mutable { DTP_NCCL_CHECK(ncclBroadcast(b.a.raw(), b.a.raw(), count_a, type, root, nccl_comm, stream)); };
  if (op == "reduce")
    return [=]() mutable { DTP_NCCL_CHECK(ncclReduce(b.a.raw(), b.a.raw(), count_a, type, reduce_op, root, nccl_comm, stream)); };
  if (op == "all_gather" || op == "reduce_scatter") {
    // NCCL wants equal chunks; DTP's chunk rule allows a short last one.
    const std::int64_t full = op == "all_gather" ? b.b.numel() : b.a.numel();
    if (full % n != 0) {
      why_not = "NCCL needs the count to divide by the world size";
      return nullptr;
    }
    const std::size_t shard = static_cast<std::size_t>(full / n);
    if (op == "all_gather")
      return [=]() mutable { DTP_NCCL_CHECK(ncclAllGather(b.a.raw(), b.b.raw(), shard, type, nccl_comm, stream)); };
    return [=]() mutable {
      DTP_NCCL_CHECK(ncclReduceScatter(b.a.raw(), b.b.raw(), shard, type, reduce_op, nccl_comm, stream));
    };
  }
  const std::size_t element = dtp::dtype_size(b.a.dtype());
  if (op == "all_to_all") {
    // NCCL has no all-to-all call: grouped sends and receives, as nccl-tests does.
    const std::size_t chunk = count_a / n;
    return [=]() mutable {
      DTP_NCCL_CHECK(ncclGroupStart());
      for (int peer = 0; peer < n; ++peer) {
        DTP_NCCL_CHECK(ncclSend(static_cast<const char*>(b.a.raw()) + peer * chunk * element, chunk,
                                type, peer, nccl_comm, stream));
        DTP_NCCL_CHECK(ncclRecv(static_cast<char*>(b.b.raw()) + peer * chunk * element, chunk, type,
                                peer, nccl_comm, stream));
      }
      DTP_NCCL_CHECK(ncclGroupEnd());
    };
  }
  const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
  return [=]() mutable {
    DTP_NCCL_CHECK(ncclGroupStart());
    DTP_NCCL_CHECK(ncclSend(b.a.raw(), count_a, type, right, nccl_comm, stream));
    DTP_NCCL_CHECK(ncclRecv(b.b.raw(), count_a, type, left, nccl_comm, stream));
    DTP_NCCL_CHECK(ncclGroupEnd());
  };
}
#endif

/// The call to time, or nullptr with @p why_not filled in when this
/// implementation cannot run here. The lambdas hold the Buffers' tensors (which
/// share storage with the caller's), so they stay valid as long as needed.
std::function<void()> make_call(const std::string& op, dtp::ReduceOp redop, const std::string& impl, Buffers& b,
                                Comm& comm, int root, std::string& why_not) {
  namespace ch01 = dtp::ch01;
  Comm* c = &comm;
  // Chapter 01's algorithms sum; the library and the native peers take any reduction.
  if (is_reduction(op) && redop != dtp::ReduceOp::sum && impl != "library" && impl != "native") {
    why_not = impl + " (chapter 01) sums only";
    return nullptr;
  }
  if (impl == "native") {
    void* handle = comm.native_handle();
    if (handle == nullptr) {
      why_not = "the " + comm.backend_name() + " backend has no native library to compare with";
      return nullptr;
    }
#ifdef DTP_HAVE_MPI
    if (comm.backend_name() == "mpi") return mpi_native(op, redop, b, comm, root, why_not);
#endif
#ifdef DTP_HAVE_NCCL
    if (comm.backend_name() == "nccl") return nccl_native(op, redop, b, comm, root, why_not);
#endif
    why_not = "this build cannot call the " + comm.backend_name() + " backend's native library";
    return nullptr;
  }
  if (op == "all_reduce") {
    if (impl == "library") return [=]() mutable { c->all_reduce(b.a, redop); };
    if (impl == "ring") return [=]() mutable { ch01::ring_all_reduce(*c, b.a); };
    if (impl == "tree") return [=]() mutable { ch01::tree_all_reduce(*c, b.a); };
    if (impl == "halving_doubling") return [=]() mutable { ch01::halving_doubling_all_reduce(*c, b.a); };
    if (impl == "parameter_server") return [=]() mutable { ch01::parameter_server_all_reduce(*c, b.a, 0); };
  } else if (op == "all_gather") {
    if (impl == "library") return [=]() mutable { c->all_gather(b.a, b.b); };
    if (impl == "ring") return [=]() mutable { ch01::ring_all_gather(*c, b.a, b.b); };
  } else if (op == "reduce_scatter") {
    if (impl == "library") return [=]() mutable { c->reduce_scatter(b.a, b.b, redop); };
    if (impl == "ring") return [=]() mutable { ch01::ring_reduce_scatter(*c, b.a, b.b); };
  } else if (op == "broadcast") {
    if (impl == "library") return [=]() mutable { c->broadcast(b.a, root); };
    if (impl == "tree") return [=]() mutable { ch01::tree_broadcast(*c, b.a, root); };
  } else if (op == "reduce") {
    if (impl == "library") return [=]() mutable { c->reduce(b.a, root, redop); };
    if (impl == "tree") return [=]() mutable { ch01::tree_reduce(*c, b.a, root); };
  } else if (op == "all_to_all") {
    if (impl == "library") return [=]() mutable { c->all_to_all(b.a, b.b); };
    if (impl == "pairwise") return [=]() mutable { ch01::pairwise_all_to_all(*c, b.a, b.b); };
  } else if (op == "sendrecv") {
    // Every rank sends its whole buffer right and receives the left one's.
    if (impl == "library")
      return [=]() mutable {
        const int n = c->size(), rank = c->rank();
        dtp::Request incoming = c->irecv(b.b, (rank - 1 + n) % n, 900);
        c->send(b.a, (rank + 1) % n, 900);
        incoming.wait();
      };
  }
  why_not = impl + " does not implement " + op;
  return nullptr;
}

// --- timing ---------------------------------------------------------------------------

/// Waits for the device's queued work (GPU); nothing to wait for on the host.
void synchronize(const Comm& comm) {
#if defined(DTP_HAVE_CUDA) || defined(DTP_HAVE_NCCL)
  if (comm.device().is_cuda()) DTP_CUDA_CHECK(cudaDeviceSynchronize());
#else
  (void)comm;
#endif
}

/// Combines one number per rank with the library all-reduce (outside any timed region).
double combine(Comm& comm, double value, dtp::ReduceOp op) {
  Tensor t = Tensor::full(Shape{1}, value, DType::f64, comm.device());
  comm.all_reduce(t, op);
  return to_host(t).item(0);
}

/// Seconds per call: `warmup` untimed calls, a barrier, then `iters` timed
/// calls on every rank; the ranks' times combined as -a says (nccl-tests'
/// default: their mean).
double time_calls(Comm& comm, const std::function<void()>& call, int warmup, int iters,
                  Average average = Average::max) {
  // Buffers were just filled on the rank's stream; a native call may use another.
  synchronize(comm);
  for (int i = 0; i < warmup; ++i) call();
  synchronize(comm);
  comm.barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  synchronize(comm);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  switch (average) {
    case Average::rank0: return combine(comm, comm.rank() == 0 ? seconds : 0.0, dtp::ReduceOp::sum);
    case Average::mean: return combine(comm, seconds, dtp::ReduceOp::avg);
    case Average::min: return combine(comm, seconds, dtp::ReduceOp::min);
    case Average::max: break;
  }
  return combine(comm, seconds, dtp::ReduceOp::max);
}

/// The memory roofline at one size: every rank copies its own S-byte buffer
/// at once (memcpy on the host, device-to-device on a GPU). Returns B_copy,
/// bytes read plus written per second over all ranks. A roofline is a bound,
/// so of three timed trials the fastest counts: a trial slowed by something
/// else on the machine does not lower the bar.
double copy_bandwidth(Comm& comm, std::int64_t bytes, int warmup, int iters) {
  const std::int64_t count = std::max<std::int64_t>(1, bytes / 4);
  Tensor source = Tensor::zeros(Shape{count}, DType::f32, comm.device(), dtp::MemoryCategory::comm);
  Tensor target = Tensor::zeros(Shape{count}, DType::f32, comm.device(), dtp::MemoryCategory::comm);
  double seconds = 0;
  for (int trial = 0; trial < 3; ++trial) {
    const double t = time_calls(comm, [&] { target.copy_from(source); }, trial == 0 ? warmup : 0, iters);
    seconds = trial == 0 ? t : std::min(seconds, t);
  }
  return 2.0 * static_cast<double>(target.nbytes()) * comm.size() / seconds;
}

// --- the table ------------------------------------------------------------------------

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 3) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, bytes == std::floor(bytes) ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

struct Context {
  Options options;
  std::string backend, device, git, date, host, cpu;
  std::ofstream json;
  int wrong_rows = 0;  // rows whose check failed (counted on rank 0)
  std::int64_t wrong_elements = 0;  // wrong elements over every row (nccl-tests' "out of bounds values")
};

struct Row {
  std::string op, impl;
  dtp::ReduceOp redop = dtp::ReduceOp::sum;
  std::int64_t bytes = 0, count = 0;
  double seconds = 0, algbw = 0, busbw = 0;
  std::int64_t wrong = -1;  // -1: not checked
  double copy_bw = 0, bound_seconds = 0, roofline_busbw = 0, fraction = 0;
  double predicted_seconds = 0;
};

/// What the redop and root columns show: nccl-tests prints "none" and -1
/// where a collective has no reduction or no root.
std::string redop_column(const std::string& op, dtp::ReduceOp redop) {
  return is_reduction(op) ? dtp::reduce_op_name(redop) : "none";
}
int root_column(const std::string& op, int root) { return op == "broadcast" || op == "reduce" ? root : -1; }

void print_header_row() {
  std::printf("#%12s %12s %6s %6s %4s %-17s %11s %9s %9s %7s %9s %6s %11s\n", "size", "count", "type", "redop",
              "root", "impl", "time", "algbw", "busbw", "#wrong", "roofline", "%roof", "model");
  std::printf("#%12s %12s %6s %6s %4s %-17s %11s %9s %9s %7s %9s %6s %11s\n", "(B)", "(elements)", "", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "(GB/s)", "", "(us)");
}

void print_row(const Row& row, const Options& o) {
  char wrong[16], roofline[16], fraction[16];
  if (row.wrong < 0) std::snprintf(wrong, sizeof wrong, "N/A");
  else std::snprintf(wrong, sizeof wrong, "%lld", static_cast<long long>(row.wrong));
  // A collective with nothing to move (one rank, in place) has no bound to compare with.
  if (row.bound_seconds > 0) {
    std::snprintf(roofline, sizeof roofline, "%9.3f", row.roofline_busbw / kGiga);
    std::snprintf(fraction, sizeof fraction, "%5.1f%%", 100 * row.fraction);
  } else {
    std::snprintf(roofline, sizeof roofline, "%9s", "N/A");
    std::snprintf(fraction, sizeof fraction, "%6s", "N/A");
  }
  std::printf(" %12lld %12lld %6s %6s %4d %-17s %11.2f %9.3f %9.3f %7s %s %s %11.2f\n",
              static_cast<long long>(row.bytes), static_cast<long long>(row.count), dtp::dtype_name(o.dtype),
              redop_column(row.op, row.redop).c_str(), root_column(row.op, o.root), row.impl.c_str(),
              row.seconds * 1e6, row.algbw / kGiga, row.busbw / kGiga, wrong, roofline, fraction,
              row.predicted_seconds * 1e6);
  std::fflush(stdout);
}

void write_json(Context& ctx, const Row& row, const std::string& what, int world, double alpha,
                double beta_rate) {
  if (!ctx.json.is_open()) return;
  const Options& o = ctx.options;
  dtp::JsonLine line(6);  // 6 significant digits
  line.add("what", what).add("op", row.op).add("redop", redop_column(row.op, row.redop))
      .add("root", root_column(row.op, o.root)).add("placement", placement(row.op)).add("impl", row.impl)
      .add("backend", ctx.backend).add("device", ctx.device).add("world", world).add("bytes", row.bytes)
      .add("count", row.count).add("dtype", dtp::dtype_name(o.dtype)).add("time_us", row.seconds * 1e6)
      .add("average", static_cast<int>(o.average)).add("algbw_GBps", row.algbw / kGiga)
      .add("busbw_GBps", row.busbw / kGiga);
  if (row.wrong < 0) line.raw("wrong", "null");
  else line.add("wrong", row.wrong);
  line.add("copy_GBps", row.copy_bw / kGiga)
      .add("bytes_moved", bytes_moved(row.op, world, static_cast<double>(row.bytes)))
      .add("bound_time_us", row.bound_seconds * 1e6).add("roofline_GBps", row.roofline_busbw / kGiga);
  if (row.bound_seconds > 0) line.add("fraction_of_roofline", row.fraction);
  else line.raw("fraction_of_roofline", "null");
  line.add("predicted_time_us", row.predicted_seconds * 1e6)
      .add("predicted_busbw_GBps", row.predicted_seconds > 0
                                       ? row.bytes / row.predicted_seconds * busbw_factor(row.op, world) / kGiga
                                       : 0.0)
      .add("alpha_us", alpha * 1e6).add("beta_GBps", beta_rate / kGiga).add("iters", o.iters)
      .add("warmup", o.warmup).add("check_iters", o.check_iters).add("git", ctx.git).add("date", ctx.date)
      .add("hostname", ctx.host).add("cpu", ctx.cpu);
  ctx.json << line.str() << '\n';
  ctx.json.flush();
  DTP_CHECK(ctx.json.good(), "cannot write the --json file ", ctx.options.json_path, " (a full disk?)");
}

// --- one rank's run ---------------------------------------------------------------------

void run_rank(Comm& comm, Context& ctx) {
  const Options& o = ctx.options;
  const int n = comm.size();
  const bool lead = comm.rank() == 0;
  DTP_CHECK(o.root < n, "-r ", o.root, " is outside the world of ", n, " ranks");
  const std::size_t element = dtp::dtype_size(o.dtype);
  const double alpha = o.alpha_us * 1e-6;
  const char* averages[] = {"rank 0's", "the mean of the ranks'", "the fastest rank's", "the slowest rank's"};

  if (lead) {
    std::printf("# dtp-bench-collectives: backend %s, device %s, world %d, dtype %s, iters %d, warmup %d, check %d\n",
                ctx.backend.c_str(), ctx.device.c_str(), n, dtp::dtype_name(o.dtype), o.iters, o.warmup,
                o.check_iters);
    std::printf("# date %s, host %s, cpu %s, git %s\n", ctx.date.c_str(), ctx.host.c_str(), ctx.cpu.c_str(),
                ctx.git.c_str());
    std::printf("# time: per call, %s time (-a %d)\n", averages[static_cast<int>(o.average)],
                static_cast<int>(o.average));
    std::printf("# busbw = algbw x (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; others 1)\n");
    std::printf("# roofline: the busbw at the %s bound (fewest bytes moved / bandwidth of every rank copying at once)\n",
                comm.device().is_cpu() ? "memcpy" : "device-to-device copy");
    std::printf("# model: alpha-beta prediction, alpha %.3g us, beta %s\n", o.alpha_us,
                o.beta_GBps > 0 ? (std::to_string(o.beta_GBps) + " GB/s").c_str()
                                : "1 / (the per-rank copy rate measured at each size)");
    if (n == 1)
      std::printf("# one rank: nothing moves between ranks, so busbw is 0 (as in nccl-tests); an in-place collective\n"
                  "# has nothing to do (no roofline: N/A) and an out-of-place one is a copy (its roofline is memcpy)\n");
  }

  std::map<std::int64_t, double> copy_rates;  // B_copy by size, measured once per size
  std::set<std::string> noted;                // implementations already reported as skipped
  for (const std::string& op : o.ops) {
    std::vector<std::string> impls;
    for (const std::string& impl : impls_for(op))
      if (o.impls.empty() || std::find(o.impls.begin(), o.impls.end(), impl) != o.impls.end())
        impls.push_back(impl);
    if (lead) {
      std::printf("#\n# %s (%s), busbw factor %.4g\n", op.c_str(), placement(op), busbw_factor(op, n));
      if (impls.empty()) std::printf("# (none of the requested implementations applies to %s)\n", op.c_str());
      else print_header_row();
    }
    if (impls.empty()) continue;

    const std::vector<dtp::ReduceOp> redops =
        is_reduction(op) ? o.redops : std::vector<dtp::ReduceOp>{dtp::ReduceOp::sum};
    std::map<std::string, Row> largest;  // per redop/impl, the row at the largest size
    double busbw_sum = 0;                // for the table's "Avg bus bandwidth", as nccl-tests
    int rows = 0;
    std::int64_t table_wrong = 0;
    for (std::int64_t size : sizes(o)) {
      std::int64_t count = std::max<std::int64_t>(1, size / static_cast<std::int64_t>(element));
      if (op == "all_to_all") count = (count + n - 1) / n * n;  // equal chunks for every pair
      const std::int64_t bytes = count * static_cast<std::int64_t>(element);

      if (!copy_rates.count(bytes)) copy_rates[bytes] = copy_bandwidth(comm, bytes, o.warmup, o.iters);
      const double copy_bw = copy_rates[bytes];
      const double beta_rate = o.beta_GBps > 0 ? o.beta_GBps * kGiga : copy_bw / (2.0 * n);
      const double bound = bytes_moved(op, n, static_cast<double>(bytes)) / copy_bw;

      Buffers buffers = make_buffers(op, count, comm, o.dtype);
      for (dtp::ReduceOp redop : redops) {
        for (const std::string& impl : impls) {
          std::string why_not;
          std::function<void()> call = make_call(op, redop, impl, buffers, comm, o.root, why_not);
          const std::string label = op + "/" + redop_column(op, redop) + "/" + impl;
          if (!call) {
            if (lead && noted.insert(label).second)
              std::printf("# %s %s%s: skipped, %s\n", op.c_str(), impl.c_str(),
                          is_reduction(op) ? (" " + redop_column(op, redop)).c_str() : "", why_not.c_str());
            continue;
          }
          Row row;
          row.op = op;
          row.impl = impl;
          row.redop = redop;
          row.bytes = bytes;
          row.count = count;
          zero_buffers(buffers);
          row.seconds = time_calls(comm, call, o.warmup, o.iters, o.average);
          if (o.check_iters > 0) {
            // As nccl-tests: after the timed calls, calls on known values, each checked.
            row.wrong = 0;
            for (int check = 0; check < o.check_iters; ++check) {
              fill_for_check(op, buffers, comm, o.root);
              synchronize(comm);
              comm.barrier();
              call();
              synchronize(comm);
              row.wrong += static_cast<std::int64_t>(combine(
                  comm, static_cast<double>(wrong_elements(op, redop, buffers, comm, o.root)), dtp::ReduceOp::sum));
            }
          }
          row.algbw = bytes / row.seconds;
          row.busbw = row.algbw * busbw_factor(op, n);
          row.copy_bw = copy_bw;
          row.bound_seconds = bound;
          row.roofline_busbw = bound > 0 ? bytes / bound * busbw_factor(op, n) : 0.0;
          row.fraction = bound / row.seconds;
          row.predicted_seconds =
              predicted_seconds(op, impl, n, static_cast<double>(bytes), alpha, 1.0 / beta_rate);
          largest[label] = row;
          busbw_sum += row.busbw;
          ++rows;
          if (lead) {
            if (row.wrong > 0) {
              ++ctx.wrong_rows;
              table_wrong += row.wrong;
              ctx.wrong_elements += row.wrong;
            }
            print_row(row, o);
            write_json(ctx, row, "collective", n, alpha, beta_rate);
          }
        }
      }
      if (lead && bound > 0) {
        // The roofline itself: one JSON object per size, with "memcpy" as the impl.
        Row roof;
        roof.op = op;
        roof.impl = comm.device().is_cpu() ? "memcpy" : "d2d_copy";
        roof.bytes = bytes;
        roof.count = count;
        roof.seconds = bound;
        roof.algbw = bytes / bound;
        roof.busbw = roof.algbw * busbw_factor(op, n);
        roof.copy_bw = copy_bw;
        roof.bound_seconds = bound;
        roof.roofline_busbw = roof.busbw;
        roof.fraction = 1.0;
        write_json(ctx, roof, "roofline", n, alpha, beta_rate);
      }
    }
    if (lead && !largest.empty()) {
      // nccl-tests ends its table with these two lines; here every table does.
      std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(table_wrong),
                  table_wrong == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %.4g  (GB/s, the mean busbw of this table's %d rows)\n",
                  rows > 0 ? busbw_sum / rows / kGiga : 0.0, rows);
      const Row& any = largest.begin()->second;
      std::printf("# %s at %s per rank, %d rank%s: copy bandwidth %.3f GB/s (all ranks), bound %.2f us\n",
                  op.c_str(), human_bytes(static_cast<double>(any.bytes)).c_str(), n, n == 1 ? "" : "s",
                  any.copy_bw / kGiga,
                  any.bound_seconds * 1e6);
      for (const auto& [label, row] : largest) {
        char roof[48] = "no roofline (nothing to move)";
        if (row.bound_seconds > 0) std::snprintf(roof, sizeof roof, "%5.1f%% of the roofline", 100 * row.fraction);
        std::printf("#   %-26s %11.2f us  busbw %8.3f GB/s  %s  (model %.2f us)%s\n",
                    (is_reduction(op) ? redop_column(op, row.redop) + " " + row.impl : row.impl).c_str(),
                    row.seconds * 1e6, row.busbw / kGiga, roof, row.predicted_seconds * 1e6,
                    row.wrong > 0 ? "  WRONG RESULTS" : "");
      }
    }
  }
  if (lead) std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Context ctx;
  if (auto status = parse_options(ctx.options, argc, argv)) return *status;
  try {
    dtp::World world = dtp::World::from_env(ctx.options.world);
    world.size = world_size_for(world, ctx.options);
    ctx.backend = dtp::backend_name(world.backend);
    ctx.device = world.device.str();
    ctx.git = git_revision();
    ctx.date = utc_now();
    ctx.host = host_name();
    ctx.cpu = cpu_model();
    dtp::launch(world, [&](Comm& comm) {
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
      std::fprintf(stderr, "dtp-bench-collectives: %d measurements had wrong results (#wrong column)\n",
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
