/// @file tensor_parallel.h
/// @brief Chapter 04 contract: tensor parallelism (Megatron-LM style).
///
/// Data parallelism (chapters 02-03) splits the batch; tensor parallelism
/// splits every weight matrix across the t ranks of a **TP group**, so each
/// rank holds 1/t of each layer and computes 1/t of its output. The trick is
/// to pair the splits so that communication is rare:
///
/// - a **column-parallel** linear (4.1) splits W [out, in] by output rows:
///   rank r computes y_r = x W_r^T, its own slice of the output features,
///   from the whole input. Forward: nothing to communicate. Backward: each
///   rank's dx is a partial sum, so dx is **all-reduced**.
/// - a **row-parallel** linear (4.2) splits W by input columns: rank r
///   computes x_r W_r^T from its own slice of the input features, a partial
///   sum of the whole output. Forward: the output is **all-reduced** (then
///   the bias is added, once). Backward: nothing to communicate.
///
/// A column-parallel linear feeding a row-parallel one (the MLP: fc then
/// proj; attention: q, k, v by heads then the output projection) therefore
/// costs exactly one all-reduce forward and one backward.
///
/// With **sequence parallelism** (`sequence_parallel = true`) the activations
/// outside the linears (LayerNorm, residual) are split too: each rank keeps
/// 1/t of the tokens. The all-reduce becomes its two halves: the
/// column-parallel linear **all-gathers** the token shards before it
/// (backward: **reduce-scatters** dx), the row-parallel one
/// **reduce-scatters** its partial output into token shards (backward:
/// **all-gathers** dy). A token shard is rank r's chunk of the B*T tokens
/// flattened in order (rows chunk_range(B*T, t, r) of the [B*T, C] matrix),
/// held as a 2-D [B*T/t, C] tensor; B*T must divide by t.
///
/// Every layer holds views of its unit's flat buffers (the shards), like the
/// serial layers in nn.h. The units here (TensorParallelEmbedding,
/// TensorParallelBlock, TensorParallelHead) are built from the serial GPT's
/// units by copying out this rank's slices (provided code), so a TP model
/// starts exactly where the serial one does. See
/// chapters/04_tensor_parallel/README.md for the pictures and the formulas.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/optim.h"
#include "dtp/tensor.h"
#include "dtp/trainer.h"

/// Chapter 04: tensor parallelism.
namespace dtp::ch04 {

// --- provided: how a dimension splits ---------------------------------------------

/// Rank @p rank's part of a dimension of @p size split @p parts ways: offset
/// rank * size / parts, length size / parts. Tensor parallelism needs equal
/// parts, so a size that does not divide throws dtp::Error naming @p what,
/// the size and the number of parts ("attention heads: 6 heads do not split
/// over 4 tensor-parallel ranks").
ChunkRange even_split(const std::string& what, std::int64_t size, int parts, int rank);

/// True for the parameters every rank of a TP group holds whole (the
/// LayerNorms, the positions, the row-parallel biases); false for the ones it
/// holds a slice of. By name, as the units below lay them out.
bool is_replicated(const std::string& parameter_name);

/// Provided: copies this rank's slice of parameter @p name (as the serial
/// model names it) out of its full value @p full into @p slice: its rows or
/// columns by the layer's split, all of it when replicated. How every TP
/// unit gets its weights from the serial model, and a resumed run from a
/// checkpoint.
void copy_tensor_parallel_slice(const std::string& name, const Tensor& full, Tensor slice,
                                int parts, int rank);

/// Provided: the inverse, collective over @p tp: parameter @p name's full
/// value, of shape @p full_shape, put together on @p tp's rank 0 from every
/// rank's @p slice (undefined on the other ranks). How a checkpoint is
/// consolidated.
Tensor gather_tensor_parallel_slices(Comm& tp, const std::string& name, const Tensor& slice,
                                     const Shape& full_shape);

// --- 4.1 and 4.2: the two linears --------------------------------------------------

/// Puzzle 4.1. Column-parallel linear: W [out, in] split by output rows.
///
/// This rank holds W_r = rows even_split(out, t, r) of W, and the same rows
/// of the bias, as an ordinary Linear (`local`, [out/t, in]).
/// - forward: y_r = x W_r^T + b_r ([..., out/t]); no communication. With
///   sequence_parallel, x is this rank's token shard [N/t, in]: all-gather
///   it into all N tokens first (y_r is then [N, out/t]).
/// - backward: dx = dy_r W_r is this rank's part of the input gradient (the
///   true dx is the sum over ranks): all-reduce it (sum). With
///   sequence_parallel, reduce-scatter it into this rank's token shard
///   instead. Accumulates dW_r and db_r (local.backward_weight).
class ColumnParallelLinear {
 public:
  ColumnParallelLinear() = default;
  /// A [out/t, in] shard of a [out, in] linear; throws when out % t != 0.
  ColumnParallelLinear(Comm& tp, std::int64_t in_features, std::int64_t out_features, bool has_bias,
                       bool sequence_parallel);
  /// y_r [..., out/t] (MemoryCategory::activations); saves the (gathered) input.
  Tensor forward(const Tensor& x, LinearSaved& saved) const;
  /// dx, all-reduced (or reduce-scattered into the token shard); accumulates
  /// the shard's weight and bias gradients; releases saved.
  Tensor backward(const Tensor& dy, LinearSaved& saved) const;

