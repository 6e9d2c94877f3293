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
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "01_collectives/collectives.h"
#include "bench_common.h"
#include "dtp/dtp.h"
#include "dtp/json.h"

#ifdef DTP_HAVE_MPI
#include <mpi.h>
#endif
#if defined(DTP_HAVE_CUDA) || defined(DTP_HAVE_NCCL)
#include <cuda_runtime.h>
#endif
#ifdef DTP_HAVE_NCCL
#include <nccl.h>
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

// --- checked calls into the native libraries -----------------------------------

#ifdef DTP_HAVE_MPI
#define DTP_MPI_CHECK(call)                                                          \
  do {                                                                               \
    int mpi_status_ = (call);                                                        \
    if (mpi_status_ != MPI_SUCCESS) {                                                \
      char mpi_text_[MPI_MAX_ERROR_STRING];                                          \
      int mpi_length_ = 0;                                                           \
      MPI_Error_string(mpi_status_, mpi_text_, &mpi_length_);                        \
      throw dtp::Error(dtp::detail::concat(__FILE__, ":", __LINE__, ": ", #call,     \
                                           " failed: ", std::string(mpi_text_, mpi_length_))); \
    }                                                                                \
  } while (0)
#endif
#if defined(DTP_HAVE_CUDA) || defined(DTP_HAVE_NCCL)
#define DTP_CUDA_CHECK(call)                                                         \
  do {                                                                               \
    cudaError_t cuda_status_ = (call);                                               \
    if (cuda_status_ != cudaSuccess)                                                 \
      throw dtp::Error(dtp::detail::concat(__FILE__, ":", __LINE__, ": ", #call,     \
                                           " failed: ", cudaGetErrorString(cuda_status_))); \
  } while (0)
#endif
#ifdef DTP_HAVE_NCCL
#define DTP_NCCL_CHECK(call)                                                         \
  do {                                                                               \
    ncclResult_t nccl_status_ = (call);                                              \
    if (nccl_status_ != ncclSuccess)                                                 \
      throw dtp::Error(dtp::detail::concat(__FILE__, ":", __LINE__, ": ", #call,     \
                                           " failed: ", ncclGetErrorString(nccl_status_))); \
  } while (0)
#endif

// --- command line ----------------------------------------------------------------

struct Options {
  std::int64_t min_bytes = 32 << 20;  // -b
  std::int64_t max_bytes = 32 << 20;  // -e
  double factor = 2.0;                // -f: next size = size * factor
  std::int64_t step_bytes = 0;        // -i: next size = size + step (overrides -f)
  int iters = 20;                     // -n
  int warmup = 5;                     // -w
  bool check = true;                  // -c
  int world = 4;                      // -g (thread backend; mpi uses the MPI world)
  bool world_given = false;           // -g on the command line
  int root = 0;                       // -r: root of broadcast and reduce
  std::vector<std::string> ops{"all_reduce"};  // -o
  std::vector<std::string> impls;     // --impl; empty = every one that applies
  DType dtype = DType::f32;           // --dtype / -d
  std::string json_path;              // --json (appended to)
  double alpha_us = 5.0;              // --alpha-us
  double beta_GBps = 0.0;             // --beta-GBps; 0 = per-rank copy rate measured here
};

const std::vector<std::string> kAllOps = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                          "reduce",     "all_to_all", "sendrecv"};

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

void print_usage() {
  std::printf(
      "usage: dtp-bench-collectives [options]\n"
      "  -b, --minbytes N     smallest size (bytes; K, M, G suffixes are powers of 1024) [32M]\n"
      "  -e, --maxbytes N     largest size [32M]\n"
      "  -f, --stepfactor F   multiply the size by F between steps [2]\n"
      "  -i, --stepbytes N    add N bytes between steps instead of multiplying\n"
      "  -n, --iters N        timed calls per measurement [20]\n"
      "  -w, --warmup N       untimed calls before them [5]\n"
      "  -c, --check 0|1      check every result and count wrong elements [1]\n"
      "  -g, --world N        ranks of the thread backend [4]; under mpi the MPI world\n"
      "  -o, --op LIST        all_reduce, all_gather, reduce_scatter, broadcast, reduce,\n"
      "                       all_to_all, sendrecv, comma-separated, or all [all_reduce]\n"
      "  --impl LIST          library, ring, tree, halving_doubling, parameter_server,\n"
      "                       pairwise, native [every one that applies to the op]\n"
      "  -d, --dtype T        f32 or f64 [f32]\n"
      "  -r, --root N         root of broadcast and reduce [0]\n"
      "  --json FILE          append one JSON object per measurement to FILE\n"
      "  --alpha-us A         alpha-beta model: cost of one message [5]\n"
      "  --beta-GBps B        alpha-beta model: per-rank bandwidth [measured copy rate]\n"
      "Backend and device come from DTP_BACKEND (thread, mpi, nccl) and DTP_DEVICE (cpu, cuda).\n");
}

