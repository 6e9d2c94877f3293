/// @file collectives.h
/// @brief Chapter 01 contract: the collectives, rebuilt from send and recv.
///
/// Write every function in puzzles/01_collectives/ using only
/// Comm::send, Comm::recv, Comm::isend, Comm::irecv, Request::wait and local
/// tensor work (views, copy_from, ops::accumulate). The library collectives
/// (Comm::all_reduce and friends) are off limits here: the checkers count them.
///
/// Conventions shared by every puzzle:
/// - Reductions are sums (ops::accumulate(dst, src) adds src into dst).
/// - Buffers are split into `comm.size()` pieces by chunk_range() /
///   Tensor::chunk(): ceil-sized chunks with a short (or empty) tail, so
///   lengths smaller than the world size and lengths that do not divide by it
///   both work.
/// - Every rank calls the function with buffers of the same dtype and size;
///   tensors of any shape are treated as their flattened elements.
/// See chapters/01_collectives/README.md for the lesson and the hints.
#pragma once

#include "dtp/dtp.h"

namespace dtp::ch01 {

/// Puzzle 1.1: binomial-tree broadcast. Afterwards every rank's @p x equals
/// root's @p x. ceil(log2 N) latency rounds; each message carries all of x.
void tree_broadcast(Comm& comm, Tensor& x, int root);

/// Puzzle 1.2: binomial-tree reduce. Afterwards root's @p x holds the sum of
/// every rank's x; other ranks' x may be overwritten (use it as scratch).
/// ceil(log2 N) latency rounds.
void tree_reduce(Comm& comm, Tensor& x, int root);

/// Puzzle 1.3a: scatter. Rank r's @p shard becomes chunk r of root's @p full
/// (chunk_range(full.numel(), N, r)). Non-root ranks pass a @p full of the
/// same size whose contents are ignored.
void scatter(Comm& comm, const Tensor& full, Tensor& shard, int root);

/// Puzzle 1.3b: gather. Root's @p full becomes the concatenation of every
/// rank's @p shard (rank r's shard is chunk r). Other ranks' full is untouched.
void gather(Comm& comm, const Tensor& shard, Tensor& full, int root);

/// Puzzle 1.4: ring all-gather. Every rank's @p full becomes the concatenation
/// of all shards; rank r's @p shard is chunk r. N-1 rounds, each moving one chunk.
void ring_all_gather(Comm& comm, const Tensor& shard, Tensor& full);

/// Puzzle 1.5: ring reduce-scatter. Rank r's @p shard becomes chunk r of the
/// sum over ranks of @p full (which is not modified). N-1 rounds, one chunk each.
void ring_reduce_scatter(Comm& comm, const Tensor& full, Tensor& shard);

/// Puzzle 1.6: pairwise all-to-all. Chunk j of rank i's @p in lands as chunk
/// i of rank j's @p out. in and out have the same numel, divisible by N;
/// anything else throws dtp::Error naming the sizes.
void pairwise_all_to_all(Comm& comm, const Tensor& in, Tensor& out);

/// Puzzle 1.7: parameter-server all-reduce. Every rank sends x to @p root,
/// root sums and sends the total back to everyone.
void parameter_server_all_reduce(Comm& comm, Tensor& x, int root);

/// Puzzle 1.8: ring all-reduce = ring reduce-scatter then ring all-gather, in
/// place. 2(N-1) rounds; each rank sends 2(N-1)/N of the data.
void ring_all_reduce(Comm& comm, Tensor& x);

/// Puzzle 1.9: tree all-reduce = binomial-tree reduce to rank 0, then
/// binomial-tree broadcast from rank 0. 2 ceil(log2 N) rounds.
void tree_all_reduce(Comm& comm, Tensor& x);

/// Puzzle 1.10: recursive halving-doubling all-reduce (Rabenseifner):
/// reduce-scatter by recursive halving, all-gather by recursive doubling.
/// Any N: with P the largest power of two <= N, the N - P extra ranks first
/// fold their data into a partner and get the result back at the end.
/// 2 log2 N rounds when N is a power of two, 2 floor(log2 N) + 2 otherwise.
void halving_doubling_all_reduce(Comm& comm, Tensor& x);

/// Puzzle 1.11: direct ("parallel") all-reduce. Every rank sends chunk j of
/// @p x straight to rank j and, at the same time, receives its own chunk r
/// from every other rank and sums it (a direct reduce-scatter); then it sends
/// its summed chunk straight to everyone (a direct all-gather). Two steps
/// whatever N, with N(N-1) messages per step in all: 2 rounds on a network
/// with a link to every peer (CostModel::link_per_peer), 2(N-1) on one link
/// per rank, where its messages queue one after another.
void direct_all_reduce(Comm& comm, Tensor& x);

}  // namespace dtp::ch01