  Comm* tp = nullptr;              ///< the tensor-parallel group
  bool sequence_parallel = false;  ///< inputs and input gradients are token shards
  Linear local;                    ///< this rank's rows: W_r [out/t, in], b_r [out/t]
};

/// Puzzle 4.2. Row-parallel linear: W [out, in] split by input columns.
///
/// This rank holds W_r = columns even_split(in, t, r) of W as a Linear
/// without bias (`local`, [out, in/t]); the bias [out] is whole on every rank
/// (a **replicated** parameter).
/// - forward: x_r [..., in/t] is this rank's slice of the input features
///   (what a column-parallel linear before it produced); x_r W_r^T is a
///   partial sum of y: all-reduce it (sum), then add the bias once. With
///   sequence_parallel, reduce-scatter it into this rank's token shard
///   [N/t, out] instead, then add the bias to the shard.
/// - backward: dx_r = dy W_r, no communication; dW_r += dy^T x_r and
///   dbias += the column sums of dy. With sequence_parallel, dy arrives as
///   this rank's token shard: all-gather it first (the bias gradient then
///   comes from the shard alone: a partial sum the block sums over the group,
///   puzzle 4.7).
class RowParallelLinear {
 public:
  RowParallelLinear() = default;
  /// A [out, in/t] shard of a [out, in] linear; throws when in % t != 0.
  RowParallelLinear(Comm& tp, std::int64_t in_features, std::int64_t out_features,
                    bool sequence_parallel);
  /// y [..., out], whole on every rank (or the token shard [N/t, out]).
  Tensor forward(const Tensor& x, LinearSaved& saved) const;
  /// dx_r [..., in/t]; accumulates dW_r and the bias gradient; releases saved.
  Tensor backward(const Tensor& dy, LinearSaved& saved) const;

