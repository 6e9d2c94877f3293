// Puzzles 1.1, 1.2 and 1.9: binomial trees.
//
// Every rank works with its *virtual* rank v = (rank - root + N) % N, so the
// root is always v = 0 and the tree has the same shape whatever the root.
// In round i (step = 2^i) the ranks v < step already hold the data and each
// sends it to v + step: the number of ranks that hold it doubles every round,
// hence ceil(log2 N) rounds. The root's first message goes to v = 1, whose
// subtree {1, 3, 5, ...} is the largest: the biggest job starts earliest.
// Reduce is the same tree run backwards.
#include "01_collectives/collectives.h"

namespace dtp::ch01 {
namespace {

constexpr int kBroadcastTag = 100;
constexpr int kReduceTag = 200;

int real_rank(int virtual_rank, int root, int world) { return (virtual_rank + root) % world; }

}  // namespace

void tree_broadcast(Comm& comm, Tensor& x, int root) {
  const int world = comm.size();
  const int v = (comm.rank() - root + world) % world;
  Tensor flat = x.flatten();
  for (int step = 1; step < world; step *= 2) {
    if (v < step) {
      if (v + step < world) comm.send(flat, real_rank(v + step, root, world), kBroadcastTag);
    } else if (v < 2 * step) {
      comm.recv(flat, real_rank(v - step, root, world), kBroadcastTag);
    }
  }
}

void tree_reduce(Comm& comm, Tensor& x, int root) {
  const int world = comm.size();
  const int v = (comm.rank() - root + world) % world;
  if (world == 1) return;
  Tensor flat = x.flatten();
  // One receive buffer serves every round: a rank adds each child's partial sum
  // into x before the next child's message arrives.
  Tensor incoming = Tensor::empty(flat.shape(), flat.dtype(), flat.device(), MemoryCategory::comm);

  int top = 1;
  while (top * 2 < world) top *= 2;
  // Largest step first: the mirror image of the broadcast, so the leaves that
  // received last in a broadcast are the ones that send first here.
  for (int step = top; step >= 1; step /= 2) {
    if (v < step) {
      if (v + step < world) {
        comm.recv(incoming, real_rank(v + step, root, world), kReduceTag);
        ops::accumulate(flat, incoming);
      }
    } else if (v < 2 * step) {
      comm.send(flat, real_rank(v - step, root, world), kReduceTag);
    }
  }
}

void tree_all_reduce(Comm& comm, Tensor& x) {
  // Two trees back to back: log2 N rounds to bring the sum to rank 0 and as many
  // to spread it. Few messages, but each carries all of x: good for small x.
  tree_reduce(comm, x, 0);
  tree_broadcast(comm, x, 0);
}

}  // namespace dtp::ch01
