// The NCCL peers: NCCL's own collectives on the buffers the library and
// chapter 01 use, so all three are measured on the same bytes.
#include "native_peers.h"

#ifdef DTP_HAVE_NCCL
#include <cuda_runtime.h>

#include <cstddef>

#include "nccl/nccl_check.h"

namespace dtp::bench::collectives::nccl_peer {
namespace {

/// What every NCCL call needs, read once when the call is made.
struct NcclArgs {
  Buffers b;
  ncclComm_t comm;
  ncclDataType_t type;
  ncclRedOp_t op;
  std::size_t count;  // elements of buffer a
  int rank, size, root;
  // The legacy default stream, not the backend's own (which is private): the
  // measurement synchronizes the device before and after the calls it times,
  // so the stream only has to be the same for every native call.
  cudaStream_t stream;
};

NcclArgs nccl_args(const CallArgs& args) {
  const Buffers& b = args.buffers;
  const dtp::ReduceOp redop = args.redop;
  return NcclArgs{.b = b,
                  .comm = *static_cast<ncclComm_t*>(args.comm->native_handle()),
                  .type = b.a.dtype() == dtp::DType::f64 ? ncclFloat64 : ncclFloat32,
                  .op = redop == dtp::ReduceOp::avg   ? ncclAvg
                        : redop == dtp::ReduceOp::max ? ncclMax
                        : redop == dtp::ReduceOp::min ? ncclMin
                                                      : ncclSum,
                  .count = static_cast<std::size_t>(b.a.numel()),
                  .rank = args.comm->rank(),
                  .size = args.comm->size(),
                  .root = args.root,
                  .stream = nullptr};
}

/// NCCL's all-gather and reduce-scatter want equal chunks; DTP's chunk rule
/// allows a short last one. False, after saying why, when @p full elements
/// do not split evenly over the world.
bool splits_evenly(std::int64_t full, int n, std::string& why_not) {
  if (full % n == 0) return true;
  why_not = "NCCL needs the count to divide by the world size";
  return false;
}

}  // namespace

Call all_reduce(const CallArgs& args, std::string&) {
  return [m = nccl_args(args)]() mutable {
    DTP_NCCL_CHECK(
        ncclAllReduce(m.b.a.raw(), m.b.a.raw(), m.count, m.type, m.op, m.comm, m.stream));
  };
}

Call all_gather(const CallArgs& args, std::string& why_not) {
  NcclArgs m = nccl_args(args);
  if (!splits_evenly(m.b.b.numel(), m.size, why_not)) return nullptr;
  const std::size_t shard = static_cast<std::size_t>(m.b.b.numel() / m.size);
  return [m, shard]() mutable {
    DTP_NCCL_CHECK(ncclAllGather(m.b.a.raw(), m.b.b.raw(), shard, m.type, m.comm, m.stream));
  };
}

Call reduce_scatter(const CallArgs& args, std::string& why_not) {
  NcclArgs m = nccl_args(args);
  if (!splits_evenly(m.b.a.numel(), m.size, why_not)) return nullptr;
  const std::size_t shard = static_cast<std::size_t>(m.b.a.numel() / m.size);
  return [m, shard]() mutable {
    DTP_NCCL_CHECK(
        ncclReduceScatter(m.b.a.raw(), m.b.b.raw(), shard, m.type, m.op, m.comm, m.stream));
  };
}

Call broadcast(const CallArgs& args, std::string&) {
  return [m = nccl_args(args)]() mutable {
    DTP_NCCL_CHECK(
        ncclBroadcast(m.b.a.raw(), m.b.a.raw(), m.count, m.type, m.root, m.comm, m.stream));
  };
}

Call reduce(const CallArgs& args, std::string&) {
  return [m = nccl_args(args)]() mutable {
    DTP_NCCL_CHECK(
        ncclReduce(m.b.a.raw(), m.b.a.raw(), m.count, m.type, m.op, m.root, m.comm, m.stream));
  };
}

Call all_to_all(const CallArgs& args, std::string&) {
  // NCCL has no all-to-all call: grouped sends and receives, as nccl-tests does.
  return [m = nccl_args(args)]() mutable {
    const std::size_t chunk = m.count / m.size;
    const std::size_t element = dtp::dtype_size(m.b.a.dtype());
    DTP_NCCL_CHECK(ncclGroupStart());
    for (int peer = 0; peer < m.size; ++peer) {
      DTP_NCCL_CHECK(ncclSend(static_cast<const char*>(m.b.a.raw()) + peer * chunk * element, chunk,
                              m.type, peer, m.comm, m.stream));
      DTP_NCCL_CHECK(ncclRecv(static_cast<char*>(m.b.b.raw()) + peer * chunk * element, chunk,
                              m.type, peer, m.comm, m.stream));
    }
    DTP_NCCL_CHECK(ncclGroupEnd());
  };
}

Call sendrecv(const CallArgs& args, std::string&) {
  return [m = nccl_args(args)]() mutable {
    const int right = (m.rank + 1) % m.size, left = (m.rank - 1 + m.size) % m.size;
    DTP_NCCL_CHECK(ncclGroupStart());
    DTP_NCCL_CHECK(ncclSend(m.b.a.raw(), m.count, m.type, right, m.comm, m.stream));
    DTP_NCCL_CHECK(ncclRecv(m.b.b.raw(), m.count, m.type, left, m.comm, m.stream));
    DTP_NCCL_CHECK(ncclGroupEnd());
  };
}

}  // namespace dtp::bench::collectives::nccl_peer
#endif