  Comm* tp = nullptr;              ///< the tensor-parallel group
  bool sequence_parallel = false;  ///< outputs and output gradients are token shards
  Linear local;                    ///< this rank's columns: W_r [out, in/t], no bias
  Tensor bias;                     ///< [out], the same on every rank
  Tensor bias_grad;                ///< its gradient
};

// --- 4.3 and 4.4: the MLP and attention ----------------------------------------------

/// What the tensor-parallel MLP keeps for its backward.
struct TensorParallelMlpSaved {
  LinearSaved fc;    ///< fc's input (gathered, under sequence parallelism)
  GeluSaved gelu;    ///< fc's output slice [N, 4C/t]
  LinearSaved proj;  ///< proj's input: the GELU output slice
};

/// Puzzle 4.3. The MLP, fc column-parallel and proj row-parallel: this rank
/// computes 4C/t of the hidden units, and the GELU between them needs no
/// communication because each hidden unit lives on one rank.
/// forward: fc, GELU, proj. backward: the reverse. Exactly one all-reduce
/// forward (proj's) and one backward (fc's); with sequence parallelism one
/// all-gather and one reduce-scatter each way instead.
class TensorParallelMlp {
 public:
  TensorParallelMlp() = default;
  /// fc [4C/t, C] and proj [C, 4C/t] shards (mlp_ratio from @p config).
  TensorParallelMlp(Comm& tp, const GPTConfig& config, bool sequence_parallel);
  /// y [B, T, C] for x [B, T, C] (or token shards [N/t, C] for both).
  Tensor forward(const Tensor& x, TensorParallelMlpSaved& saved) const;
  /// dx for dy (same shapes); accumulates the shards' gradients.
  Tensor backward(const Tensor& dy, TensorParallelMlpSaved& saved) const;

  ColumnParallelLinear fc;  ///< C -> 4C/t
  Gelu gelu;                ///< on this rank's hidden units
  RowParallelLinear proj;   ///< 4C/t -> C
};

/// Puzzle 4.4. Causal self-attention with the heads split: rank r owns heads
/// even_split(H, t, r), i.e. rows [h0 D, h1 D) of the q, k and v weights
/// (column-parallel) and the same columns of the output projection
/// (row-parallel). Attention itself needs no communication: each head only
/// looks at its own q, k, v.
///
/// q, k and v read the same input, so its gradient is the sum of theirs:
/// add the three local parts (Linear::backward_input_into with accumulate)
/// and all-reduce **once** (with sequence parallelism: all-gather the input
/// once in forward, reduce-scatter once in backward). Use q.local, k.local,
/// v.local directly for that; q.forward() would communicate three times.
/// Exactly one all-reduce forward (proj's) and one backward.
class TensorParallelAttention {
 public:
  TensorParallelAttention() = default;
  /// Throws dtp::Error naming both numbers when config.heads % t != 0.
  TensorParallelAttention(Comm& tp, const GPTConfig& config, bool sequence_parallel);
  /// y [B, T, C] for x [B, T, C]. With sequence parallelism x and y are token
  /// shards [B*T/t, C] and @p sequences is B (attention needs to know where
  /// each sequence starts); otherwise it is ignored.
  Tensor forward(const Tensor& x, AttentionSaved& saved, std::int64_t sequences = 0) const;
  /// dx for dy; accumulates the shards' gradients; releases saved.
  Tensor backward(const Tensor& dy, AttentionSaved& saved) const;

  ColumnParallelLinear q;  ///< rows of this rank's heads: [C/t, C]
  ColumnParallelLinear k;  ///< the same rows of k
  ColumnParallelLinear v;  ///< the same rows of v
  RowParallelLinear proj;  ///< the same columns of the output projection: [C, C/t]
  int local_heads = 1;     ///< H / t
  AttentionKind kind = AttentionKind::naive;  ///< naive or flash kernel
  Comm* tp = nullptr;                         ///< the tensor-parallel group
  bool sequence_parallel = false;             ///< inputs and outputs are token shards
};

// --- 4.5 and 4.6: vocabulary-parallel embedding and loss ---------------------------

/// What the vocabulary-parallel embedding keeps for its backward.
struct VocabParallelEmbeddingSaved {
  Tensor ids;  ///< i32 [B, T]
};

/// Puzzle 4.5 (the layer): the token table [V, C] split by rows, so rank r
/// holds the embeddings of token ids [v0, v1) = even_split(V, t, r).
///
/// forward: every rank looks up the ids in its own slice
/// (ops::embedding_shard_forward writes zeros for ids outside [v0, v1)) and
/// the partial results are all-reduced (sum): each token's row comes from
/// exactly one rank. The learned positions [context, C] are replicated: add
/// them on **rank 0 only, before the reduction**, so that they count once.
/// With sequence_parallel, reduce-scatter the partial sums into this rank's
/// token shard [N/t, C] instead of all-reducing.
/// backward: dx [B, T, C] (with sequence_parallel: the token shard; all-gather
/// it first) is the same on every rank; every rank scatters it into its own
/// rows (ops::embedding_shard_backward) and into the positions' gradient
/// (ops::positions_backward), so the replicated positions stay identical.
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding() = default;
  /// tokens [V/t, C] and positions [context, C]; throws when V % t != 0.
  VocabParallelEmbedding(Comm& tp, const GPTConfig& config, bool sequence_parallel);
  /// x [B, T, C] (or this rank's token shard) for ids i32 [B, T].
  Tensor forward(const Tensor& ids, VocabParallelEmbeddingSaved& saved) const;
  /// Accumulates the token-slice and position gradients; releases saved.
  void backward(const Tensor& dx, VocabParallelEmbeddingSaved& saved) const;

