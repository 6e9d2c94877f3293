/// @file nn_ops.h
/// @brief The math the GPT model needs, one function per idea: matmul, bias,
/// GELU, LayerNorm, softmax, attention (naive and flash style), embedding,
/// cross-entropy, casts, checks, optimizer updates, seeded initialization.
///
/// Conventions every op follows:
/// - Callers allocate outputs (so memory is charged to the category the caller
///   chooses) and pass them in; shapes are checked and errors name the
///   expected shape.
/// - Input gradients (`dx`) are overwritten; parameter gradients (`dweight`,
///   `dbias`, `dtable`) are accumulated (+=), so gradients add up across
///   micro-batches until someone zeroes them.
/// - Floating ops run on f64 (computing in f64), f32, bf16 and f16 (computing
///   in f32). A bf16 or f16 op reads its inputs as f32 and rounds each value
///   it stores to nearest even, once: nothing is rounded in between, except
///   in flash attention, which rounds P and dS to the 16-bit type before the
///   products that use them, as its tensor-core kernels must (naive attention
///   stores P in that type anyway). That is the contract of tensor-core
///   kernels, and the CUDA ops keep it (f32, bf16 and f16 there; f64 only on
///   the CPU). All floating operands of an op share one dtype.
/// - Matrices are row-major; a tensor of shape [..., C] is read as a matrix of
///   numel / C rows and C columns.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "dtp/ops.h"  // accumulate, scale, equal: the element-wise basics
#include "dtp/tensor.h"

namespace dtp {

/// A small, portable, seeded random number generator (splitmix64). The same
/// seed gives the same numbers on every platform, unlike std distributions.
class Rng {
 public:
  /// A stream determined by @p seed alone.
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  /// A seed for an independent stream, derived from a base seed and a stream id
  /// (e.g. a unit index): the same pair always gives the same stream.
  static std::uint64_t derive(std::uint64_t seed, std::uint64_t stream);
  /// 64 random bits.
  std::uint64_t next();
  /// Uniform in [0, 1).
  double uniform();
  /// Uniform integer in [0, n); n >= 1.
  std::int64_t below(std::int64_t n);
  /// Standard normal (Box-Muller).
  double normal();

 private:
  std::uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

namespace ops {

// --- initialization and element-wise ------------------------------------------

/// x[i] = mean + std * N(0, 1), drawn in index order from @p rng (values are
/// drawn in double, then rounded to x's dtype, so f32 and f64 agree to rounding).
void fill_normal(Tensor& x, double mean, double std, Rng& rng);
/// out = a + b (same shape, dtype; out may alias a or b).
void add(const Tensor& a, const Tensor& b, Tensor& out);
/// y += alpha * x.
void axpy(Tensor& y, double alpha, const Tensor& x);
/// Sum of x[i]^2, accumulated in double (for global gradient norms).
double sum_squares(const Tensor& x);
/// True when no element is NaN or infinite (integer tensors: always true).
bool all_finite(const Tensor& x);
/// sum_squares of each tensor, in order. On a GPU the host waits once for
/// all of them, not once per tensor (global gradient norms over many units).
std::vector<double> sum_squares(const std::vector<Tensor>& xs);
/// True when no element of any of the tensors is NaN or infinite; on a GPU
/// the host waits once for all of them.
bool all_finite(const std::vector<Tensor>& xs);
/// dst = src converted to dst's dtype (any dtype to any; float to i32 truncates).
/// Same element count.
void cast(const Tensor& src, Tensor& dst);

// --- matmul and bias -----------------------------------------------------------

/// out = alpha * op(a) @ op(b) + beta * out, where op(m) is m or its transpose.
/// a is [M, K] ([K, M] when transpose_a), b is [K, N] ([N, K] when transpose_b),
/// out is [M, N]; each is read as a matrix whose columns are its last dim.
/// With beta = 0 out's old contents are ignored (NaNs included).
/// A Linear layer with weight W [out, in]: forward y = x W^T is
/// matmul(x, W, y, false, true); input gradient dx = dy W is matmul(dy, W, dx);
/// weight gradient dW += dy^T x is matmul(dy, x, dW, true, false, 1, 1).
void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a = false,
            bool transpose_b = false, double alpha = 1.0, double beta = 0.0);
/// x[n, c] += bias[c] for x of shape [..., C] and bias [C].
void add_bias(Tensor& x, const Tensor& bias);
/// dbias[c] += sum over rows n of dy[n, c].
void bias_backward(const Tensor& dy, Tensor& dbias);

// --- GELU ------------------------------------------------------------------------

/// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) element-wise; y may alias x.
void gelu_forward(const Tensor& x, Tensor& y);
/// dx = dy * gelu'(x); dx may alias dy.
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);

// --- LayerNorm -------------------------------------------------------------------

/// Over the last dim C of x [..., C]: y = (x - mean) * rstd * weight + bias, with
/// rstd = 1 / sqrt(var + eps) (biased variance). Saves mean and rstd, each with
/// one element per row (numel(x) / C), for the backward.
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                       Tensor& mean, Tensor& rstd, double eps = 1e-5);
/// dx = LayerNorm input gradient (overwritten); dweight, dbias accumulated.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias);