std::int64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  DTP_CHECK(end != text.c_str() && value >= 0, "cannot read a size from '", text, "'");
  std::string suffix(end);
  double scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB") scale = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MB" || suffix == "MiB") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GB" || suffix == "GiB") scale = 1024.0 * 1024 * 1024;
  else DTP_CHECK(suffix.empty() || suffix == "B", "unknown size suffix in '", text, "': use K, M or G");
  return static_cast<std::int64_t>(value * scale);
}

int parse_int(const std::string& text, const char* what) {
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  DTP_CHECK(end != text.c_str() && *end == '\0', what, " must be an integer, got '", text, "'");
  return static_cast<int>(value);
}

double parse_double(const std::string& text, const char* what) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  DTP_CHECK(end != text.c_str() && *end == '\0', what, " must be a number, got '", text, "'");
  return value;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    // Accept "--flag=value" as well as "--flag value".
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (flag == "-h" || flag == "--help") {
      print_usage();
      std::exit(0);
    } else {
      DTP_CHECK(i + 1 < argc, "option ", flag, " needs a value (see --help)");
      value = argv[++i];
    }
    if (flag == "-b" || flag == "--minbytes") o.min_bytes = parse_bytes(value);
    else if (flag == "-e" || flag == "--maxbytes") o.max_bytes = parse_bytes(value);
    else if (flag == "-f" || flag == "--stepfactor") o.factor = parse_double(value, "-f");
    else if (flag == "-i" || flag == "--stepbytes") o.step_bytes = parse_bytes(value);
    else if (flag == "-n" || flag == "--iters") o.iters = parse_int(value, "-n");
    else if (flag == "-w" || flag == "--warmup") o.warmup = parse_int(value, "-w");
    else if (flag == "-c" || flag == "--check") o.check = parse_int(value, "-c") != 0;
    else if (flag == "-g" || flag == "--world") {
      o.world = parse_int(value, "-g");
      o.world_given = true;
    }
    else if (flag == "-r" || flag == "--root") o.root = parse_int(value, "-r");
    else if (flag == "-o" || flag == "--op") o.ops = value == "all" ? kAllOps : split_list(value);
    else if (flag == "--impl") o.impls = value == "all" ? std::vector<std::string>{} : split_list(value);
    else if (flag == "-d" || flag == "--dtype") o.dtype = dtp::parse_dtype(value == "float" ? "f32" : value == "double" ? "f64" : value);
    else if (flag == "--json") o.json_path = value;
    else if (flag == "--alpha-us") o.alpha_us = parse_double(value, "--alpha-us");
    else if (flag == "--beta-GBps") o.beta_GBps = parse_double(value, "--beta-GBps");
    else DTP_CHECK(false, "unknown option '", flag, "' (see --help)");
  }
  DTP_CHECK(o.min_bytes >= 1 && o.max_bytes >= o.min_bytes, "sizes: need 1 <= -b <= -e, got -b ",
            o.min_bytes, " -e ", o.max_bytes);
  DTP_CHECK(o.step_bytes > 0 || o.factor > 1 || o.min_bytes == o.max_bytes,
            "sizes: -f must be above 1 (or give -i) to go from -b to -e");
  DTP_CHECK(o.iters >= 1 && o.warmup >= 0, "-n must be >= 1 and -w >= 0");
  DTP_CHECK(o.world >= 1, "-g must be >= 1");
  DTP_CHECK(o.dtype == DType::f32 || o.dtype == DType::f64, "--dtype: f32 or f64, got ",
            dtp::dtype_name(o.dtype));
  DTP_CHECK(o.alpha_us >= 0 && o.beta_GBps >= 0, "--alpha-us and --beta-GBps must be >= 0");
  for (const std::string& op : o.ops)
    DTP_CHECK(!impls_for(op).empty(), "unknown operation '", op, "': expected one of all_reduce, ",
              "all_gather, reduce_scatter, broadcast, reduce, all_to_all, sendrecv or all");
  const std::set<std::string> known = {"library", "ring", "tree", "halving_doubling",
                                       "parameter_server", "pairwise", "native"};
  for (const std::string& impl : o.impls)
    DTP_CHECK(known.count(impl), "unknown implementation '", impl, "': expected library, ring, ",
              "tree, halving_doubling, parameter_server, pairwise or native");
  return o;
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