  Comm* tp = nullptr;              ///< the tensor-parallel group
  bool sequence_parallel = false;  ///< outputs are token shards
  std::int64_t vocab_start = 0;    ///< first token id of this rank's rows (v0)
  Tensor tokens;                   ///< rows [v0, v1) of the token table: [V/t, C]
  Tensor positions;                ///< [context, C], the same on every rank
  Tensor tokens_grad;              ///< gradient of tokens
  Tensor positions_grad;           ///< gradient of positions
};

/// What the vocabulary-parallel cross-entropy keeps for its backward.
struct VocabParallelCrossEntropySaved {
  Tensor logits;   ///< this rank's [B, T, V/t], turned into its gradient by backward
  Tensor targets;  ///< i32 [B, T]
  Tensor row_max;  ///< [B*T], the global max of each row's logits
  Tensor sum_exp;  ///< [B*T], the global sum of exp(logit - row_max)
};

/// Puzzle 4.6. Cross-entropy over logits split by vocabulary: rank r holds
/// logits[..., v0:v1) ([B, T, V/t]) and never the whole [B, T, V].
///
/// loss_n = log(sum_v exp(l_nv)) - l_n,target, computed stably:
/// 1. m_n = the max over the whole vocabulary: local ops::row_max, then
///    all-reduce with ReduceOp::max;
/// 2. s_n = sum_v exp(l_nv - m_n) and the target's logit (which lives on one
///    rank; ops::vocab_shard_softmax_sums gives 0 elsewhere): local sums,
///    then all-reduce (sum);
/// 3. loss_n = log(s_n) + m_n - target logit; the mean over the N = B*T rows.
/// backward: dlogits = (exp(l - m) / s - onehot(target)) * loss_scale / N on
/// this rank's slice (ops::vocab_shard_cross_entropy_backward), no
/// communication. Every rank returns the same loss.
class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy() = default;
  /// For a vocabulary split over @p tp; vocab_start = even_split(V, t, r).offset.
  VocabParallelCrossEntropy(Comm& tp, std::int64_t vocab_size);
  /// The mean loss over all B*T rows; saves the logits, targets and statistics.
  double forward(const Tensor& logits, const Tensor& targets,
                 VocabParallelCrossEntropySaved& saved) const;
  /// d(loss_scale * mean loss)/d(this rank's logits), in place over the saved
  /// logits; releases saved.
  Tensor backward(VocabParallelCrossEntropySaved& saved, double loss_scale = 1.0) const;

  Comm* tp = nullptr;            ///< the tensor-parallel group
  std::int64_t vocab_start = 0;  ///< v0
  std::int64_t vocab_size = 0;   ///< V, the whole vocabulary
};

// --- the units: provided constructors, puzzle 4.7 and 4.8 bodies ---------------------

/// Options of a tensor-parallel model.
struct TensorParallelOptions {
  bool sequence_parallel = false;  ///< Megatron sequence parallelism (4.7)
};

