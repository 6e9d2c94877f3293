// The MPI peers: Open MPI's own collectives on the buffers the library and
// chapter 01 use, so all three are measured on the same bytes.
#include "native_peers.h"

#ifdef DTP_HAVE_MPI
#include <mpi.h>

#include <memory>
#include <vector>

#include "mpi/mpi_check.h"

namespace dtp::bench::collectives::mpi_peer {
namespace {

/// What every MPI call needs, read once when the call is made.
struct MpiArgs {
  Buffers b;
  MPI_Comm comm;
  MPI_Datatype type;
  MPI_Op op;
  int count;  // elements of buffer a: MPI counts are ints
  int rank, size, root;
};

MpiArgs mpi_args(const CallArgs& args) {
  const Buffers& b = args.buffers;
  DTP_CHECK(b.a.numel() <= 0x7fffffff && (!b.b.defined() || b.b.numel() <= 0x7fffffff),
            "MPI counts are ints: the buffer is too large");
  const dtp::ReduceOp redop = args.redop;
  return MpiArgs{.b = b,
                 .comm = *static_cast<MPI_Comm*>(args.comm->native_handle()),
                 .type = b.a.dtype() == dtp::DType::f64 ? MPI_DOUBLE : MPI_FLOAT,
                 .op = redop == dtp::ReduceOp::max   ? MPI_MAX
                       : redop == dtp::ReduceOp::min ? MPI_MIN
                                                     : MPI_SUM,
                 .count = static_cast<int>(b.a.numel()),
                 .rank = args.comm->rank(),
                 .size = args.comm->size(),
                 .root = args.root};
}

/// MPI reduces with sum, max and min; an average has no MPI_Op.
bool refuses_average(const CallArgs& args, std::string& why_not) {
  if (args.redop != dtp::ReduceOp::avg) return false;
  why_not = "MPI has no average reduction";
  return true;
}

/// Element counts of every rank's chunk, and where each starts, as MPI's
/// v-collectives want them (chunk_range allows a short last chunk).
struct Chunks {
  std::vector<int> counts, offsets;
};

std::shared_ptr<Chunks> mpi_chunks(std::int64_t count, int n) {
  auto chunks = std::make_shared<Chunks>();
  chunks->counts.resize(n);
  chunks->offsets.resize(n);
  for (int r = 0; r < n; ++r) {
    dtp::ChunkRange range = dtp::chunk_range(count, n, r);
    DTP_CHECK(range.offset + range.length <= 0x7fffffff, "MPI counts are ints: ", count,
              " elements is too many");
    chunks->counts[r] = static_cast<int>(range.length);
    chunks->offsets[r] = static_cast<int>(range.offset);
  }
  return chunks;
}

}  // namespace

Call all_reduce(const CallArgs& args, std::string& why_not) {
  if (refuses_average(args, why_not)) return nullptr;
  return [m = mpi_args(args)]() mutable {
    DTP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, m.b.a.raw(), m.count, m.type, m.op, m.comm));
  };
}

Call all_gather(const CallArgs& args, std::string&) {
  MpiArgs m = mpi_args(args);
  std::shared_ptr<Chunks> chunks = mpi_chunks(m.b.b.numel(), m.size);
  return [m, chunks]() mutable {
    DTP_MPI_CHECK(MPI_Allgatherv(m.b.a.raw(), m.count, m.type, m.b.b.raw(), chunks->counts.data(),
                                 chunks->offsets.data(), m.type, m.comm));
  };
}

Call reduce_scatter(const CallArgs& args, std::string& why_not) {
  if (refuses_average(args, why_not)) return nullptr;
  MpiArgs m = mpi_args(args);
  std::shared_ptr<Chunks> chunks = mpi_chunks(m.b.a.numel(), m.size);
  return [m, chunks]() mutable {
    DTP_MPI_CHECK(
        MPI_Reduce_scatter(m.b.a.raw(), m.b.b.raw(), chunks->counts.data(), m.type, m.op, m.comm));
  };
}

Call broadcast(const CallArgs& args, std::string&) {
  return [m = mpi_args(args)]() mutable {
    DTP_MPI_CHECK(MPI_Bcast(m.b.a.raw(), m.count, m.type, m.root, m.comm));
  };
}

Call reduce(const CallArgs& args, std::string& why_not) {
  if (refuses_average(args, why_not)) return nullptr;
  return [m = mpi_args(args)]() mutable {
    if (m.rank == m.root)
      DTP_MPI_CHECK(MPI_Reduce(MPI_IN_PLACE, m.b.a.raw(), m.count, m.type, m.op, m.root, m.comm));
    else
      DTP_MPI_CHECK(MPI_Reduce(m.b.a.raw(), nullptr, m.count, m.type, m.op, m.root, m.comm));
  };
}

Call all_to_all(const CallArgs& args, std::string&) {
  return [m = mpi_args(args)]() mutable {
    const int chunk = m.count / m.size;
    DTP_MPI_CHECK(MPI_Alltoall(m.b.a.raw(), chunk, m.type, m.b.b.raw(), chunk, m.type, m.comm));
  };
}

Call sendrecv(const CallArgs& args, std::string&) {
  return [m = mpi_args(args)]() mutable {
    const int right = (m.rank + 1) % m.size, left = (m.rank - 1 + m.size) % m.size;
    DTP_MPI_CHECK(MPI_Sendrecv(m.b.a.raw(), m.count, m.type, right, 0, m.b.b.raw(), m.count, m.type,
                               left, 0, m.comm, MPI_STATUS_IGNORE));
  };
}

}  // namespace dtp::bench::collectives::mpi_peer
#endif
