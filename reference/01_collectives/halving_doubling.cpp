// Puzzle 1.10: recursive halving-doubling all-reduce (Rabenseifner).
//
// The ring's bandwidth with the tree's log2 N rounds. Among P = 2^m ranks,
// x is cut into P blocks. Reduce-scatter by recursive halving: in each round
// a rank pairs with the rank whose id differs in one bit, keeps the half of
// its current block range that its own id points to, sends the other half
// and adds the partner's copy of the kept half. Message sizes go S/2, S/4,
// ..., so after log2 P rounds rank p holds the finished block p, having sent
// (P - 1) / P of S. All-gather by recursive doubling replays the pairs in
// reverse, doubling the finished range each round.
//
// N need not be a power of two: the first 2 * extra ranks (extra = N - P) pair
// up, each odd one folds its vector into its even neighbour and waits; the P
// remaining ranks run the algorithm; the odd ones get the result at the end.
// That costs two extra rounds and 2 S bytes on those ranks.
//
// Partners swap halves, so each round posts its receive and its send together:
// send-then-recv on both sides deadlocks wherever sends are synchronous
// (large messages on MPI, DTP_SEND=sync).
#include <cstdint>

#include "01_collectives/collectives.h"

namespace dtp::ch01 {
namespace {

constexpr int kFoldTag = 1000;
constexpr int kHalvingTag = 1001;
constexpr int kDoublingTag = 1002;
constexpr int kUnfoldTag = 1003;

// Elements of blocks [first, first + count) of a buffer cut into `parts`
// blocks by chunk_range (empty blocks sit at the end, so spans stay contiguous).
Tensor blocks(const Tensor& flat, int parts, int first, int count) {
  const ChunkRange begin = chunk_range(flat.numel(), parts, first);
  const ChunkRange last = chunk_range(flat.numel(), parts, first + count - 1);
  return flat.slice(begin.offset, last.offset + last.length - begin.offset);
}

// Sends `out` to `partner` while receiving `in` from it; out and in never overlap.
void swap_with(Comm& comm, int partner, const Tensor& out, Tensor& in, int tag) {
  Request receive = comm.irecv(in, partner, tag);
  Request send = comm.isend(out, partner, tag);
  receive.wait();
  send.wait();
}

}  // namespace

void halving_doubling_all_reduce(Comm& comm, Tensor& x) {
  const int world = comm.size();
  const int rank = comm.rank();
  if (world == 1) return;
  Tensor flat = x.flatten();

  int active = 1;  // P: the largest power of two <= N
  while (active * 2 <= world) active *= 2;
  const int extra = world - active;

  // Fold: ranks below 2 * extra pair up (even, odd); odd ones sit out.
  const bool folded = rank < 2 * extra;
  if (folded && rank % 2 == 1) {
    comm.send(flat, rank - 1, kFoldTag);
    comm.recv(flat, rank - 1, kUnfoldTag);
    return;
  }
  if (folded) {
    Tensor incoming =
        Tensor::empty(flat.shape(), flat.dtype(), flat.device(), MemoryCategory::comm);
    comm.recv(incoming, rank + 1, kFoldTag);
    ops::accumulate(flat, incoming);
  }

  // Renumber the P active ranks 0..P-1 and back.
  const int me = folded ? rank / 2 : rank - extra;
  auto real = [extra](int p) { return p < extra ? 2 * p : p + extra; };

  // Recursive halving. Before the round with distance d, this rank's range is
  // the aligned group of 2d blocks containing block `me`; it keeps the d-block
  // half containing `me`. The lower half is never smaller than the upper one,
  // so the first round's kept half bounds every receive.
  Tensor scratch = Tensor::empty(Shape{blocks(flat, active, 0, active / 2).numel()}, flat.dtype(),
                                 flat.device(), MemoryCategory::comm);
  for (int d = active / 2; d >= 1; d /= 2) {
    const int partner = me ^ d;
    Tensor keep = blocks(flat, active, me & ~(d - 1), d);
    Tensor incoming = scratch.slice(0, keep.numel());
    swap_with(comm, real(partner), blocks(flat, active, partner & ~(d - 1), d), incoming,
              kHalvingTag);
    ops::accumulate(keep, incoming);
  }

  // Recursive doubling: swap finished ranges with the same partners in
  // reverse order; the received range lands directly in place.
  for (int d = 1; d < active; d *= 2) {
    const int partner = me ^ d;
    Tensor theirs = blocks(flat, active, partner & ~(d - 1), d);
    swap_with(comm, real(partner), blocks(flat, active, me & ~(d - 1), d), theirs, kDoublingTag);
  }

  if (folded) comm.send(flat, rank + 1, kUnfoldTag);
}

}  // namespace dtp::ch01