/// The embedding unit of a TP model: the vocabulary-parallel embedding over
/// this rank's flat buffers ("tokens" [V/t, C], "positions" [context, C]).
class TensorParallelEmbedding : public Unit {
 public:
  /// Copies this rank's rows of @p full's tables (provided).
  TensorParallelEmbedding(Comm& tp, const Embedding& full, const TensorParallelOptions& options);
  VocabParallelEmbedding layer;  ///< the layer, bound to this unit's views

 private:
  void bind() override;
  Comm* tp_;
  bool sequence_parallel_;
};

/// What a tensor-parallel block keeps between forward and backward.
struct TensorParallelBlockSaved {
  LayerNormSaved ln1;          ///< the block input (token shard under SP)
  AttentionSaved attn;         ///< attention's own
  LayerNormSaved ln2;          ///< x + attention
  TensorParallelMlpSaved mlp;  ///< the MLP's own
};

/// A transformer block with TP attention and MLP. Its LayerNorms and the two
/// row-parallel biases are replicated (the same on every rank).
///
/// Puzzle 4.7 (sequence parallelism) is this block's forward, backward and
/// reduce_replicated_gradients(). forward and backward are the serial
/// Block's (x + attn(ln1(x)), then + mlp(ln2(.))), and the same code serves
/// both modes: with sequence_parallel the LayerNorms and residual adds run
/// on this rank's token shard, and attention and the MLP (built with
/// sequence_parallel) gather and scatter the tokens around their linears.
/// Because each rank then sees only its own tokens, the gradients of the
/// replicated parameters (ln1, ln2, attn.proj.bias, mlp.proj.bias) are
/// partial sums: reduce_replicated_gradients() must sum them over the TP
/// group, or the ranks' copies silently drift apart.
class TensorParallelBlock : public Unit {
 public:
  /// Copies this rank's slices of @p full (provided).
  TensorParallelBlock(Comm& tp, const Block& full, const TensorParallelOptions& options);
  /// x + attn(ln1(x)), then + mlp(ln2(.)). x [B, T, C], or under sequence
  /// parallelism this rank's token shard [B*T/t, C] with @p sequences = B.
  Tensor forward(const Tensor& x, TensorParallelBlockSaved& saved,
                 std::int64_t sequences = 0) const;
  /// dx for dy (same shape as x); accumulates every gradient of this unit
  /// (under sequence parallelism the replicated ones from this rank's tokens only).
  Tensor backward(const Tensor& dy, TensorParallelBlockSaved& saved) const;
  /// Under sequence parallelism: all-reduces (sum) every replicated gradient
  /// over the TP group, so each holds the whole batch's gradient. Without
  /// it: nothing (they are whole already). Call it once per optimizer step,
  /// after the last backward (like the data-parallel all-reduce; running it
  /// after every backward of an accumulating step would count the earlier
  /// micro-batches t times).
  void reduce_replicated_gradients() const;
  /// The replicated parameters' gradients, in layout order: ln1.weight,
  /// ln1.bias, attn.proj.bias, ln2.weight, ln2.bias, mlp.proj.bias.
  std::vector<Tensor> replicated_gradients() const;

  LayerNorm ln1;                   ///< replicated
  TensorParallelAttention attn;    ///< heads split
  LayerNorm ln2;                   ///< replicated
  TensorParallelMlp mlp;           ///< hidden units split
  bool sequence_parallel = false;  ///< activations are token shards

 private:
  void bind() override;
  Comm* tp_;
};

/// What the TP head keeps for its backward.
struct TensorParallelHeadSaved {
  LayerNormSaved ln;                    ///< final LayerNorm
  LinearSaved lm;                       ///< the LM head's (gathered) input
  VocabParallelCrossEntropySaved loss;  ///< this rank's logits and the statistics
};

/// The head unit: final LayerNorm (replicated), the LM head split by
/// vocabulary rows (column-parallel, no bias: rank r computes logits for
/// token ids [v0, v1)) and the vocabulary-parallel loss.
class TensorParallelHead : public Unit {
 public:
  /// Copies this rank's rows of @p full's LM head (provided).
  TensorParallelHead(Comm& tp, const Head& full, const TensorParallelOptions& options);

