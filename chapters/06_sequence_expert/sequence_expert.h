/// @file sequence_expert.h
/// @brief Chapter 06 contract: sequence parallelism (Ulysses, ring
/// attention, zigzag, the 2-D hybrid) and expert parallelism (a mixture of
/// experts on one rank, then its experts spread over ranks).
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
/// causal mask uses global positions.
///
/// A mixture of experts replaces an MLP by E expert MLPs and a router that
/// sends each token to k of them (the rules are in dtp/moe_routing.h):
/// - **The layer on one rank** (6.6): the routing rules themselves
///   (route_tokens), then MoeLayer's forward (router, route, dispatch each
///   expert its rows, combine) and backward (the combine weights' and the
///   load-balancing loss's gradients reach the router).
/// - **Expert parallelism** (6.7): rank j of m holds experts
///   [j E/m, (j+1) E/m); tokens travel to their experts and back with
///   Comm::all_to_all_v, two exchanges forward and two backward.
///
/// The runtime's dtp::MoeMlp is a finished single-rank layer with the same
/// rules: the puzzles borrow its weights (router and experts) and must not
/// call its forward or backward, nor dtp::moe_route.
/// See chapters/06_sequence_expert/README.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/moe_routing.h"
#include "dtp/nn.h"
#include "dtp/nn_ops.h"
#include "dtp/optim.h"
#include "dtp/tensor.h"
#include "dtp/trainer.h"

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

/// Positions [start, start + length) of the sequence: the runtime's
/// dtp::PositionRange, which GPT::forward also takes.
using dtp::PositionRange;

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
/// with one all_to_all on @p sp. H must divide by n: otherwise a dtp::Error that says "heads" and
/// names H and n.
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
  std::int64_t T_ = 0;                    // the whole sequence's length (n T_local)
  std::vector<Tensor> q_, k_, v_;         // one piece per range of this rank
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

// --- provided: rows of a batch -----------------------------------------------------------

/// Rows @p rows of x [N, C], in that order: [rows.size(), C], a copy (the
/// tokens one expert takes). Rows must be in [0, N) (dtp::Error otherwise).
Tensor gather_rows(const Tensor& x, const std::vector<std::int32_t>& rows);
/// y[rows[i]] += src[i] for every i: src [rows.size(), C] added into those
/// rows of y [N, C] (an expert's outputs back to their tokens). Rows must be
/// distinct, as one expert's are, so nothing collides.
void scatter_add_rows(const Tensor& src, const std::vector<std::int32_t>& rows, Tensor& y);

/// Rows [first, first + count) of x [R, C]: a view [count, C] sharing x's
/// storage (writes go to x), e.g. one expert's block of a packed buffer.
Tensor row_block(const Tensor& x, std::int64_t first, std::int64_t count);

// --- provided: the router ------------------------------------------------------------------

/// The router's probabilities [N, E] for tokens x [N, C]: weights.router's
/// logits, then ops::softmax_forward. Fills @p saved for router_backward.
Tensor router_probabilities(const MoeMlp& weights, const Tensor& x, LinearSaved& saved);
/// The router's share of dx [N, C], given d loss / d probs (host, row-major
/// [N, E]): ops::softmax_backward to the logits, then the router's backward,
/// which accumulates the router's weight gradient. Releases @p saved.
Tensor router_backward(const MoeMlp& weights, const Tensor& probs,
                       const std::vector<double>& d_probs, LinearSaved& saved);

// --- puzzle 6.6: a mixture of experts on one rank ---------------------------------------------

/// Puzzle 6.6a. Routes N = probs.size() / experts tokens (probs row-major
/// [N, E], each row a distribution) by the rules of dtp/moe_routing.h: top-k
/// (ties to the lower index), capacity moe_capacity(N, E, k, cf) (provided),
/// admission round by round (every first choice in token order, then every
/// second choice, ...), a choice whose expert is full dropped, combine
/// weights the probabilities. Fills every field of MoeRouting, load and
/// importance included. Bad sizes: dtp::Error (moe_capacity checks k and cf).
MoeRouting route_tokens(const std::vector<double>& probs, int experts, int top_k,
                        double capacity_factor);