// JSON pieces come from dtp/json.h; numbers keep 6 significant digits here.
std::string json_quote(const std::string& text) { return dtp::json_string(text); }
std::string json_number(double value) { return dtp::json_number(value, 6); }

class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& value) {
    return raw(key, json_quote(value));
  }
  JsonLine& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonLine& add(const std::string& key, double value) { return raw(key, json_number(value)); }
  JsonLine& add(const std::string& key, std::int64_t value) { return raw(key, std::to_string(value)); }
  JsonLine& add(const std::string& key, int value) { return raw(key, std::to_string(value)); }
  JsonLine& raw(const std::string& key, const std::string& value) {
    text_ += (text_.empty() ? "{" : ", ") + json_quote(key) + ": " + value;
    return *this;
  }
  std::string str() const { return text_ + "}"; }

 private:
  std::string text_;
};

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
/// bound is therefore exactly the memcpy time of the same buffers.
double bytes_moved(const std::string& op, int n, double S) {
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
std::int64_t count_wrong(const Tensor& t, std::int64_t begin, std::int64_t end,
                         const std::function<double(std::int64_t)>& expected) {
  Tensor host = to_host(t);
  std::int64_t wrong = 0;
  auto scan = [&](const auto* p) {
    for (std::int64_t g = begin; g < end; ++g)
      if (static_cast<double>(p[g]) != expected(g)) ++wrong;
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
std::int64_t wrong_elements(const std::string& op, const Buffers& buffers, const Comm& comm, int root) {
  const int n = comm.size(), rank = comm.rank();
  if (op == "all_reduce")
    return count_wrong(buffers.a, 0, buffers.a.numel(), [n](std::int64_t g) { return pattern_sum(n, g); });
  if (op == "reduce") {
    if (rank != root) return 0;  // other ranks' x is scratch for some algorithms
    return count_wrong(buffers.a, 0, buffers.a.numel(), [n](std::int64_t g) { return pattern_sum(n, g); });
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
                       [&](std::int64_t j) { return pattern_sum(n, offset + j); });
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

std::function<void()> mpi_native(const std::string& op, Buffers& b, Comm& comm, int root) {
  MPI_Comm mpi_comm = *static_cast<MPI_Comm*>(comm.native_handle());
  const MPI_Datatype type = mpi_type(b.a.dtype());
  const int n = comm.size(), rank = comm.rank();
  DTP_CHECK(b.a.numel() <= 0x7fffffff && (!b.b.defined() || b.b.numel() <= 0x7fffffff),
            "MPI counts are ints: the buffer is too large");
  const int count_a = static_cast<int>(b.a.numel());
  if (op == "all_reduce")
    return [=]() mutable { DTP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, b.a.raw(), count_a, type, MPI_SUM, mpi_comm)); };
  if (op == "broadcast")
    return [=]() mutable { DTP_MPI_CHECK(MPI_Bcast(b.a.raw(), count_a, type, root, mpi_comm)); };
  if (op == "reduce")
    return [=]() mutable {
      if (rank == root)
        DTP_MPI_CHECK(MPI_Reduce(MPI_IN_PLACE, b.a.raw(), count_a, type, MPI_SUM, root, mpi_comm));
      else
        DTP_MPI_CHECK(MPI_Reduce(b.a.raw(), nullptr, count_a, type, MPI_SUM, root, mpi_comm));
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
      DTP_MPI_CHECK(MPI_Reduce_scatter(b.a.raw(), b.b.raw(), counts->data(), type, MPI_SUM, mpi_comm));
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
std::function<void()> nccl_native(const std::string& op, Buffers& b, Comm& comm, int root,
                                  std::string& why_not) {
  ncclComm_t nccl_comm = *static_cast<ncclComm_t*>(comm.native_handle());
  const ncclDataType_t type = b.a.dtype() == DType::f64 ? ncclFloat64 : ncclFloat32;
  const int n = comm.size(), rank = comm.rank();
  const std::size_t count_a = static_cast<std::size_t>(b.a.numel());
  // The legacy default stream, not the backend's own (which is private): the
  // measurement synchronizes the device before and after the calls it times,
  // so the stream only has to be the same for every native call.
  const cudaStream_t stream = nullptr;
  if (op == "all_reduce")
    return [=]() mutable { DTP_NCCL_CHECK(ncclAllReduce(b.a.raw(), b.a.raw(), count_a, type, ncclSum, nccl_comm, stream)); };
  if (op == "broadcast")
    return [=]() mutable { DTP_NCCL_CHECK(ncclBroadcast(b.a.raw(), b.a.raw(), count_a, type, root, nccl_comm, stream)); };
  if (op == "reduce")
    return [=]() mutable { DTP_NCCL_CHECK(ncclReduce(b.a.raw(), b.a.raw(), count_a, type, ncclSum, root, nccl_comm, stream)); };
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
      DTP_NCCL_CHECK(ncclReduceScatter(b.a.raw(), b.b.raw(), shard, type, ncclSum, nccl_comm, stream));
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
std::function<void()> make_call(const std::string& op, const std::string& impl, Buffers& b,
                                Comm& comm, int root, std::string& why_not) {
  namespace ch01 = dtp::ch01;
  Comm* c = &comm;
  if (impl == "native") {
    void* handle = comm.native_handle();
    if (handle == nullptr) {
      why_not = "the " + comm.backend_name() + " backend has no native library to compare with";
      return nullptr;
    }
#ifdef DTP_HAVE_MPI
    if (comm.backend_name() == "mpi") return mpi_native(op, b, comm, root);
#endif
#ifdef DTP_HAVE_NCCL
    if (comm.backend_name() == "nccl") return nccl_native(op, b, comm, root, why_not);
#endif
    why_not = "this build cannot call the " + comm.backend_name() + " backend's native library";
    return nullptr;
  }
  if (op == "all_reduce") {
    if (impl == "library") return [=]() mutable { c->all_reduce(b.a); };
    if (impl == "ring") return [=]() mutable { ch01::ring_all_reduce(*c, b.a); };
    if (impl == "tree") return [=]() mutable { ch01::tree_all_reduce(*c, b.a); };
    if (impl == "halving_doubling") return [=]() mutable { ch01::halving_doubling_all_reduce(*c, b.a); };
    if (impl == "parameter_server") return [=]() mutable { ch01::parameter_server_all_reduce(*c, b.a, 0); };
  } else if (op == "all_gather") {
    if (impl == "library") return [=]() mutable { c->all_gather(b.a, b.b); };
    if (impl == "ring") return [=]() mutable { ch01::ring_all_gather(*c, b.a, b.b); };
  } else if (op == "reduce_scatter") {
    if (impl == "library") return [=]() mutable { c->reduce_scatter(b.a, b.b); };
    if (impl == "ring") return [=]() mutable { ch01::ring_reduce_scatter(*c, b.a, b.b); };
  } else if (op == "broadcast") {
    if (impl == "library") return [=]() mutable { c->broadcast(b.a, root); };
    if (impl == "tree") return [=]() mutable { ch01::tree_broadcast(*c, b.a, root); };
  } else if (op == "reduce") {
    if (impl == "library") return [=]() mutable { c->reduce(b.a, root); };
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
/// calls on every rank; the slowest rank's average.
double time_calls(Comm& comm, const std::function<void()>& call, int warmup, int iters) {
  // Buffers were just filled on the rank's stream; a native call may use another.
  synchronize(comm);
  for (int i = 0; i < warmup; ++i) call();
  synchronize(comm);
  comm.barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  synchronize(comm);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return combine(comm, seconds / iters, dtp::ReduceOp::max);
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
};

struct Row {
  std::string op, impl;
  std::int64_t bytes = 0, count = 0;
  double seconds = 0, algbw = 0, busbw = 0;
  std::int64_t wrong = -1;  // -1: not checked
  double copy_bw = 0, bound_seconds = 0, roofline_busbw = 0, fraction = 0;
  double predicted_seconds = 0;
};

void print_header_row() {
  std::printf("#%12s %12s %5s %-17s %11s %9s %9s %7s %9s %6s %11s\n", "size", "count", "type", "impl",
              "time", "algbw", "busbw", "#wrong", "roofline", "%roof", "model");
  std::printf("#%12s %12s %5s %-17s %11s %9s %9s %7s %9s %6s %11s\n", "(B)", "(elements)", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "(GB/s)", "", "(us)");
}

void print_row(const Row& row, const Options& o) {
  char wrong[16];
  if (row.wrong < 0) std::snprintf(wrong, sizeof wrong, "N/A");
  else std::snprintf(wrong, sizeof wrong, "%lld", static_cast<long long>(row.wrong));
  std::printf(" %12lld %12lld %5s %-17s %11.2f %9.3f %9.3f %7s %9.3f %5.1f%% %11.2f\n",
              static_cast<long long>(row.bytes), static_cast<long long>(row.count),
              dtp::dtype_name(o.dtype), row.impl.c_str(), row.seconds * 1e6, row.algbw / kGiga,
              row.busbw / kGiga, wrong, row.roofline_busbw / kGiga, 100 * row.fraction,
              row.predicted_seconds * 1e6);
  std::fflush(stdout);
}

void write_json(Context& ctx, const Row& row, const std::string& what, int world, double alpha,
                double beta_rate) {
  if (!ctx.json.is_open()) return;
  const Options& o = ctx.options;
  JsonLine line;
  line.add("what", what).add("op", row.op).add("impl", row.impl).add("backend", ctx.backend)
      .add("device", ctx.device).add("world", world).add("bytes", row.bytes).add("count", row.count)
      .add("dtype", dtp::dtype_name(o.dtype)).add("time_us", row.seconds * 1e6)
      .add("algbw_GBps", row.algbw / kGiga).add("busbw_GBps", row.busbw / kGiga);
  if (row.wrong < 0) line.raw("wrong", "null");
  else line.add("wrong", row.wrong);
  line.add("copy_GBps", row.copy_bw / kGiga)
      .add("bytes_moved", bytes_moved(row.op, world, static_cast<double>(row.bytes)))
      .add("bound_time_us", row.bound_seconds * 1e6).add("roofline_GBps", row.roofline_busbw / kGiga)
      .add("fraction_of_roofline", row.fraction).add("predicted_time_us", row.predicted_seconds * 1e6)
      .add("predicted_busbw_GBps", row.predicted_seconds > 0
                                       ? row.bytes / row.predicted_seconds * busbw_factor(row.op, world) / kGiga
                                       : 0.0)
      .add("alpha_us", alpha * 1e6).add("beta_GBps", beta_rate / kGiga).add("iters", o.iters)
      .add("warmup", o.warmup).add("git", ctx.git).add("date", ctx.date).add("hostname", ctx.host)
      .add("cpu", ctx.cpu);
  ctx.json << line.str() << '\n';
  ctx.json.flush();
}

// --- one rank's run ---------------------------------------------------------------------

void run_rank(Comm& comm, Context& ctx) {
  const Options& o = ctx.options;
  const int n = comm.size();
  const bool lead = comm.rank() == 0;
  DTP_CHECK(o.root < n, "-r ", o.root, " is outside the world of ", n, " ranks");
  const std::size_t element = dtp::dtype_size(o.dtype);
  const double alpha = o.alpha_us * 1e-6;

  if (lead) {
    std::printf("# dtp-bench-collectives: backend %s, device %s, world %d, dtype %s, iters %d, warmup %d, check %d\n",
                ctx.backend.c_str(), ctx.device.c_str(), n, dtp::dtype_name(o.dtype), o.iters, o.warmup,
                o.check ? 1 : 0);
    std::printf("# date %s, host %s, cpu %s, git %s\n", ctx.date.c_str(), ctx.host.c_str(), ctx.cpu.c_str(),
                ctx.git.c_str());
    std::printf("# busbw = algbw x (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; others 1)\n");
    std::printf("# roofline: the busbw at the %s bound (fewest bytes moved / bandwidth of every rank copying at once)\n",
                comm.device().is_cpu() ? "memcpy" : "device-to-device copy");
    std::printf("# model: alpha-beta prediction, alpha %.3g us, beta %s\n", o.alpha_us,
                o.beta_GBps > 0 ? (std::to_string(o.beta_GBps) + " GB/s").c_str()
                                : "1 / (the per-rank copy rate measured at each size)");
  }

  std::map<std::int64_t, double> copy_rates;  // B_copy by size, measured once per size
  std::set<std::string> noted;                // implementations already reported as skipped
  for (const std::string& op : o.ops) {
    std::vector<std::string> impls;
    for (const std::string& impl : impls_for(op))
      if (o.impls.empty() || std::find(o.impls.begin(), o.impls.end(), impl) != o.impls.end())
        impls.push_back(impl);
    if (lead) {
      std::printf("#\n# %s, busbw factor %.4g\n", op.c_str(), busbw_factor(op, n));
      if (impls.empty()) std::printf("# (none of the requested implementations applies to %s)\n", op.c_str());
      else print_header_row();
    }
    if (impls.empty()) continue;

    std::map<std::string, Row> largest;  // per impl, the row at the largest size
    for (std::int64_t size : sizes(o)) {
      std::int64_t count = std::max<std::int64_t>(1, size / static_cast<std::int64_t>(element));
      if (op == "all_to_all") count = (count + n - 1) / n * n;  // equal chunks for every pair
      const std::int64_t bytes = count * static_cast<std::int64_t>(element);

      if (!copy_rates.count(bytes)) copy_rates[bytes] = copy_bandwidth(comm, bytes, o.warmup, o.iters);
      const double copy_bw = copy_rates[bytes];
      const double beta_rate = o.beta_GBps > 0 ? o.beta_GBps * kGiga : copy_bw / (2.0 * n);
      const double bound = bytes_moved(op, n, static_cast<double>(bytes)) / copy_bw;

      Buffers buffers = make_buffers(op, count, comm, o.dtype);
      for (const std::string& impl : impls) {
        std::string why_not;
        std::function<void()> call = make_call(op, impl, buffers, comm, o.root, why_not);
        if (!call) {
          if (lead && noted.insert(op + "/" + impl).second)
            std::printf("# %s %s: skipped, %s\n", op.c_str(), impl.c_str(), why_not.c_str());
          continue;
        }
        Row row;
        row.op = op;
        row.impl = impl;
        row.bytes = bytes;
        row.count = count;
        zero_buffers(buffers);
        row.seconds = time_calls(comm, call, o.warmup, o.iters);
        if (o.check) {
          // As nccl-tests: after the timed calls, one call on known values.
          fill_for_check(op, buffers, comm, o.root);
          synchronize(comm);
          comm.barrier();
          call();
          synchronize(comm);
          row.wrong = static_cast<std::int64_t>(
              combine(comm, static_cast<double>(wrong_elements(op, buffers, comm, o.root)), dtp::ReduceOp::sum));
        }
        row.algbw = bytes / row.seconds;
        row.busbw = row.algbw * busbw_factor(op, n);
        row.copy_bw = copy_bw;
        row.bound_seconds = bound;
        row.roofline_busbw = bytes / bound * busbw_factor(op, n);
        row.fraction = bound / row.seconds;
        row.predicted_seconds =
            predicted_seconds(op, impl, n, static_cast<double>(bytes), alpha, 1.0 / beta_rate);
        largest[impl] = row;
        if (lead) {
          if (row.wrong > 0) ++ctx.wrong_rows;
          print_row(row, o);
          write_json(ctx, row, "collective", n, alpha, beta_rate);
        }
      }
      if (lead) {
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
      const Row& any = largest.begin()->second;
      std::printf("# %s at %s per rank, %d ranks: copy bandwidth %.3f GB/s (all ranks), bound %.2f us\n",
                  op.c_str(), human_bytes(static_cast<double>(any.bytes)).c_str(), n, any.copy_bw / kGiga,
                  any.bound_seconds * 1e6);
      for (const std::string& impl : impls) {
        auto it = largest.find(impl);
        if (it == largest.end()) continue;
        const Row& row = it->second;
        std::printf("#   %-17s %11.2f us  busbw %8.3f GB/s  %5.1f%% of the roofline  (model %.2f us)%s\n",
                    impl.c_str(), row.seconds * 1e6, row.busbw / kGiga, 100 * row.fraction,
                    row.predicted_seconds * 1e6, row.wrong > 0 ? "  WRONG RESULTS" : "");
      }
    }
  }
  if (lead) std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Context ctx;
  try {
    ctx.options = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-bench-collectives: %s\n", e.what());
    return 2;
  }
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