// --- softmax -------------------------------------------------------------------------

/// y = softmax over the last dim of x (max-subtracted); y may alias x.
void softmax_forward(const Tensor& x, Tensor& y);
/// dx = y * (dy - sum(dy * y)) row-wise; dx may alias dy.
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);

// --- attention -----------------------------------------------------------------------

/// Which keys a query may see. Query row i sits at global position
/// q_start + i and key row j at k_start + j; with causal, key j is visible to
/// query i when k_start + j <= q_start + i. The offsets let ring attention and
/// sequence parallelism run one block of a longer sequence.
struct AttentionMask {
  bool causal = true;        ///< hide keys after the query's position
  std::int64_t q_start = 0;  ///< global position of query row 0
  std::int64_t k_start = 0;  ///< global position of key row 0
};

/// Naive attention. q [B, Tq, H, D], k and v [B, Tk, H, D] (the [B, T, C]
/// activations viewed with C = H * D), out [B, Tq, H, D].
/// probs [B, H, Tq, Tk] receives the softmax of scale * q k^T (masked entries 0)
/// and is what the backward needs. A query row that sees no key gives zeros.
/// @p scale defaults to 1/sqrt(D) when <= 0.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& probs, const AttentionMask& mask = {}, double scale = 0);
/// Gradients of attention_forward; dq, dk, dv are overwritten.
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionMask& mask = {}, double scale = 0);

/// Online-softmax ("flash") attention: keys are visited in tiles of
/// @p block_size and never form the full Tq x Tk score matrix. Same layout as
/// attention_forward; instead of probs it writes, per query row ([B, H, Tq]),
/// row_max = the largest visible scaled score and row_sum = sum of
/// exp(score - row_max). A row that sees no key has row_max = -inf, row_sum = 0
/// and out = 0. (out, row_max, row_sum) is a partial result that
/// attention_merge can combine with another over disjoint keys.
void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                             Tensor& row_max, Tensor& row_sum, const AttentionMask& mask = {},
                             double scale = 0, std::int64_t block_size = 128);
/// Gradients of attention given the final output and its row statistics:
/// probabilities are recomputed as exp(score - row_max) / row_sum. The
/// statistics may cover more keys than @p k holds (ring attention passes the
/// global ones and one key block at a time). dq, dk, dv are overwritten.
void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& row_max, const Tensor& row_sum, const Tensor& dout,
                              Tensor& dq, Tensor& dk, Tensor& dv, const AttentionMask& mask = {},
                              double scale = 0);
/// The online-softmax merge. (out, row_max, row_sum) and (other_out,
/// other_max, other_sum) are attention results of the same queries over two
/// disjoint sets of keys, each normalized over its own keys. Afterwards
/// (out, row_max, row_sum) is the result over the union:
///   m = max(m_a, m_b); w_a = l_a exp(m_a - m); w_b = l_b exp(m_b - m);
///   out = (w_a out_a + w_b out_b) / (w_a + w_b); row_sum = w_a + w_b; row_max = m.
/// Rows that saw no key (row_sum 0) contribute nothing. out is [B, Tq, H, D],
/// the statistics [B, H, Tq].
void attention_merge(Tensor& out, Tensor& row_max, Tensor& row_sum, const Tensor& other_out,
                     const Tensor& other_max, const Tensor& other_sum);

// --- layout --------------------------------------------------------------------------

/// A copy of @p in with its four axes reordered: out's axis i is in's axis
/// order[i], so out.size(i) == in.size(order[i]). Any dtype; both 4-D (view
/// them first), same dtype and device, not sharing storage. Sequence
/// parallelism uses it to make each peer's block of a [B, T, H, D] tensor
/// contiguous for an all-to-all: {2, 0, 1, 3} turns [B, T, N, E] into
/// [N, B, T, E].
void permute(const Tensor& in, const std::array<int, 4>& order, Tensor& out);

// --- per-row weights (mixture of experts) -----------------------------------------------