/// Puzzle 6.6b. A mixture-of-experts layer on one rank, with the weights of
/// a dtp::MoeMlp (its router, experts, top_k, capacity_factor and
/// aux_loss_coef). Gradients accumulate into the MoeMlp's unit, as its own
/// backward would.
class MoeLayer {
 public:
  /// Borrows @p weights (it must outlive the layer); provided.
  explicit MoeLayer(const MoeMlp& weights);
  /// y [N, C] for tokens x [N, C]: router_probabilities, route_tokens,
  /// then for every expert with rows: gather its rows, run
  /// the expert, scale by the combine weights, scatter_add_rows into y.
  /// Keeps what backward needs; routing() and aux_loss() describe the batch.
  Tensor forward(const Tensor& x);
  /// dx [N, C] for dy [N, C], for the loss "sum(y * dy) + aux_loss()":
  /// every expert's backward on its rows of dy scaled by the weights; the
  /// combine weights' gradient (ops::row_dot of dy's rows and the expert's
  /// output) and the balance loss's (aux_loss_coef * balance_gradient(e),
  /// every token) into d probs, and router_backward's share of dx.
  Tensor backward(const Tensor& dy);
  /// The last forward's routing.
  const MoeRouting& routing() const { return routing_; }
  /// aux_loss_coef * the last forward's balance loss.
  double aux_loss() const { return aux_loss_; }

 private:
  const MoeMlp& w_;
  MoeRouting routing_;
  double aux_loss_ = 0;
  LinearSaved router_saved_;     // the router's input
  Tensor probs_;                 // [N, E]
  std::vector<Tensor> outputs_;  // per expert: its output on its rows, before the weights
  std::vector<MlpSaved> saved_;  // per expert: the MLP's own
};

// --- puzzle 6.7: expert parallelism --------------------------------------------------------------

/// Puzzle 6.7. The experts of a MoE layer spread over the m ranks of @p ep:
/// rank j runs only experts [j E/m, (j+1) E/m). Every rank keeps its own
/// tokens and routes them itself (the router is replicated), exactly as
/// MoeLayer would on that rank's tokens alone; rows travel to the experts'
/// ranks and back with all_to_all_v. Output and gradients equal MoeLayer on
/// each rank's tokens, with each expert's gradient summed over every rank's
/// tokens.
class ExpertParallelMoe {
 public:
  /// Borrows @p weights (every rank holds the same router; only this rank's
  /// experts are used: in training, weights.holds(e) is false for the others,
  /// whose weights are not on this rank) and checks that E divides over the m ranks
  /// (dtp::Error naming both); provided.
  ExpertParallelMoe(Comm& ep, const MoeMlp& weights);
  /// y [N, C] for this rank's tokens x [N, C]. Route; tell every peer how
  /// many rows it gets for each of its experts (one small collective); send
  /// each kept choice's row to its expert's rank (all_to_all_v, rows packed
  /// by destination rank, then by expert, then in routing order); run each
  /// local expert once on the rows it received from every rank; send the
  /// outputs back (all_to_all_v with the counts transposed); scale by the
  /// combine weights and scatter_add_rows into y. No other communication.
  Tensor forward(const Tensor& x);
  /// dx [N, C] for dy [N, C] (loss "sum(y * dy) + aux_loss()" on this rank):
  /// the combine weights' gradient and the balance loss's locally, dy's rows
  /// (scaled by the weights) to the experts (all_to_all_v), the local
  /// experts' backward, their input gradients back (all_to_all_v), the
  /// router's backward. Exactly two all_to_all_v and nothing else. Only
  /// this rank's experts (and the router) get gradients.
  Tensor backward(const Tensor& dy);
  /// This rank's routing of its own tokens.
  const MoeRouting& routing() const { return routing_; }
  /// aux_loss_coef * this rank's balance loss.
  double aux_loss() const { return aux_loss_; }
  /// The first expert this rank holds (j E / m).
  int first_expert() const { return first_; }
  /// How many experts each rank holds (E / m).
  int local_experts() const { return local_; }

 private:
  Comm& ep_;
  const MoeMlp& w_;
  int first_ = 0, local_ = 0;
  MoeRouting routing_;
  double aux_loss_ = 0;
  LinearSaved router_saved_;
  Tensor probs_;
  std::vector<std::int64_t> send_counts_, recv_counts_;  // per peer: elements (rows times C)
  std::vector<std::vector<std::int32_t>>
      recv_rows_;                // per local expert: its rows in the receive buffer
  std::vector<Tensor> outputs_;  // per expert of E: its outputs for this rank's rows, back home
  std::vector<MlpSaved> saved_;  // per local expert: the MLP's own
};

}  // namespace dtp::ch06
