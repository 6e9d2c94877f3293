/// @file sequence_expert.h
/// @brief Chapter 06 contract: sequence parallelism (Ulysses, ring
/// attention, zigzag, the 2-D hybrid).
///
/// Sequence parallelism splits the T positions of every sequence over the n
/// ranks of an SP group; the weights are replicated (their gradients are
/// summed over the group, as in DDP). Everything but attention acts on one
/// position at a time and needs no communication. Attention needs every
/// earlier key:
/// - **Ulysses** (6.1) re-partitions: an all-to-all turns "my T/n positions,
///   all H heads" into "all T positions, my H/n heads", attention runs
///   locally, and a second all-to-all turns the output back. Four
///   all-to-alls forward (q, k, v, out), four backward (dout, dq, dk, dv).
///   Needs H % n == 0.
/// - **Ring attention** (6.2, 6.3) keeps the queries and passes the
///   key/value blocks around the ring: n - 1 transfers, each overlapping one
///   block of attention, merged with the online softmax. Not limited by H.
///   Blocks no query can see (the causal mask) are skipped, so with
///   contiguous positions rank n - 1 computes n blocks and rank 0 one.
/// - **Zigzag** (6.4) deals 2n chunks so that rank r holds chunks r and
///   2n - 1 - r: one early, one late, and every rank computes 2n + 1
///   half-size blocks.
/// - **The hybrid** (6.5): Ulysses inside groups of u consecutive ranks
///   (fast links), ring attention across the n / u groups.
///
/// Layout everywhere: q, k, v and the output are [B, T_local, H, D] (a [B, T,
/// C] activation viewed with C = H D), f32 or f64, on the rank's device; the
/// causal mask uses global positions. Mixture of experts (6.6, 6.7) follows
/// in this header once built; the runtime's dtp::MoeMlp is its single-device
/// form. See chapters/06_sequence_expert/README.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/nn_ops.h"
#include "dtp/tensor.h"

/// Chapter 06: sequence and expert parallelism.
namespace dtp::ch06 {

// --- provided: which positions a rank holds -------------------------------------------

/// How the T positions are dealt to the n ranks.
enum class SequenceLayout {
  contiguous,  ///< rank r holds [r T/n, (r+1) T/n)
  zigzag,      ///< 2n chunks of T/2n; rank r holds chunks r and 2n-1-r
};
/// "contiguous" or "zigzag".
const char* sequence_layout_name(SequenceLayout layout);

/// Positions [start, start + length) of the sequence.
struct PositionRange {
  std::int64_t start = 0;   ///< first global position
  std::int64_t length = 0;  ///< number of positions
  /// One past the last position.
  std::int64_t end() const { return start + length; }
};

/// The positions rank @p rank of @p n holds, in order (one range, or two for
/// zigzag). T must divide by n (2n for zigzag): otherwise dtp::Error naming
/// T, n and the layout ("T = 10 does not split into 2 x 4 = 8 zigzag chunks").
std::vector<PositionRange> positions_of(std::int64_t T, int n, int rank, SequenceLayout layout);

/// True when some query in @p queries may see some key in @p keys under the
/// causal mask (keys.start <= the last query): the block is worth computing.
bool block_visible(const PositionRange& queries, const PositionRange& keys);

/// The rows of @p ranges of x [B, T, ...] (axis 1, global positions),
/// concatenated in order: this rank's shard [B, T_local, ...]. A copy.
Tensor take_positions(const Tensor& x, const std::vector<PositionRange>& ranges);
/// The inverse: writes @p shard [B, T_local, ...] into those rows of @p x.
void put_positions(const Tensor& shard, const std::vector<PositionRange>& ranges, Tensor& x);
/// A rank's shard [B, T_local, ...] cut into one piece per range (copies):
/// zigzag's two chunks, or the one contiguous range.
std::vector<Tensor> split_positions(const Tensor& shard, const std::vector<PositionRange>& ranges);
/// The inverse of split_positions: the pieces joined along axis 1.
Tensor join_positions(const std::vector<Tensor>& pieces);

// --- provided: one block of attention ---------------------------------------------------

/// Attention of some queries over the keys seen so far, normalized over
/// them: what ops::flash_attention_forward writes and ops::attention_merge
/// combines. out [B, Tq, H, D]; row_max and row_sum [B, H, Tq].
struct PartialAttention {
  Tensor out;      ///< the output over the keys seen so far
  Tensor row_max;  ///< per query row: the largest visible scaled score (-inf: none yet)
  Tensor row_sum;  ///< per query row: sum of exp(score - row_max) (0: none yet)
};

/// A partial result that has seen no key yet, shaped for @p q [B, Tq, H, D].
PartialAttention empty_partial(const Tensor& q);

/// Adds the keys @p k and values @p v [B, Tk, H, D] at global positions
/// @p keys to @p partial, for queries @p q at global positions @p queries,
/// under the causal mask: flash attention of the block, merged into partial.
/// Counts one block computation (the balance checker reads the counts) and
/// charges 1 on @p clock's simulated clock, whatever the block's size, so
/// the clock holds compute and transfers on one time line. (The clock
/// charges a send when it is posted, so it adds a transfer to the compute
/// it overlaps instead of taking the larger: the lesson's formulas model
/// the overlap.) A block no query can see is a dtp::Error: skip it
/// (block_visible) instead.
void attend_block(Comm& clock, const Tensor& q, const PositionRange& queries, const Tensor& k,
                  const Tensor& v, const PositionRange& keys, PartialAttention& partial);

/// The backward of one block: given the queries' final result (output and
/// statistics over all keys) and dout, ADDS this block's share to dq, and
/// the block's gradients to dk and dv (same shapes as q, k, v). Counts one
/// block computation and charges 2 on the clock (a backward costs about
/// two forwards). Invisible blocks are an error, as for attend_block.
void attend_block_backward(Comm& clock, const Tensor& q, const PositionRange& queries,
                           const Tensor& k, const Tensor& v, const PositionRange& keys,
                           const PartialAttention& result, const Tensor& dout, Tensor& dq,
                           Tensor& dk, Tensor& dv);

/// Block computations (forward and backward) attend_block and
/// attend_block_backward counted on this thread since the last reset.
std::int64_t block_computations();
/// Zeroes this thread's count.
void reset_block_computations();

// --- puzzle 6.1: Ulysses ---------------------------------------------------------------------

/// Puzzle 6.1a. x [B, T/n, H, D] (this rank's contiguous positions, every
/// head) -> [B, T, H/n, D] (every position, heads r H/n .. (r+1) H/n - 1),
/// with one all_to_all on @p sp. H must divide by n (dtp::Error otherwise).
Tensor sequence_to_heads(Comm& sp, const Tensor& x);
/// Puzzle 6.1b. The inverse: [B, T, H/n, D] -> [B, T/n, H, D], one all_to_all.
Tensor heads_to_sequence(Comm& sp, const Tensor& x);

/// Puzzle 6.1c. Ulysses attention on the ranks of @p sp (contiguous layout).
class UlyssesAttention {
 public:
  /// Checks heads % sp.size() == 0 (provided): dtp::Error naming both.
  UlyssesAttention(Comm& sp, int heads);
  /// Causal attention output for this rank's positions [B, T/n, H, D]:
  /// sequence_to_heads q, k and v, flash attention over the whole sequence
  /// for this rank's heads, heads_to_sequence the output. Saves what the
  /// backward needs.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v);
  /// Assigns dq, dk, dv [B, T/n, H, D] for this rank's positions (whatever
  /// they held is replaced), from dout of the same shape: one all-to-all for
  /// dout, the flash backward, three back.
  void backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