/// x[n, :] *= w[n] for x [..., C] (N rows) and w (N elements, x's dtype and
/// device). A mixture of experts scales each expert's output row by the
/// router's weight for that token.
void scale_rows(Tensor& x, const Tensor& w);
/// out[n] = sum over c of a[n, c] * b[n, c] for a and b [..., C] (N rows, same
/// shape) and out (N elements). The backward of scale_rows: the gradient of
/// the weight w[n] is row_dot(dy, x) before the scaling.
void row_dot(const Tensor& a, const Tensor& b, Tensor& out);

// --- embedding -----------------------------------------------------------------------

/// out[n, :] = table[ids[n], :]; ids i32 of any shape (N elements), table [V, C],
/// out [..., C] with N rows. Ids outside [0, V) are an error naming the position.
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out);
/// dtable[ids[n], :] += dout[n, :].
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);
/// x[b, t, :] += positions[start + t, :] for x [B, T, C] and positions [P, C]
/// (start + T <= P).
void add_positions(Tensor& x, const Tensor& positions, std::int64_t start = 0);
/// dpositions[start + t, :] += sum over b of dx[b, t, :].
void positions_backward(const Tensor& dx, Tensor& dpositions, std::int64_t start = 0);

// --- cross-entropy ---------------------------------------------------------------------

/// Softmax cross-entropy of logits [..., V] (N rows) against targets i32 (N
/// elements, each in [0, V)). Writes the per-row loss into @p losses (N
/// elements; pass an undefined tensor to skip) and returns the mean over rows,
/// computed in double.
double cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses);
/// dlogits = (softmax(logits) - onehot(targets)) * loss_scale; for the gradient
/// of the mean loss pass loss_scale = 1 / N. dlogits may alias logits (fused,
/// in place: saves a [N, V] buffer).
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, double loss_scale,
                            Tensor& dlogits);

// --- tensor parallelism: a vocabulary split over ranks (chapter 04) ----------------------
// Rank r of t holds rows [vocab_start, vocab_start + V/t) of the token table
// and the same slice of every row of logits. These ops do one rank's share;
// the caller combines the ranks' shares with collectives.

/// out[n, :] = table_shard[ids[n] - vocab_start, :] when vocab_start <= ids[n]
/// < vocab_start + Vs (Vs = table_shard's rows), else zeros: this rank's part
/// of a vocabulary-parallel lookup. ids i32 (N elements), out [..., C], N rows.
void embedding_shard_forward(const Tensor& ids, const Tensor& table_shard, std::int64_t vocab_start,
                             Tensor& out);
/// dtable_shard[ids[n] - vocab_start, :] += dout[n, :] for the ids inside the
/// shard's rows; the others are skipped.
void embedding_shard_backward(const Tensor& ids, const Tensor& dout, std::int64_t vocab_start,
                              Tensor& dtable_shard);
/// out[n] = the largest element of row n of x [..., V] (N rows, out N elements).
void row_max(const Tensor& x, Tensor& out);
/// Per row n of a logits slice [..., Vs] (ids vocab_start + v), given the
/// row's max over the WHOLE vocabulary row_max[n]:
/// sum_exp[n] = sum_v exp(logits[n, v] - row_max[n]), and target_logit[n] =
/// logits[n, targets[n] - vocab_start] when the target lies in the slice,
/// else 0. Targets are i32, one per row, in [0, V) of the whole vocabulary.
void vocab_shard_softmax_sums(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start,
                              const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit);
/// dlogits[n, v] = (exp(logits[n, v] - row_max[n]) / sum_exp[n] - [vocab_start + v ==
/// targets[n]]) * loss_scale, with row_max and sum_exp over the whole vocabulary.
/// dlogits may alias logits.
void vocab_shard_cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        std::int64_t vocab_start, const Tensor& row_max,
                                        const Tensor& sum_exp, double loss_scale, Tensor& dlogits);

// --- optimizer updates on flat buffers ----------------------------------------------------

/// One AdamW step on matching flat buffers (any shapes with equal numel, one
/// floating dtype): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
/// p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + weight_decay * p).
/// The decay is decoupled (not added to g). @p step is t, counted from 1.
void adamw_update(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, double lr,
                  double beta1, double beta2, double eps, double weight_decay, std::int64_t step);
/// One SGD step with momentum: g' = g + weight_decay * p; buf = momentum * buf + g';
/// p -= lr * buf (nesterov: p -= lr * (g' + momentum * buf)). With momentum 0
/// @p momentum_buffer may be undefined.
void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, double lr,
                double momentum, double weight_decay = 0, bool nesterov = false);

}  // namespace ops
}  // namespace dtp
