// Chapter 01 — your collectives, built from send and recv alone.
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 01
// to see which puzzles pass. The contract (what each function must do) is in
// chapters/01_collectives/collectives.h; the lesson, pictures and cost table
// are in chapters/01_collectives/README.md.
//
// Tools you may use:
//   comm.rank(), comm.size()                  who am I, how many of us
//   comm.send(t, dst, tag)                    eager: returns at once
//   comm.recv(t, src, tag)                    blocks until the message is in t
//   comm.isend / comm.irecv + request.wait()  the non-blocking forms
//   x.flatten(), x.slice(start, length),      views: writing them writes x
//   x.chunk(n)
//   chunk_range(numel, parts, index)          {offset, length} of one chunk
//   dst.copy_from(src)                        copy
//   ops::accumulate(dst, src)                 dst += src, element-wise
//   Tensor::empty(shape, dtype, device)       scratch space
// Not allowed: comm.all_reduce, comm.broadcast and the other library
// collectives. The checkers count them.
//
// Views are values: `Tensor piece = x.flatten().slice(0, 4);` is a window
// into x, so `comm.recv(piece, src)` fills those 4 elements of x.
// The `(void)x;` lines only silence unused-parameter warnings: delete them.
#include "01_collectives/collectives.h"

namespace dtp::ch01 {

void tree_broadcast(Comm& comm, Tensor& x, int root) {
  // About 12 lines.
  // Work with the virtual rank v = (rank - root + N) % N so the root is v = 0.
  // In the round with step = 1, 2, 4, ...: ranks v < step already have the
  // data and send it to v + step (if that exists); ranks step <= v < 2*step
  // receive it from v - step. Remember to map virtual ranks back to real ones.
  (void)comm;
  (void)x;
  (void)root;
  throw dtp::NotSolved("1.1 tree_broadcast");
}

void tree_reduce(Comm& comm, Tensor& x, int root) {
  // About 20 lines.
  // The broadcast tree run backwards: go through the steps from the largest
  // power of two below N down to 1. Ranks step <= v < 2*step send their
  // partial sum to v - step; ranks v < step receive from v + step (if it
  // exists) into a scratch tensor and ops::accumulate it into x.
  (void)comm;
  (void)x;
  (void)root;
  throw dtp::NotSolved("1.2 tree_reduce");
}

void scatter(Comm& comm, const Tensor& full, Tensor& shard, int root) {
  // About 12 lines.
  // The root sends chunk r of full (full.flatten().chunk(N)[r]) to each rank
  // r != root and copies its own chunk into its shard locally. Everyone else
  // receives one message from the root into shard.
  (void)comm;
  (void)full;
  (void)shard;
  (void)root;
  throw dtp::NotSolved("1.3 scatter");
}

void gather(Comm& comm, const Tensor& shard, Tensor& full, int root) {
  // About 12 lines.
  // Scatter in reverse: every rank but the root sends its shard to the root;
  // the root receives rank r's message straight into chunk r of full (a view,
  // so no extra copy) and copies its own shard into its own chunk.
  (void)comm;
  (void)shard;
  (void)full;
  (void)root;
  throw dtp::NotSolved("1.3 gather");
}

void ring_all_gather(Comm& comm, const Tensor& shard, Tensor& full) {
  // About 12 lines.
  // Copy shard into chunk r of full. Then, in rounds k = 0 .. N-2, send chunk
  // (r - k) mod N to rank r + 1 and receive chunk (r - k - 1) mod N from rank
  // r - 1. Careful: in C++, (-1) % N is -1, not N - 1.
  (void)comm;
  (void)shard;
  (void)full;
  throw dtp::NotSolved("1.4 ring_all_gather");
}

void ring_reduce_scatter(Comm& comm, const Tensor& full, Tensor& shard) {
  // About 25 lines.
  // A partial sum travels the ring. In round k send chunk (r - k - 1) mod N to
  // r + 1, receive chunk (r - k - 2) mod N from r - 1 into a scratch chunk
  // (full is read-only) and add your own copy of that chunk to it; send that
  // partial sum on in the next round. The last round delivers chunk r.
  (void)comm;
  (void)full;
  (void)shard;
  throw dtp::NotSolved("1.5 ring_reduce_scatter");
}

void pairwise_all_to_all(Comm& comm, const Tensor& in, Tensor& out) {
  // About 15 lines.
  // First check the sizes with DTP_CHECK (on every rank, before sending
  // anything). Copy your own chunk locally, then in steps k = 1 .. N-1 send
  // chunk (r + k) of in to rank r + k and receive chunk (r - k) of out from
  // rank r - k.
  (void)comm;
  (void)in;
  (void)out;
  throw dtp::NotSolved("1.6 pairwise_all_to_all");
}

void parameter_server_all_reduce(Comm& comm, Tensor& x, int root) {
  // About 15 lines.
  // Workers: send x to the root, then receive the total back into x.
  // Root: receive every worker's x into scratch and accumulate it into its
  // own x, then send the total to every worker.
  (void)comm;
  (void)x;
  (void)root;
  throw dtp::NotSolved("1.7 parameter_server_all_reduce");
}

void ring_all_reduce(Comm& comm, Tensor& x) {
  // About 20 lines.
  // A ring reduce-scatter, then a ring all-gather, both on the chunk views of
  // x itself (x.flatten().chunk(N)). For the reduce-scatter half, receive
  // into one scratch chunk and accumulate into x's chunk; after it, rank r's
  // chunk r is complete and the all-gather rounds of 1.4 finish the job.
  (void)comm;
  (void)x;
  throw dtp::NotSolved("1.8 ring_all_reduce");
}

void tree_all_reduce(Comm& comm, Tensor& x) {
  // About 2 lines.
  // Reuse your own puzzles: reduce to rank 0, then broadcast from rank 0.
  (void)comm;
  (void)x;
  throw dtp::NotSolved("1.9 tree_all_reduce");
}

void halving_doubling_all_reduce(Comm& comm, Tensor& x) {
  // About 45 lines: the boss puzzle (solve 1.8 first; the README has a picture).
  // Fold the N - P extra ranks into partners (P = largest power of two <= N).
  // Halving, d = P/2 .. 1: swap with partner p ^ d, keep and sum the half of
  // your block range (chunk_range(numel, P, i)) that contains block p.
  // Doubling, d = 1 .. P/2: swap finished ranges with p ^ d. Then unfold.
  (void)comm;
  (void)x;
  throw dtp::NotSolved("1.10 halving_doubling_all_reduce");
}

void direct_all_reduce(Comm& comm, Tensor& x) {
  // About 25 lines. Post every receive and every send of a step before you
  // wait on any of them: a step's N - 1 messages must travel at once.
  (void)comm;
  (void)x;
  throw dtp::NotSolved("1.11 direct_all_reduce");
}

}  // namespace dtp::ch01
