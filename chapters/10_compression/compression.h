/// @file compression.h
/// @brief Chapter 10 contract: communication compression.
///
/// Data parallelism moves every gradient every step. Over a slow link
/// (Ethernet between machines, a WAN between sites) that traffic is the
/// step. Compression sends fewer bits and accepts an error:
///
/// - block quantization (10.1) sends each value as a 4- or 8-bit code with
///   one scale per block;
/// - sign compression with error feedback (10.2) sends one bit per value and
///   carries what it lost into the next step, so nothing is lost for good;
/// - 1-bit Adam (10.3) runs Adam exactly for a warm-up, then freezes the
///   variance and sends the momentum through 10.2;
/// - PowerSGD (10.4) sends a rank-r factorization P Q^T of each weight's
///   gradient, with error feedback too;
/// - ZeRO++ (10.5) quantizes ZeRO-3's weight all-gather (qwZ) and gradient
///   reduce-scatter (qgZ), and keeps a second copy of the weights sharded
///   inside a node so the backward's all-gather stays on the fast links
///   (hpZ).
///
/// Codes travel as 32-bit words (i32 tensors): value i of a packed array of
/// b-bit codes sits in bits [(i b) mod 32, (i b) mod 32 + b) of word
/// floor(i b / 32), as a b-bit two's complement number (1-bit codes: bit 1
/// for +, 0 for -). So every byte on the wire is counted by the
/// communicator's statistics exactly.
///
/// Devices. Every Comm (thread, mpi, nccl) runs the compressors of 10.2 to
/// 10.5. Their tensors (x, shard, full, the model's parameters and
/// gradients) live on comm.device(): the CPU on thread and mpi, a GPU under
/// nccl or DTP_DEVICE=cuda (NCCL moves device memory only). The arithmetic
/// runs on the host, by staging: copy the input there
/// (Tensor::to(Device::cpu())), compute codes, scales, residuals or
/// factors, move only what crosses the wire to comm.device()
/// (Tensor::to(comm.device())) for the collective, copy what arrived back
/// to the host, and copy the result into the caller's tensor (copy_from
/// works across devices). So the wire carries the same i32 codes and
/// scales on every device, and the results are the same bits. The state
/// that only the host arithmetic reads (SignAllReduce's residual, PowerSgd's
/// Q and E) lives on the host; 1-bit Adam's m and v sit beside the
/// parameters, on their device. 10.1 is the per-value math: host tensors
/// only. See chapters/10_compression/README.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/tensor.h"

/// Chapter 10: communication compression.
namespace dtp::ch10 {

// --- provided -------------------------------------------------------------------

/// 32-bit words that hold @p count codes of @p bits bits each.
inline std::int64_t packed_words(std::int64_t count, int bits) { return (count * bits + 31) / 32; }

/// Block-quantized values: what travels instead of a float tensor.
struct QuantizedTensor {
  Tensor codes;            ///< i32 [packed_words(numel, bits)], packed as the file comment says
  Tensor scales;           ///< one per block, in the input's dtype: the block's max |x| / qmax
  int bits = 8;            ///< 4 or 8
  std::int64_t block = 0;  ///< values per block (the last block may be shorter)
  std::int64_t numel = 0;  ///< values quantized
  /// Bytes on the wire: the codes' and the scales'.
  std::int64_t wire_bytes() const {
    return static_cast<std::int64_t>(codes.nbytes() + scales.nbytes());
  }
};

/// The largest code of a b-bit symmetric quantizer: 2^(b-1) - 1 (127, 7).
inline int max_code(int bits) { return (1 << (bits - 1)) - 1; }

// --- the puzzles ----------------------------------------------------------------

/// Puzzle 10.1 (first half). Quantizes @p x (f32 or f64, any shape read flat, on the host:
/// Device::cpu(), as are the codes and scales it returns) in blocks of
/// @p block values to @p bits (4 or 8) bits: per block, scale = max |x_i| /
/// max_code(bits) (0 for a block of zeros), code_i = x_i / scale rounded to
/// nearest, ties to even (std::nearbyint), and clamped to
/// [-max_code, max_code]; a zero scale gives code 0. Both divisions are done
/// in x's dtype (float for f32), so every implementation gets the same
/// codes. Throws dtp::Error for bits other than 4 or 8, block < 1, or a
/// value that is not finite (naming its index).
QuantizedTensor quantize_blocks(const Tensor& x, int bits, std::int64_t block);

/// Puzzle 10.1 (second half). out_i = code_i * scale of i's block, in the
/// scales' dtype; @p q and @p out are host tensors, and @p out must have
/// q.numel elements of that dtype.
/// |x_i - out_i| <= scale / 2, up to the rounding of the division and the
/// product.
void dequantize_blocks(const QuantizedTensor& q, Tensor& out);

/// Puzzle 10.2. An all-reduce (mean) of 1-bit compressed vectors with error
/// feedback (Seide et al. 2014; the compressor of 1-bit Adam).
///
/// all_reduce(x) on every rank: v = x + residual; this rank's compressed
/// vector is c = s sign(v) with s = mean_i |v_i| (|v_0| + |v_1| + ... added
/// in index order, then divided by numel) and sign(0) = +1; residual
/// becomes v - c. The ranks exchange their signs, packed 32 to a word
/// (packed_words(n, 1) i32 words), and their s (one value of x's dtype)
/// through two Comm::all_gather calls, and every rank sets
/// x = (c_0 + c_1 + ... + c_{N-1}) / N, added in rank order and then
/// divided by N, so that every replica gets the same bits. All arithmetic
/// is in x's dtype. The residual carries what compression lost: over any
/// number of steps, the sum of a rank's c plus its final residual is the
/// sum of its x. x is on comm.device(); v, s, the signs, c and the average
/// are computed on a host copy of it, and only the signs and s cross the
/// wire (see the file comment).
class SignAllReduce {
 public:
  /// For vectors of @p numel (>= 1) elements of @p dtype (f32 or f64); the
  /// residual starts at 0, on the host.
  SignAllReduce(Comm& comm, std::int64_t numel, DType dtype);
  /// See the class comment; @p x is 1-D with numel elements, on comm.device().
  void all_reduce(Tensor& x);
  /// This rank's residual (what compression has not sent yet), on the host.
  const Tensor& residual() const { return residual_; }

