// Puzzle 1.3: scatter and gather, the root talking to every other rank directly.
//
// The root handles N - 1 messages itself, so its link is the bottleneck; that
// is fine here because each message is only one chunk (S / N bytes), and the
// root's own chunk never touches the network.
#include <vector>

#include "01_collectives/collectives.h"

namespace dtp::ch01 {
namespace {

constexpr int kScatterTag = 300;
constexpr int kGatherTag = 301;

}  // namespace

void scatter(Comm& comm, const Tensor& full, Tensor& shard, int root) {
  const int world = comm.size();
  const int rank = comm.rank();
  Tensor mine = shard.flatten();
  if (full.defined()) {
    // Checked on every rank before any message moves, so a bad size fails fast
    // everywhere instead of leaving some rank waiting for a message.
    DTP_CHECK(mine.numel() == chunk_range(full.numel(), world, rank).length, "scatter: rank ", rank,
              "'s shard has ", mine.numel(), " elements but chunk ", rank, " of ", full.numel(),
              " elements in ", world, " parts has ", chunk_range(full.numel(), world, rank).length);
  }
  if (rank != root) {
    comm.recv(mine, root, kScatterTag);
    return;
  }
  std::vector<Tensor> chunks = full.flatten().chunk(world);
  for (int r = 0; r < world; ++r) {
    if (r != root) comm.send(chunks[r], r, kScatterTag);
  }
  mine.copy_from(chunks[root]);
}

void gather(Comm& comm, const Tensor& shard, Tensor& full, int root) {
  const int world = comm.size();
  const int rank = comm.rank();
  if (rank != root) {
    comm.send(shard.flatten(), root, kGatherTag);
    return;
  }
  // Messages land straight in their chunk of full: no staging buffer, no copy.
  std::vector<Tensor> chunks = full.flatten().chunk(world);
  DTP_CHECK(shard.numel() == chunks[root].numel(), "gather: root ", root, "'s shard has ",
            shard.numel(), " elements but chunk ", root, " of ", full.numel(), " elements in ",
            world, " parts has ", chunks[root].numel());
  for (int r = 0; r < world; ++r) {
    if (r != root) comm.recv(chunks[r], r, kGatherTag);
  }
  chunks[root].copy_from(shard.flatten());
}

}  // namespace dtp::ch01
