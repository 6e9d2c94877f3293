// Puzzle 1.11: direct ("parallel") all-reduce.
//
// Every rank talks to every other rank at once. Step 1 is a direct
// reduce-scatter: rank r sends chunk j to rank j and receives chunk r from
// everyone, then sums. Step 2 is a direct all-gather: rank r sends its summed
// chunk r to everyone and receives chunk j from rank j. Each rank sends the
// same 2(N-1)/N of the data as in the ring, but in two steps instead of
// 2(N-1) rounds, at the price of N(N-1) messages per step in all (the ring
// sends N per round). That wins only where a rank can really talk to all its
// peers at once (an NVSwitch, a full-bisection fabric: CostModel's
// link_per_peer); through one network card the N-1 messages queue anyway.
//
// Every receive and send of a step is posted before any is waited on, so the
// messages travel together and nothing deadlocks when sends are synchronous.
// The received chunks are summed in rank order: every rank's result is the
// same sum, bit for bit.
#include <vector>

#include "01_collectives/collectives.h"

namespace dtp::ch01 {
namespace {

constexpr int kDirectReduceScatterTag = 1100;
constexpr int kDirectAllGatherTag = 1101;

}  // namespace

void direct_all_reduce(Comm& comm, Tensor& x) {
  const int world = comm.size();
  const int rank = comm.rank();
  std::vector<Tensor> chunks = x.flatten().chunk(world);
  Tensor& mine = chunks[static_cast<std::size_t>(rank)];

  // Step 1: everyone's chunk r arrives here at once.
  std::vector<Tensor> incoming(static_cast<std::size_t>(world));
  std::vector<Request> requests;
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    incoming[static_cast<std::size_t>(peer)] =
        Tensor::empty(mine.shape(), mine.dtype(), mine.device(), MemoryCategory::comm);
    requests.push_back(
        comm.irecv(incoming[static_cast<std::size_t>(peer)], peer, kDirectReduceScatterTag));
  }
  for (int peer = 0; peer < world; ++peer) {
    if (peer != rank)
      requests.push_back(
          comm.isend(chunks[static_cast<std::size_t>(peer)], peer, kDirectReduceScatterTag));
  }
  wait_all(requests);
  Tensor sum = Tensor::zeros(mine.shape(), mine.dtype(), mine.device(), MemoryCategory::comm);
  for (int peer = 0; peer < world; ++peer)
    ops::accumulate(sum, peer == rank ? mine : incoming[static_cast<std::size_t>(peer)]);
  mine.copy_from(sum);

  // Step 2: the summed chunk r goes to everyone, and every other chunk comes home.
  requests.clear();
  for (int peer = 0; peer < world; ++peer) {
    if (peer != rank)
      requests.push_back(
          comm.irecv(chunks[static_cast<std::size_t>(peer)], peer, kDirectAllGatherTag));
  }
  for (int peer = 0; peer < world; ++peer) {
    if (peer != rank) requests.push_back(comm.isend(mine, peer, kDirectAllGatherTag));
  }
  wait_all(requests);
}

}  // namespace dtp::ch01