 private:
  Comm& comm_;
  Tensor residual_;
};

/// Settings of 1-bit Adam.
struct OneBitAdamConfig {
  double lr = 1e-3;       ///< step size (no schedule)
  double beta1 = 0.9;     ///< the momentum's decay
  double beta2 = 0.999;   ///< the variance's decay
  double eps = 1e-8;      ///< added to sqrt(v)
  int warmup_steps = 10;  ///< steps of exact Adam before the variance freezes
};

/// Puzzle 10.3. 1-bit Adam (Tang et al. 2021) over the model's flat
/// parameter buffers, one per unit, written as that paper's Adam: no bias
/// correction, and per element, in double, each result rounded to the
/// parameters' dtype as it is stored (in C++, left to right):
///
///     m = b1 * m + (1 - b1) * g
///     v = b2 * v + (1 - b2) * g * g
///     p = p - lr * m / (std::sqrt(v) + eps)
///
/// step() for the first warmup_steps steps: every unit's gradient is
/// all-reduced (ReduceOp::avg, one all_reduce per unit), then Adam updates
/// m, v and the parameters exactly as above. After that the variance is
/// frozen: each rank updates its momentum from its own, local gradient
/// (nothing is all-reduced), then the momentum goes through a SignAllReduce
/// (one per unit, so each carries its own error), and p is updated as above
/// with the frozen v. Every rank then holds the same m and the same
/// parameters. The parameters are on comm.device(), and m and v beside
/// them; the formulas run on the host (to_vector(), then copy_from).
class OneBitAdam {
 public:
  /// Zeroed m and v for every unit of @p model, and one SignAllReduce per unit.
  OneBitAdam(Comm& comm, GPT& model, const OneBitAdamConfig& config);
  /// One optimizer step from the gradients the last backward left.
  void step();
  /// Steps done so far.
  int steps() const { return steps_; }
  /// True once the variance is frozen (steps() >= warmup_steps).
  bool compressing() const { return steps_ >= config_.warmup_steps; }
  /// Unit @p u's momentum (flat, like its parameters).
  const Tensor& momentum(int u) const { return m_.at(static_cast<std::size_t>(u)); }
  /// Unit @p u's variance (flat, like its parameters).
  const Tensor& variance(int u) const { return v_.at(static_cast<std::size_t>(u)); }