  LayerNorm ln;                    ///< replicated
  ColumnParallelLinear lm;         ///< [V/t, C], no bias
  VocabParallelCrossEntropy loss;  ///< the loss over the vocabulary slices
  bool sequence_parallel = false;  ///< its input is a token shard

 private:
  void bind() override;
  Comm* tp_;
};

// --- 4.8: the whole model on a 2-D mesh --------------------------------------------------

/// A 2-D mesh of world = dp x tp ranks. TP groups are **consecutive** ranks
/// (world rank w is TP rank w % tp of TP group w / tp), because TP talks at
/// every layer and belongs on the fastest links (inside a node); the DP
/// groups are the ranks with the same TP rank (w % tp), which talk once a
/// step. World 4 with tp 2: TP groups {0,1} {2,3}, DP groups {0,2} {1,3}.
struct Mesh {
  Comm tp;  ///< this rank's tensor-parallel group
  Comm dp;  ///< this rank's data-parallel group
};

/// Puzzle 4.8 (part 1). Splits @p world into the mesh above with
/// Comm::split (every rank calls it). Throws dtp::Error when world.size()
/// is not a multiple of @p tp, naming both.
Mesh make_mesh(Comm& world, int tp);

/// The whole GPT with every unit tensor-parallel over @p tp, built from the
/// serial GPT @p full (so both start from the same weights).
///
/// Puzzle 4.8 (part 2) is forward(), backward() and finish_backward(): the
/// units composed in order (embedding, blocks, head) as GPT::forward and
/// GPT::backward do, then the gradients' reductions: the replicated ones
/// over the TP group under sequence parallelism, everything over the DP group.
class TensorParallelGPT {
 public:
  /// Builds the units from @p full (provided). @p tp must outlive the model.
  TensorParallelGPT(Comm& tp, const GPT& full, const TensorParallelOptions& options);
  /// The mean loss of targets given tokens (i32 [B, T], the same on every
  /// rank of the TP group; under sequence parallelism B*T must divide by t).
  /// Saves the activations.
  double forward(const Tensor& tokens, const Tensor& targets);
  /// Accumulates d(loss_scale * loss)/d(this rank's parameters) into every
  /// unit's gradients; releases the activations.
  void backward(double loss_scale = 1.0);
  /// After the step's backward on every rank: under sequence parallelism,
  /// sums the replicated gradients over the TP group (every block's
  /// reduce_replicated_gradients() and the head's LayerNorm, which also saw
  /// only this rank's tokens); then every gradient becomes its mean over the
  /// data-parallel group @p dp (each DP rank saw its own slice of the batch;
  /// a group of one rank needs nothing).
  void finish_backward(Comm& dp);

  /// Zeroes every unit's gradients.
  void zero_grad();
  /// Embedding, blocks, head.
  std::vector<Unit*> units();
  /// The global gradient norm over the whole (unsharded) model: sharded
  /// gradients summed over the TP group, replicated ones counted once
  /// (provided; Trainer-style clipping uses it).
  double global_grad_norm() const;
  /// The serial model's config.
  const GPTConfig& config() const { return config_; }

  std::unique_ptr<TensorParallelEmbedding> embedding;        ///< unit 0
  std::vector<std::unique_ptr<TensorParallelBlock>> blocks;  ///< units 1..L
  std::unique_ptr<TensorParallelHead> head;                  ///< unit L + 1

 private:
  Comm* tp_;
  GPTConfig config_;
  bool sequence_parallel_;
  VocabParallelEmbeddingSaved embedding_saved_;
  std::vector<TensorParallelBlockSaved> block_saved_;
  TensorParallelHeadSaved head_saved_;
  std::int64_t sequences_ = 0;  // B of the saved forward
  bool has_saved_ = false;
};

}  // namespace dtp::ch04
