/// @file sequence_expert.h
/// @brief Chapter 06 contract: sequence parallelism (Ulysses, ring
/// attention, the 2-D hybrid) and expert parallelism (mixture of experts).
///
/// DRAFT (branch ch06): the attention half of the contract, written first
/// because it fixes the layouts everything else uses. The MoE half follows
/// the runtime's MoeMlp (next step), and nothing here is built yet: there
/// is no puzzles/ or reference/ directory for this chapter, so CMake makes
/// no library of it.
///
/// Sequence parallelism splits the T positions of every sequence over the n
/// ranks of an SP group; the weights are replicated (their gradients are
/// summed over the group like DDP's). Everything but attention acts per
/// position and needs no communication. Attention needs every key:
/// - Ulysses (6.1) re-partitions: an all-to-all turns "my T/n positions, all
///   H heads" into "all T positions, my H/n heads", attention runs locally,
///   and a second all-to-all turns the output back. Four all-to-alls
///   forward (q, k, v, out), four backward. Needs H % n == 0.
/// - Ring attention (6.2, 6.3) keeps the queries and passes the key/value
///   blocks around the ring: n - 1 transfers, each overlapping one block of
///   attention, merged with the online softmax (ops::attention_merge).
///   Not limited by H. With a causal mask the blocks above the diagonal are
///   skipped, so with contiguous positions rank n - 1 computes n blocks and
///   rank 0 one; the zigzag layout (6.4) gives every rank the same work.
/// - The hybrid (6.5): Ulysses inside groups of u ranks (fast links), ring
///   across the n / u groups.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtp/comm.h"
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
};

/// The positions rank @p rank of @p n holds, in order (one range, or two for
/// zigzag). T must divide by n (2n for zigzag): otherwise dtp::Error naming
/// T, n and the layout ("T = 10 does not split into 2 x 4 zigzag chunks").
std::vector<PositionRange> positions_of(std::int64_t T, int n, int rank, SequenceLayout layout);

/// The rows of @p ranges of x [B, T, ...] (axis 1), concatenated in order:
/// this rank's shard [B, T_local, ...]. A copy (ops::permute makes the
/// strided rows contiguous).
Tensor take_positions(const Tensor& x, const std::vector<PositionRange>& ranges);
/// The inverse: writes @p shard [B, T_local, ...] into those rows of @p x.
void put_positions(const Tensor& shard, const std::vector<PositionRange>& ranges, Tensor& x);

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
/// k_start.. to @p partial, for queries @p q at q_start.. under the causal
/// mask: flash attention of the block, merged. Counts one block computation
/// (the balance checker reads the counts) and charges 1 on @p comm's clock,
/// so a ring's clock shows compute and transfers together. A block no query
/// can see (k_start >= q_start + Tq) is a dtp::Error: skip it instead.
void attend_block(Comm& comm, const Tensor& q, std::int64_t q_start, const Tensor& k, const Tensor& v,
                  std::int64_t k_start, PartialAttention& partial);

/// Block computations attend_block has counted on this thread since the last reset.
std::int64_t block_computations();
/// Zeroes the count.
void reset_block_computations();

// --- puzzles 1-5: sequence-parallel attention --------------------------------------------

/// Puzzle 6.1. Ulysses attention on the ranks of @p sp (contiguous layout).
/// q, k, v are this rank's positions [B, T/n, H, D]; forward returns the
/// causal attention output for them, [B, T/n, H, D]. The constructor checks
/// heads % n (provided).
class UlyssesAttention {
 public:
  UlyssesAttention(Comm& sp, int heads);
  /// all_to_all q, k, v to [B, T, H/n, D] (heads r H/n .. of every
  /// position), attention, all_to_all the output back.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v);
  /// dq, dk, dv for this rank's positions, from dout [B, T/n, H, D].
  void backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

 private:
  Comm& sp_;
  int heads_;
  Tensor q_, k_, v_, out_, row_max_, row_sum_;  // head-sharded, full sequence
};

/// Puzzles 6.2-6.4. Ring attention on the ranks of @p sp in @p layout.
class RingAttention {
 public:
  RingAttention(Comm& sp, SequenceLayout layout);
  /// 6.2 (6.4 for zigzag): keys and values travel the ring, n - 1
  /// transfers; blocks no query sees are skipped.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v);
  /// 6.3: dq stays; dk and dv travel with their blocks and come home.
  void backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

 private:
  Comm& sp_;
  SequenceLayout layout_;
  Tensor q_, k_, v_;
  PartialAttention result_;
};

/// Puzzle 6.5. Ulysses inside groups of @p ulysses_size consecutive ranks
/// (Comm::split), ring attention across the groups.
class HybridAttention {
 public:
  HybridAttention(Comm& sp, int ulysses_size, int heads);
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v);
  void backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

 private:
  Comm& sp_;
  Comm inner_, outer_;
  int heads_;
  Tensor q_, k_, v_;
  PartialAttention result_;
};

}  // namespace dtp::ch06