 private:
  Comm& comm_;
  GPT& model_;
  OneBitAdamConfig config_;
  int steps_ = 0;
  std::vector<Tensor> m_, v_;
  std::vector<SignAllReduce> compressors_;
};

/// Puzzle 10.4. PowerSGD (Vogels et al. 2019): averages the gradients of a
/// model's weight matrices through rank-r factors, with error feedback.
///
/// For every parameter with two dimensions (a weight [out, in]), with its
/// gradient G and this rank's error E (starting at 0): M = G + E;
/// P = M Q [out, r]; all-reduce P (mean); orthonormalize P's columns (Gram-
/// Schmidt, column 0 first: each column minus its projections on the columns
/// before it, then divided by its norm, in any precision: the checkers
/// allow for it; a column of norm 0, from a zero gradient or r above the
/// rank of M, stays 0); Q = M^T P [in, r]; all-reduce Q
/// (mean); G = P Q^T; E = M - P Q^T. Every all-reduce is ReduceOp::avg, one
/// call per tensor: P and Q of each matrix, and each other parameter's
/// gradient whole (biases and LayerNorm; the embeddings' tables are 2-D, so
/// they are compressed). Q persists from step to step (a warm start); it
/// starts as ops::fill_normal(q, 0, 1, rng) with one Rng rng(seed) filling
/// every matrix's Q in order (units forward, parameters in layout order),
/// the same on every rank. Q and E have the model's dtype and live on the
/// host: M, P, Q, G and E are computed there from a host copy of each
/// gradient, only P and Q go to comm.device() for their all-reduces, and G
/// is copied back into the gradient; the other parameters' gradients are
/// all-reduced where they are.
class PowerSgd {
 public:
  /// Factors of rank @p low_rank (r; not the communicator's rank). Throws
  /// dtp::Error naming r when it is below 1, and naming the matrix too when
  /// it exceeds min(out, in) of a matrix.
  PowerSgd(Comm& comm, GPT& model, int low_rank, std::uint64_t seed);
  /// Averages the gradients the last backward left, as the class comment says.
  void all_reduce_gradients();

  /// One compressed weight, in the order above.
  struct Matrix {
    int unit;          ///< index into model.units()
    std::string name;  ///< the parameter
    Tensor q;          ///< Q [in, r], on the host
    Tensor error;      ///< this rank's error E [out, in], on the host
  };
  /// Every compressed weight (what the checkers read Q and E from).
  const std::vector<Matrix>& matrices() const { return matrices_; }

 private:
  Comm& comm_;
  GPT& model_;
  int low_rank_;
  std::vector<Matrix> matrices_;
};

/// Puzzle 10.5 (qwZ). All-gathers a parameter shard quantized: each rank
/// quantizes its shard (quantize_blocks, 8 bits, @p block), the ranks
/// all-gather codes and scales, and every rank dequantizes every shard into
/// its place in @p full (rank r's shard at chunk_range(full.numel(), N, r)).
/// Every rank gets the same bits, its own shard included. The shards'
/// counts of words and of scales follow chunk_range as the shards do, so
/// Comm::all_gather takes them as they are (one call for the codes, one for
/// the scales). @p shard and @p full are on comm.device(); the quantizing
/// and dequantizing run on host copies. Throws dtp::Error when @p shard's
/// length is not this rank's chunk of @p full.
void quantized_all_gather(Comm& comm, const Tensor& shard, Tensor& full, std::int64_t block);

/// Puzzle 10.5 (qgZ). A reduce-scatter (mean) through one all-to-all of
/// quantized chunks: rank r quantizes chunk j of its @p full
/// (chunk_range(full.numel(), N, j), @p bits, @p block) for each rank j,
/// the ranks exchange them with Comm::all_to_all_v (one call for the codes,
/// one for the scales), and rank j dequantizes the N chunks it received,
/// d_0 .. d_{N-1}, into @p shard = (d_0 + d_1 + ... + d_{N-1}) / N, added in
/// rank order and then divided by N, in full's dtype. @p full and @p shard
/// are on comm.device(), staged through the host as in qwZ. Throws
/// dtp::Error when @p shard's length is not this rank's chunk.
void quantized_reduce_scatter(Comm& comm, const Tensor& full, Tensor& shard, int bits,
                              std::int64_t block);

/// Puzzle 10.5 (hpZ). The secondary partition: after the forward's global
/// all-gather of @p full, this rank keeps chunk node.rank() of node.size()
/// (chunk_range) of it, a shard that its node's ranks (the communicator
/// @p node) together hold whole; the backward then gathers @p full back
/// from the node alone with secondary_all_gather. Returns a copy, on
/// @p full's device (node.device()): hpZ moves the weights as they are, so
/// nothing here goes through the host.
Tensor secondary_shard(Comm& node, const Tensor& full);
/// The backward's gather of hpZ: @p full from the node's secondary shards,
/// one Comm::all_gather on @p node. Throws dtp::Error when @p secondary's
/// length is not this rank's chunk.
void secondary_all_gather(Comm& node, const Tensor& secondary, Tensor& full);

}  // namespace dtp::ch10
