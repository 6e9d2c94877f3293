// Puzzle 1.6: pairwise all-to-all.
//
// Every rank has a different chunk for every other rank. In step k rank r
// sends to r + k and receives from r - k: each step is a perfect matching
// (a permutation), so every rank sends one and receives one message per step
// and no link is asked to carry two messages at once. N - 1 steps of S / N.
// Each step posts its receive and its send together: with synchronous sends
// (DTP_SEND=sync, large messages on MPI) a send-then-recv would deadlock,
// every rank waiting in send for a partner that is sending too.
#include <vector>

#include "01_collectives/collectives.h"

namespace dtp::ch01 {
namespace {

constexpr int kAllToAllTag = 600;

void exchange(Comm& comm, const Tensor& out, int to, Tensor& in, int from) {
  Request receive = comm.irecv(in, from, kAllToAllTag);
  Request send = comm.isend(out, to, kAllToAllTag);
  receive.wait();
  send.wait();
}

}  // namespace

void pairwise_all_to_all(Comm& comm, const Tensor& in, Tensor& out) {
  const int world = comm.size();
  const int rank = comm.rank();
  // Every rank sees the same sizes, so every rank fails here together and no
  // rank is left waiting for a message that will never come.
  DTP_CHECK(in.numel() == out.numel() && in.numel() % world == 0,
            "pairwise_all_to_all: in and out need equal sizes divisible by the world size ", world,
            "; got in.numel() = ", in.numel(), " and out.numel() = ", out.numel());
  const std::vector<Tensor> outgoing = in.flatten().chunk(world);
  std::vector<Tensor> incoming = out.flatten().chunk(world);
  incoming[rank].copy_from(outgoing[rank]);
  for (int k = 1; k < world; ++k) {
    const int to = (rank + k) % world;
    const int from = (rank - k + world) % world;
    exchange(comm, outgoing[to], to, incoming[from], from);
  }
}

}  // namespace dtp::ch01
