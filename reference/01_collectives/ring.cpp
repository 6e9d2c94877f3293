// Puzzles 1.4, 1.5 and 1.8: the ring.
//
// Rank r only ever talks to its neighbours: it sends to r + 1 and receives
// from r - 1. In every round each rank moves one chunk (S / N bytes), and all
// N links are busy at once, so a rank sends (N - 1) / N of the data per pass
// whatever N is: the cost is bandwidth-optimal, at the price of N - 1 rounds.
//
// Chunk bookkeeping, the heart of it: in round k rank r sends chunk (r - k - 1)
// in reduce-scatter and chunk (r - k) in all-gather. Both passes end with rank
// r owning chunk r, so the all-reduce is simply one pass after the other.
// Empty chunks (numel < N) are still sent as 0-element messages: every rank
// then does the same number of rounds and nobody waits for a missing message.
//
// Each round posts its receive and its send together (irecv + isend) and
// waits for both: the chunk being sent is never the one being written in the
// same round, so no copy is needed, and on MPI the receive is already posted
// when the neighbour's data arrives. A plain send-then-recv would deadlock
// wherever sends are synchronous (large messages on MPI, DTP_SEND=sync):
// every rank would wait in send for a neighbour that is itself sending.
#include <vector>

#include "01_collectives/collectives.h"

namespace dtp::ch01 {
namespace {

constexpr int kAllGatherTag = 400;
constexpr int kReduceScatterTag = 500;
constexpr int kAllReduceScatterTag = 800;
constexpr int kAllReduceGatherTag = 801;

int wrap(int index, int world) { return ((index % world) + world) % world; }

// One ring round: send `out` to the right while receiving `in` from the left.
void exchange(Comm& comm, const Tensor& out, int right, Tensor& in, int left, int tag) {
  Request receive = comm.irecv(in, left, tag);
  Request send = comm.isend(out, right, tag);
  receive.wait();
  send.wait();
}

// All-gather over the chunks of a flat buffer whose chunk r is already filled.
void all_gather_chunks(Comm& comm, std::vector<Tensor>& chunks, int tag) {
  const int world = comm.size();
  const int rank = comm.rank();
  const int right = wrap(rank + 1, world);
  const int left = wrap(rank - 1, world);
  for (int k = 0; k + 1 < world; ++k) {
    exchange(comm, chunks[wrap(rank - k, world)], right, chunks[wrap(rank - k - 1, world)], left,
             tag);
  }
}

// Room for the largest chunk, which is always the first: ceil(numel / N).
Tensor chunk_scratch(const std::vector<Tensor>& chunks) {
  return Tensor::empty(Shape{chunks[0].numel()}, chunks[0].dtype(), chunks[0].device(),
                       MemoryCategory::comm);
}

}  // namespace

void ring_all_gather(Comm& comm, const Tensor& shard, Tensor& full) {
  const int world = comm.size();
  const int rank = comm.rank();
  std::vector<Tensor> chunks = full.flatten().chunk(world);
  DTP_CHECK(shard.numel() == chunks[rank].numel(), "ring_all_gather: rank ", rank, "'s shard has ",
            shard.numel(), " elements but chunk ", rank, " of ", full.numel(), " elements in ",
            world, " parts has ", chunks[rank].numel());
  chunks[rank].copy_from(shard.flatten());
  all_gather_chunks(comm, chunks, kAllGatherTag);
}

void ring_reduce_scatter(Comm& comm, const Tensor& full, Tensor& shard) {
  const int world = comm.size();
  const int rank = comm.rank();
  const std::vector<Tensor> chunks = full.flatten().chunk(world);
  Tensor mine = shard.flatten();
  DTP_CHECK(mine.numel() == chunks[rank].numel(), "ring_reduce_scatter: rank ", rank,
            "'s shard has ", mine.numel(), " elements but chunk ", rank, " of ", full.numel(),
            " elements in ", world, " parts has ", chunks[rank].numel());
  if (world == 1) {
    mine.copy_from(chunks[0]);
    return;
  }
  // full is read-only, so the running partial sum lives in scratch chunks;
  // the last round receives straight into shard. Two of them: a round
  // receives into one while the other, summed the round before, is sent.
  Tensor partials[2] = {chunk_scratch(chunks), chunk_scratch(chunks)};
  const int right = wrap(rank + 1, world);
  const int left = wrap(rank - 1, world);
  for (int k = 0; k + 1 < world; ++k) {
    const int send_index = wrap(rank - k - 1, world);
    const int recv_index = wrap(rank - k - 2, world);
    // Round 0 forwards this rank's own data; later rounds forward the partial
    // sum that arrived in the round before.
    const Tensor outgoing =
        k == 0 ? chunks[send_index] : partials[(k + 1) % 2].slice(0, chunks[send_index].numel());
    Tensor incoming =
        (k + 2 == world) ? mine : partials[k % 2].slice(0, chunks[recv_index].numel());
    exchange(comm, outgoing, right, incoming, left, kReduceScatterTag);
    ops::accumulate(incoming, chunks[recv_index]);
  }
}

void ring_all_reduce(Comm& comm, Tensor& x) {
  const int world = comm.size();
  const int rank = comm.rank();
  if (world == 1) return;
  std::vector<Tensor> chunks = x.flatten().chunk(world);
  Tensor incoming = chunk_scratch(chunks);
  const int right = wrap(rank + 1, world);
  const int left = wrap(rank - 1, world);
  // Reduce-scatter in place: the partial sums travel inside x's own chunks,
  // so the only extra memory is one chunk to receive into.
  for (int k = 0; k + 1 < world; ++k) {
    Tensor& target = chunks[wrap(rank - k - 2, world)];
    Tensor landing = incoming.slice(0, target.numel());
    exchange(comm, chunks[wrap(rank - k - 1, world)], right, landing, left, kAllReduceScatterTag);
    ops::accumulate(target, landing);
  }
  // Now chunk r is complete on rank r: spread the finished chunks around.
  all_gather_chunks(comm, chunks, kAllReduceGatherTag);
}

}  // namespace dtp::ch01
