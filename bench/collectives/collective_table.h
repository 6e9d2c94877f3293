// The collective table: one entry per collective, as nccl-tests has one
// struct testColl per collective. An entry holds everything that differs
// between collectives: whether it reduces, is in place or has a root, which
// implementations run it and what the alpha-beta model charges each, its
// nccl-tests busbw factor, the fewest bytes it must move, its buffers, the
// values of a checked call and the check itself, and its calls through the
// library, chapter 01 and the backends' own libraries. The measuring code
// looks an entry up once and asks it; it never tests a collective's name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtp/dtp.h"

namespace dtp::bench::collectives {

/// The buffers of one collective on one rank; what each holds is the entry's
/// make_buffers. An in-place collective has only `a`.
struct Buffers {
  dtp::Tensor a, b;
};

/// What one call needs. The buffers are copies that share the caller's
/// storage, so a call holding them stays valid as long as it is timed.
struct CallArgs {
  Buffers buffers;
  dtp::Comm* comm = nullptr;
  int root = 0;
  dtp::ReduceOp redop = dtp::ReduceOp::sum;
};

/// The call a measurement times.
using Call = std::function<void()>;

/// An implementation of a collective on this rank (library or chapter 01).
using Run = void (*)(CallArgs& args);

/// A backend's own library: the call, or an empty one after saying in
/// @p why_not why the library cannot run this collective here.
using MakeNativeCall = Call (*)(const CallArgs& args, std::string& why_not);

/// The alpha-beta model's seconds for n >= 2 ranks and size S: alpha per
/// message round on the critical path, beta per byte a rank sends on it.
using Model = double (*)(int n, double S, double alpha, double beta);

struct Implementation {
  const char* name;  // the --impl name: library, ring, tree, ..., native
  Run run;           // null for native: the entry's mpi or nccl call, by backend
  bool sums_only;    // chapter 01's algorithms sum; the library and the native peers take any
                     // reduction
  Model model;

  /// The model's time; a world of one rank sends nothing (0).
  double predicted_seconds(int n, double S, double alpha, double beta) const;
};

struct Collective {
  const char* name;   // the --collective name and the JSON "op"
  bool reduces;       // takes a reduction operator (-o)
  bool in_place;      // one buffer is input and output, as Comm and chapter 01 define it
  bool has_root;      // takes -r
  bool equal_chunks;  // every pair of ranks exchanges the same count: it rounds up to a multiple of
                      // the world
  std::vector<Implementation> implementations;  // in table order
  /// nccl-tests' bus-bandwidth factor: busbw = algbw * factor.
  double (*busbw_factor)(int n);
  /// The fewest bytes n >= 2 ranks must read plus write in memory, over all
  /// of them, for size S: every input byte read once, every output byte
  /// written once, no intermediate copies (bench/README.md has the table).
  double (*fewest_bytes)(int n, double S);
  /// This rank's buffers for @p count elements of the size column's buffer.
  Buffers (*make_buffers)(std::int64_t count, const dtp::Comm& comm, dtp::DType dtype);
  /// Fills the inputs with pattern() and the outputs with -1 before a checked call.
  void (*fill_for_check)(Buffers& buffers, const dtp::Comm& comm, int root);
  /// Wrong elements on this rank after a checked call.
  std::int64_t (*wrong_elements)(dtp::ReduceOp redop, const Buffers& buffers, const dtp::Comm& comm,
                                 int root);
  MakeNativeCall mpi;   // null where this build has no MPI
  MakeNativeCall nccl;  // null where this build has no NCCL

  /// "in-place" or "out-of-place", as nccl-tests prints it.
  const char* placement() const { return in_place ? "in-place" : "out-of-place"; }
  /// The redop column: nccl-tests prints "none" where a collective does not reduce.
  std::string redop_column(dtp::ReduceOp redop) const;
  /// The root column: nccl-tests prints -1 where a collective has no root.
  int root_column(int root) const { return has_root ? root : -1; }
  /// fewest_bytes for any world. One rank moves nothing between ranks: in
  /// place it has nothing to do (its input is its result), out of place it
  /// copies S bytes.
  double bytes_moved(int n, double S) const;
};

/// Every collective, in the order of --collective all.
const std::vector<Collective>& collective_table();

/// The entry named @p name; throws dtp::Error for a name not in the table.
const Collective& find_collective(const std::string& name);

/// The collectives' names, in table order.
std::vector<std::string> collective_names();

/// Every implementation's name, each once in table order, native last (as
/// --help lists them).
std::vector<std::string> implementation_names();

/// The call to time, or an empty one after saying in @p why_not why
/// @p implementation cannot run here (a reduction chapter 01 lacks, a backend
/// without a native library).
Call make_call(const Collective& collective, const Implementation& implementation,
               const CallArgs& args, std::string& why_not);

}  // namespace dtp::bench::collectives