 private:
  Comm& sp_;
  int heads_;
  Tensor q_, k_, v_;                // head-sharded, whole sequence [B, T, H/n, D]
  Tensor out_, row_max_, row_sum_;  // this rank's heads' output and statistics
};

// --- puzzles 6.2-6.4: ring attention -----------------------------------------------------------

/// Ring attention on the ranks of @p sp, positions dealt by @p layout. A
/// key/value block always carries the positions it holds: the ranges of
/// positions_of(T, n, its owner, layout).
class RingAttention {
 public:
  /// Nothing to check yet: T is known at forward.
  RingAttention(Comm& sp, SequenceLayout layout);
  /// Puzzle 6.2 (6.4 for zigzag). q, k, v [B, T_local, H, D]; returns the
  /// causal attention output for this rank's positions. The key/value blocks
  /// travel the ring (to rank r + 1, from rank r - 1) with k and v packed in
  /// one buffer, so one message per transfer: n - 1 transfers, the
  /// next block's transfer started before the current block is computed;
  /// blocks no query sees are skipped (block_visible), every other (query
  /// range, key range) pair is one attend_block.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v);
  /// Puzzle 6.3. Assigns dq, dk, dv [B, T_local, H, D] from dout. dq stays
  /// home; dk and dv travel the ring with their key/value block, collect
  /// every rank's share (attend_block_backward) and come home: n - 1
  /// messages of (k, v, dk, dv) packed in one buffer, then one of (dk, dv)
  /// back to its owner: n messages in all (none for n = 1).
  void backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

 private:
  Comm& sp_;
  SequenceLayout layout_;
  std::int64_t T_ = 0;                  // the whole sequence's length (n T_local)
  std::vector<Tensor> q_, k_, v_;       // one piece per range of this rank
  std::vector<PartialAttention> result_;  // per query range: the final output and statistics
};

// --- puzzle 6.5: the 2-D hybrid -----------------------------------------------------------------

/// Ulysses inside groups of @p ulysses_size consecutive ranks, ring
/// attention (contiguous layout) across the n / ulysses_size groups.
/// Rank r = a u + i is member i of group a; it holds contiguous positions
/// like a plain n-rank contiguous layout, so the group's positions are
/// contiguous too.
class HybridAttention {
 public:
  /// Splits @p sp into the groups (inner) and the rings across them (outer:
  /// the ranks with the same member index). Checks that ulysses_size
  /// divides n and heads (dtp::Error naming them); provided.
  HybridAttention(Comm& sp, int ulysses_size, int heads);
  /// sequence_to_heads inside the group, ring attention across groups on
  /// the group's whole positions for this rank's heads, heads_to_sequence back.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v);
  /// The same in reverse; assigns dq, dk, dv.
  void backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);
  /// The communicator inside the group (u ranks).
  Comm& inner() { return inner_; }
  /// The communicator across groups (n / u ranks).
  Comm& outer() { return outer_; }

 private:
  Comm inner_, outer_;
  RingAttention ring_;
};

}  // namespace dtp::ch06
