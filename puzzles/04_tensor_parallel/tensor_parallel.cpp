// Chapter 04 — tensor parallelism.
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 04                  (or ./dtp grade 04 --puzzle 4.1)
// The contract is in chapters/04_tensor_parallel/tensor_parallel.h; the
// lesson (the pictures, the conjugate operators, the costs) is in
// chapters/04_tensor_parallel/README.md. Solve them in order: each builds on
// the ones before.
//
// Provided: even_split(what, size, t, r) (this rank's equal part of a
// dimension, or a clear error), the layers' constructors (except 4.4's) and
// the units' constructors, which copy this rank's slices out of the serial
// model (drivers/04_tensor_parallel/).
// Tools:
//   tp->rank(), tp->size()
//   tp->all_reduce(x)                    sum over the group, in place
//   tp->all_reduce(x, ReduceOp::max)     max over the group
//   tp->all_gather(shard, full)          full = every rank's shard, in rank order
//   tp->reduce_scatter(full, shard)      shard = my chunk of the sum
//   world.split(color, key)              a sub-communicator (4.8)
//   local.forward(x, saved)  local.backward(dy, saved)            a whole Linear
//   local.backward_input(dy)  local.backward_input_into(dy, dx, accumulate)
//   local.backward_weight(dy, saved)                              the two halves
//   ops::add_bias(y, bias)  ops::bias_backward(dy, dbias)  ops::axpy(y, 1.0, x)
//   ops::embedding_shard_forward / embedding_shard_backward / add_positions / positions_backward
//   ops::row_max / vocab_shard_softmax_sums / vocab_shard_cross_entropy_backward
//   ops::attention_forward / attention_backward (and the flash_ pair), as nn.h's attention
//   uses them
//   Tensor::empty(Shape{rows, cols}, like.dtype(), like.device(), MemoryCategory::activations)
// Under sequence parallelism a token shard is a 2-D [B*T/t, C] tensor.
#include "04_tensor_parallel/tensor_parallel.h"

