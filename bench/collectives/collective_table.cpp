// The seven collectives nccl-tests measures that DTP's Comm has, one entry
// each, and the generic lookups over them.
#include "collective_table.h"

#include <algorithm>
#include <string>
#include <vector>

#include "01_collectives/collectives.h"
#include "alpha_beta.h"
#include "check_values.h"
#include "native_peers.h"

namespace dtp::bench::collectives {
namespace {

namespace ch01 = dtp::ch01;
using dtp::Comm;
using dtp::ReduceOp;
using dtp::Tensor;

Implementation library(Run run, Model model) { return {"library", run, false, model}; }
Implementation chapter01(const char* name, Run run, Model model) {
  return {name, run, true, model};
}
Implementation native(Model model) { return {"native", nullptr, false, model}; }

// --- buffers and checks -----------------------------------------------------------------

Tensor comm_buffer(std::int64_t numel, const Comm& comm, dtp::DType dtype) {
  return Tensor::zeros(dtp::Shape{numel}, dtype, comm.device(), dtp::MemoryCategory::comm);
}
std::int64_t own_shard(std::int64_t count, const Comm& comm) {
  return dtp::chunk_range(count, comm.size(), comm.rank()).length;
}

Buffers one_buffer(std::int64_t count, const Comm& comm, dtp::DType dtype) {
  return {comm_buffer(count, comm, dtype), Tensor()};
}
Buffers two_buffers(std::int64_t count, const Comm& comm, dtp::DType dtype) {
  return {comm_buffer(count, comm, dtype), comm_buffer(count, comm, dtype)};
}

/// What an output holds before a checked call: no pattern value is negative,
/// so an element the collective never wrote shows.
double sentinel(std::int64_t) { return -1.0; }

/// The input buffer holds this rank's pattern.
void fill_own(Buffers& b, const Comm& comm, int) {
  const int rank = comm.rank();
  fill_with(b.a, [rank](std::int64_t g) { return pattern(rank, g); });
}
/// The input holds this rank's pattern, the output the sentinel.
void fill_own_and_sentinel(Buffers& b, const Comm& comm, int root) {
  fill_own(b, comm, root);
  fill_with(b.b, sentinel);
}

/// Every element of the in-place buffer is the reduction over the ranks.
std::int64_t wrong_reduced(ReduceOp redop, const Buffers& b, const Comm& comm, int) {
  const int n = comm.size();
  return count_wrong(
      b.a, 0, b.a.numel(), [n, redop](std::int64_t g) { return pattern_reduced(redop, n, g); },
      check_tolerance(redop, b.a.dtype()));
}

/// Comm has no sendrecv: the receive is posted first, so that every rank's
/// send finds it whatever the backend's eager limit.
void sendrecv_library(CallArgs& a) {
  const int n = a.comm->size(), rank = a.comm->rank();
  dtp::Request incoming = a.comm->irecv(a.buffers.b, (rank - 1 + n) % n, 900);
  a.comm->send(a.buffers.a, (rank + 1) % n, 900);
  incoming.wait();
}

// --- the table ----------------------------------------------------------------------------

std::vector<Collective> make_table() {
  return {
      // x <- the reduction of every rank's x. Buffers: a = x.
      {.name = "all_reduce",
       .reduces = true,
       .in_place = true,
       .has_root = false,
       .equal_chunks = false,
       .implementations =
           {library([](CallArgs& a) { a.comm->all_reduce(a.buffers.a, a.redop); },
                    alpha_beta::ring_all_reduce),
            chapter01(
                "ring", [](CallArgs& a) { ch01::ring_all_reduce(*a.comm, a.buffers.a); },
                alpha_beta::ring_all_reduce),
            chapter01(
                "tree", [](CallArgs& a) { ch01::tree_all_reduce(*a.comm, a.buffers.a); },
                alpha_beta::tree_all_reduce),
            chapter01(
                "halving_doubling",
                [](CallArgs& a) { ch01::halving_doubling_all_reduce(*a.comm, a.buffers.a); },
                alpha_beta::halving_doubling_all_reduce),
            chapter01(
                "direct", [](CallArgs& a) { ch01::direct_all_reduce(*a.comm, a.buffers.a); },
                alpha_beta::direct_all_reduce),
            chapter01(
                "parameter_server",
                [](CallArgs& a) { ch01::parameter_server_all_reduce(*a.comm, a.buffers.a, 0); },
                alpha_beta::parameter_server_all_reduce),
            native(alpha_beta::ring_all_reduce)},
       .busbw_factor = [](int n) { return 2.0 * (n - 1) / n; },
       .fewest_bytes =
           [](int n, double S) { return 2.0 * n * S; },  // read n inputs of S, write n outputs of S
       .make_buffers = one_buffer,
       .fill_for_check = fill_own,
       .wrong_elements = wrong_reduced,
       .mpi = DTP_MPI_PEER(all_reduce),
       .nccl = DTP_NCCL_PEER(all_reduce)},

      // full <- every rank's shard, in rank order. Buffers: a = shard (chunk r of the count), b =
      // full.
      {.name = "all_gather",
       .reduces = false,
       .in_place = false,
       .has_root = false,
       .equal_chunks = false,
       .implementations =
           {library([](CallArgs& a) { a.comm->all_gather(a.buffers.a, a.buffers.b); },
                    alpha_beta::ring),
            chapter01(
                "ring",
                [](CallArgs& a) { ch01::ring_all_gather(*a.comm, a.buffers.a, a.buffers.b); },
                alpha_beta::ring),
            native(alpha_beta::ring)},
       .busbw_factor = [](int n) { return double(n - 1) / n; },
       .fewest_bytes =
           [](int n, double S) {
             return (n + 1.0) * S;
           },  // read the shards (S), write n outputs of S
       .make_buffers = [](std::int64_t count, const Comm& comm, dtp::DType dtype) -> Buffers {
         return {comm_buffer(own_shard(count, comm), comm, dtype), comm_buffer(count, comm, dtype)};
       },
       // The shard holds this rank's pattern at its place in the full buffer.
       .fill_for_check =
           [](Buffers& b, const Comm& comm, int) {
             const int rank = comm.rank();
             const std::int64_t offset = dtp::chunk_range(b.b.numel(), comm.size(), rank).offset;
             fill_with(b.a, [&](std::int64_t j) { return pattern(rank, offset + j); });
             fill_with(b.b, sentinel);
           },
       .wrong_elements =
           [](ReduceOp, const Buffers& b, const Comm& comm, int) {
             const std::int64_t count = b.b.numel();
             const std::int64_t chunk =
                 (count + comm.size() - 1) / comm.size();  // chunk_range: ceil-sized chunks
             return count_wrong(b.b, 0, count, [&](std::int64_t g) {
               return pattern(static_cast<int>(g / chunk), g);
             });
           },
       .mpi = DTP_MPI_PEER(all_gather),
       .nccl = DTP_NCCL_PEER(all_gather)},

      // shard <- chunk r of the reduction of every rank's full. Buffers: a = full, b = shard.
      {.name = "reduce_scatter",
       .reduces = true,
       .in_place = false,
       .has_root = false,
       .equal_chunks = false,
       .implementations =
           {library([](CallArgs& a) { a.comm->reduce_scatter(a.buffers.a, a.buffers.b, a.redop); },
                    alpha_beta::ring),
            chapter01(
                "ring",
                [](CallArgs& a) { ch01::ring_reduce_scatter(*a.comm, a.buffers.a, a.buffers.b); },
                alpha_beta::ring),
            native(alpha_beta::ring)},
       .busbw_factor = [](int n) { return double(n - 1) / n; },
       .fewest_bytes =
           [](int n, double S) {
             return (n + 1.0) * S;
           },  // read n inputs of S, write the shards (S)
       .make_buffers = [](std::int64_t count, const Comm& comm, dtp::DType dtype) -> Buffers {
         return {comm_buffer(count, comm, dtype), comm_buffer(own_shard(count, comm), comm, dtype)};
       },
       .fill_for_check = fill_own_and_sentinel,
       .wrong_elements =
           [](ReduceOp redop, const Buffers& b, const Comm& comm, int) {
             const int n = comm.size();
             const std::int64_t offset = dtp::chunk_range(b.a.numel(), n, comm.rank()).offset;
             return count_wrong(
                 b.b, 0, b.b.numel(),
                 [&](std::int64_t j) { return pattern_reduced(redop, n, offset + j); },
                 check_tolerance(redop, b.a.dtype()));
           },
       .mpi = DTP_MPI_PEER(reduce_scatter),
       .nccl = DTP_NCCL_PEER(reduce_scatter)},

      // x <- the root's x. Buffers: a = x.
      {.name = "broadcast",
       .reduces = false,
       .in_place = true,
       .has_root = true,
       .equal_chunks = false,
       .implementations =
           {library([](CallArgs& a) { a.comm->broadcast(a.buffers.a, a.root); }, alpha_beta::tree),
            chapter01(
                "tree", [](CallArgs& a) { ch01::tree_broadcast(*a.comm, a.buffers.a, a.root); },
                alpha_beta::tree),
            native(alpha_beta::tree)},
       .busbw_factor = [](int) { return 1.0; },
       .fewest_bytes = [](int n,
                          double S) { return n * S; },  // read the root's S, write the n - 1 others
       .make_buffers = one_buffer,
       .fill_for_check =
           [](Buffers& b, const Comm& comm, int root) {
             if (comm.rank() == root)
               fill_own(b, comm, root);
             else
               fill_with(b.a, sentinel);
           },
       .wrong_elements =
           [](ReduceOp, const Buffers& b, const Comm&, int root) {
             return count_wrong(b.a, 0, b.a.numel(),
                                [root](std::int64_t g) { return pattern(root, g); });
           },
       .mpi = DTP_MPI_PEER(broadcast),
       .nccl = DTP_NCCL_PEER(broadcast)},

      // The root's x <- the reduction of every rank's x. Buffers: a = x.
      {.name = "reduce",
       .reduces = true,
       .in_place = true,
       .has_root = true,
       .equal_chunks = false,
       .implementations = {library(
                               [](CallArgs& a) { a.comm->reduce(a.buffers.a, a.root, a.redop); },
                               alpha_beta::tree),
                           chapter01(
                               "tree",
                               [](CallArgs& a) { ch01::tree_reduce(*a.comm, a.buffers.a, a.root); },
                               alpha_beta::tree),
                           native(alpha_beta::tree)},
       .busbw_factor = [](int) { return 1.0; },
       .fewest_bytes =
           [](int n, double S) { return (n + 1.0) * S; },  // read n inputs of S, write the root's S
       .make_buffers = one_buffer,
       .fill_for_check = fill_own,
       // The root only: chapter 01's tree uses the other ranks' x as scratch.
       .wrong_elements = [](ReduceOp redop, const Buffers& b, const Comm& comm,
                            int root) -> std::int64_t {
         return comm.rank() == root ? wrong_reduced(redop, b, comm, root) : 0;
       },
       .mpi = DTP_MPI_PEER(reduce),
       .nccl = DTP_NCCL_PEER(reduce)},

      // out chunk i <- rank i's in chunk r. Buffers: a = in, b = out.
      {.name = "all_to_all",
       .reduces = false,
       .in_place = false,
       .has_root = false,
       .equal_chunks = true,
       .implementations =
           {library([](CallArgs& a) { a.comm->all_to_all(a.buffers.a, a.buffers.b); },
                    alpha_beta::ring),
            chapter01(
                "pairwise",
                [](CallArgs& a) { ch01::pairwise_all_to_all(*a.comm, a.buffers.a, a.buffers.b); },
                alpha_beta::ring),
            native(alpha_beta::ring)},
       .busbw_factor = [](int n) { return double(n - 1) / n; },
       .fewest_bytes =
           [](int n, double S) { return 2.0 * n * S; },  // read n inputs of S, write n outputs of S
       .make_buffers = two_buffers,
       .fill_for_check = fill_own_and_sentinel,
       .wrong_elements =
           [](ReduceOp, const Buffers& b, const Comm& comm, int) {
             // Out chunk i, element k came from rank i's in chunk `rank`, element k.
             const int rank = comm.rank();
             const std::int64_t chunk = b.b.numel() / comm.size();
             return count_wrong(b.b, 0, b.b.numel(), [&](std::int64_t g) {
               return pattern(static_cast<int>(g / chunk), rank * chunk + g % chunk);
             });
           },
       .mpi = DTP_MPI_PEER(all_to_all),
       .nccl = DTP_NCCL_PEER(all_to_all)},

      // Every rank sends its whole buffer right and receives the left one's.
      // Buffers: a = what is sent right, b = what arrives from the left.
      {.name = "sendrecv",
       .reduces = false,
       .in_place = false,
       .has_root = false,
       .equal_chunks = false,
       .implementations = {library(sendrecv_library, alpha_beta::one_message),
                           native(alpha_beta::one_message)},
       .busbw_factor = [](int) { return 1.0; },
       .fewest_bytes = [](int n,
                          double S) { return 2.0 * n * S; },  // each rank reads S and writes S
       .make_buffers = two_buffers,
       .fill_for_check = fill_own_and_sentinel,
       .wrong_elements =
           [](ReduceOp, const Buffers& b, const Comm& comm, int) {
             const int left = (comm.rank() - 1 + comm.size()) % comm.size();
             return count_wrong(b.b, 0, b.b.numel(),
                                [left](std::int64_t g) { return pattern(left, g); });
           },
       .mpi = DTP_MPI_PEER(sendrecv),
       .nccl = DTP_NCCL_PEER(sendrecv)},
  };
}

}  // namespace

// --- what the measuring code asks ---------------------------------------------------------

double Implementation::predicted_seconds(int n, double S, double alpha, double beta) const {
  return n <= 1 ? 0.0 : model(n, S, alpha, beta);
}

std::string Collective::redop_column(ReduceOp redop) const {
  return reduces ? dtp::reduce_op_name(redop) : "none";
}

double Collective::bytes_moved(int n, double S) const {
  if (n == 1) return in_place ? 0.0 : 2.0 * S;
  return fewest_bytes(n, S);
}

const std::vector<Collective>& collective_table() {
  static const std::vector<Collective> table = make_table();
  return table;
}

const Collective& find_collective(const std::string& name) {
  for (const Collective& c : collective_table())
    if (name == c.name) return c;
  throw dtp::Error("no collective named '" + name + "' in the table");
}

std::vector<std::string> collective_names() {
  std::vector<std::string> names;
  for (const Collective& c : collective_table()) names.push_back(c.name);
  return names;
}

std::vector<std::string> implementation_names() {
  std::vector<std::string> names;
  for (const Collective& c : collective_table())
    for (const Implementation& i : c.implementations)
      if (i.run != nullptr && std::find(names.begin(), names.end(), i.name) == names.end())
        names.push_back(i.name);
  names.push_back("native");
  return names;
}

Call make_call(const Collective& collective, const Implementation& implementation,
               const CallArgs& args, std::string& why_not) {
  if (collective.reduces && args.redop != ReduceOp::sum && implementation.sums_only) {
    why_not = std::string(implementation.name) + " (chapter 01) sums only";
    return nullptr;
  }
  if (implementation.run != nullptr)
    return [copy = args, run = implementation.run]() mutable { run(copy); };
  const std::string backend = args.comm->backend_name();
  if (args.comm->native_handle() == nullptr) {
    why_not = "the " + backend + " backend has no native library to compare with";
    return nullptr;
  }
  const MakeNativeCall peer = backend == "mpi"    ? collective.mpi
                              : backend == "nccl" ? collective.nccl
                                                  : nullptr;
  if (peer != nullptr) return peer(args, why_not);
  why_not = "this build cannot call the " + backend + " backend's native library";
  return nullptr;
}

}  // namespace dtp::bench::collectives