namespace dtp::ch04 {

// --- 4.1 column-parallel linear ------------------------------------------------------

Tensor ColumnParallelLinear::forward(const Tensor& x, LinearSaved& saved) const {
  // About 6 lines. local.forward(x, saved); with sequence_parallel, first
  // all-gather x (this rank's [rows, in] tokens) into [rows * t, in].
  (void)x, (void)saved;
  throw dtp::NotSolved("4.1 column_parallel_linear");
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, LinearSaved& saved) const {
  // About 10 lines. dx = local.backward_input(dy) is this rank's part: sum it
  // over the group (with sequence_parallel: reduce-scatter it into this
  // rank's [rows / t, in] tokens). Also local.backward_weight(dy, saved),
  // then release saved (saved = LinearSaved{}).
  (void)dy, (void)saved;
  throw dtp::NotSolved("4.1 column_parallel_linear");
}

// --- 4.2 row-parallel linear ---------------------------------------------------------

Tensor RowParallelLinear::forward(const Tensor& x, LinearSaved& saved) const {
  // About 10 lines. local.forward(x, saved) is a partial sum of y: all-reduce
  // it (with sequence_parallel: reduce-scatter into [rows / t, out]), then
  // add the bias, once.
  (void)x, (void)saved;
  throw dtp::NotSolved("4.2 row_parallel_linear");
}

Tensor RowParallelLinear::backward(const Tensor& dy, LinearSaved& saved) const {
  // About 8 lines. The bias gradient from dy (ops::bias_backward into a copy
  // of the bias_grad handle: Tensor db = bias_grad;), then local.backward of
  // dy (with sequence_parallel: of dy all-gathered into [rows * t, out]).
  (void)dy, (void)saved;
  throw dtp::NotSolved("4.2 row_parallel_linear");
}

// --- 4.3 the MLP ---------------------------------------------------------------------

Tensor TensorParallelMlp::forward(const Tensor& x, TensorParallelMlpSaved& saved) const {
  // About 3 lines: fc, GELU, proj.
  (void)x, (void)saved;
  throw dtp::NotSolved("4.3 tensor_parallel_mlp");
}

Tensor TensorParallelMlp::backward(const Tensor& dy, TensorParallelMlpSaved& saved) const {
  // About 3 lines: the same in reverse.
  (void)dy, (void)saved;
  throw dtp::NotSolved("4.3 tensor_parallel_mlp");
}

// --- 4.4 attention, heads split ------------------------------------------------------

TensorParallelAttention::TensorParallelAttention(Comm& tp, const GPTConfig& config,
                                                 bool sequence_parallel) {
  // About 10 lines. Check that the heads split (even_split("attention heads",
  // config.heads, t, r) throws the message the checker wants); then q, k, v =
  // ColumnParallelLinear(tp, C, C, true, sp), proj = RowParallelLinear(tp, C,
  // C, sp), local_heads = H / t, kind = config.attention, and the two fields.
  (void)tp, (void)config, (void)sequence_parallel;
  throw dtp::NotSolved("4.4 tensor_parallel_attention");
}

Tensor TensorParallelAttention::forward(const Tensor& x, AttentionSaved& saved,
                                        std::int64_t sequences) const {
  // About 25 lines: nn.h's CausalSelfAttention::forward
  // (runtime/src/nn/self_attention.cpp) with local_heads heads of C / H
  // each, q.local / k.local / v.local instead of q / k / v, and the output
  // through proj.forward. With sequence_parallel, all-gather x once first and
  // view it as [sequences, T, C].
  (void)x, (void)saved, (void)sequences;
  throw dtp::NotSolved("4.4 tensor_parallel_attention");
}

Tensor TensorParallelAttention::backward(const Tensor& dy, AttentionSaved& saved) const {
  // About 30 lines: the serial backward, but dx = the sum of q.local's,
  // k.local's and v.local's input gradients, then ONE all-reduce (with
  // sequence_parallel: one reduce-scatter into [B*T/t, C]).
  (void)dy, (void)saved;
  throw dtp::NotSolved("4.4 tensor_parallel_attention");
}

// --- 4.5 vocabulary-parallel embedding -----------------------------------------------

Tensor VocabParallelEmbedding::forward(const Tensor& ids,
                                       VocabParallelEmbeddingSaved& saved) const {
  // About 12 lines. A [B, T, C] partial: ops::embedding_shard_forward, plus
  // the positions on rank 0 only; save the ids; all-reduce (with
  // sequence_parallel: reduce-scatter into [B*T/t, C]).
  (void)ids, (void)saved;
  throw dtp::NotSolved("4.5 vocab_parallel_embedding");
}

void VocabParallelEmbedding::backward(const Tensor& dx, VocabParallelEmbeddingSaved& saved) const {
  // About 10 lines. With sequence_parallel, all-gather dx into [B, T, C]
  // first. Then ops::embedding_shard_backward into tokens_grad and
  // ops::positions_backward into positions_grad (copies of the handles);
  // release saved.
  (void)dx, (void)saved;
  throw dtp::NotSolved("4.5 vocab_parallel_embedding");
}

// --- 4.6 vocabulary-parallel cross-entropy -------------------------------------------

double VocabParallelCrossEntropy::forward(const Tensor& logits, const Tensor& targets,
                                          VocabParallelCrossEntropySaved& saved) const {
  // About 18 lines. N rows: the global row max (ops::row_max, all-reduce
  // max); the sums of exponentials and the target logits
  // (ops::vocab_shard_softmax_sums, all-reduce sum); the mean of
  // log(sum) + max - target on the host (to_vector()). Save for backward.
  (void)logits, (void)targets, (void)saved;
  throw dtp::NotSolved("4.6 vocab_parallel_cross_entropy");
}

Tensor VocabParallelCrossEntropy::backward(VocabParallelCrossEntropySaved& saved,
                                           double loss_scale) const {
  // About 6 lines: ops::vocab_shard_cross_entropy_backward in place over the
  // saved logits, scaled by loss_scale / N; release saved.
  (void)saved, (void)loss_scale;
  throw dtp::NotSolved("4.6 vocab_parallel_cross_entropy");
}

// --- 4.7 the block, with sequence parallelism ---------------------------------------

Tensor TensorParallelBlock::forward(const Tensor& x, TensorParallelBlockSaved& saved,
                                    std::int64_t sequences) const {
  // About 8 lines: the serial Block::forward (runtime/src/nn/units.cpp) with
  // this block's layers; pass sequences to attn.forward.
  (void)x, (void)saved, (void)sequences;
  throw dtp::NotSolved("4.7 sequence_parallel_block");
}

Tensor TensorParallelBlock::backward(const Tensor& dy, TensorParallelBlockSaved& saved) const {
  // About 8 lines: the serial Block::backward with this block's layers.
  (void)dy, (void)saved;
  throw dtp::NotSolved("4.7 sequence_parallel_block");
}

void TensorParallelBlock::reduce_replicated_gradients() const {
  // About 3 lines: under sequence parallelism, all-reduce every tensor of
  // replicated_gradients() over the group (tp_).
  throw dtp::NotSolved("4.7 sequence_parallel_block");
}

// --- 4.8 the model on a 2-D mesh ----------------------------------------------------

Mesh make_mesh(Comm& world, int tp) {
  // About 8 lines: check world.size() % tp, then two splits: the TP group of
  // consecutive ranks (color rank / tp), the DP group of equal TP rank
  // (color rank % tp). Keys keep the old order.
  (void)world, (void)tp;
  throw dtp::NotSolved("4.8 tensor_parallel_gpt");
}

double TensorParallelGPT::forward(const Tensor& tokens, const Tensor& targets) {
  // About 12 lines: embedding->layer, every block (with B = tokens.size(0)
  // as sequences), head->ln, head->lm, head->loss, saving into the members
  // embedding_saved_, block_saved_[i], head_saved_; set has_saved_.
  (void)tokens, (void)targets;
  throw dtp::NotSolved("4.8 tensor_parallel_gpt");
}

void TensorParallelGPT::backward(double loss_scale) {
  // About 10 lines: the same units in reverse.
  (void)loss_scale;
  throw dtp::NotSolved("4.8 tensor_parallel_gpt");
}

void TensorParallelGPT::finish_backward(Comm& dp) {
  // About 8 lines: with sequence_parallel_, every block's
  // reduce_replicated_gradients() and the head's LayerNorm gradients summed
  // over tp_; then every unit's grads() averaged over dp (ReduceOp::avg).
  (void)dp;
  throw dtp::NotSolved("4.8 tensor_parallel_gpt");
}

}  // namespace dtp::ch04
