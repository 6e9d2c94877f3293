// Puzzles 4.5 and 4.6: the vocabulary split over ranks. The embedding looks
// up only its own rows (zeros elsewhere) and sums over the group; the loss
// agrees on each row's max and sum of exponentials with two small
// all-reduces and never holds more than its [B, T, V/t] slice.
#include <cmath>
#include <vector>

#include "04_tensor_parallel/tensor_parallel.h"

namespace dtp::ch04 {

// --- 4.5 -------------------------------------------------------------------------------

Tensor VocabParallelEmbedding::forward(const Tensor& ids,
                                       VocabParallelEmbeddingSaved& saved) const {
  DTP_CHECK(ids.defined() && ids.dtype() == DType::i32 && ids.ndim() == 2,
            "vocabulary-parallel embedding: ids must be i32 [B, T], got ", ids.describe());
  const std::int64_t B = ids.size(0), T = ids.size(1), C = tokens.size(1);
  Tensor partial = new_activation(Shape{B, T, C}, tokens);
  ops::embedding_shard_forward(ids, tokens, vocab_start, partial);
  // Replicated, so added by one rank before the sum: it counts once.
  if (tp->rank() == 0) ops::add_positions(partial, positions);
  saved.ids = ids;
  if (!sequence_parallel) {
    tp->all_reduce(partial);
    return partial;
  }
  Tensor my_tokens = new_activation(Shape{B * T / tp->size(), C}, tokens);
  tp->reduce_scatter(partial, my_tokens);
  return my_tokens;
}

void VocabParallelEmbedding::backward(const Tensor& dx, VocabParallelEmbeddingSaved& saved) const {
  DTP_CHECK(saved.ids.defined(),
            "vocabulary-parallel embedding backward: no saved ids (forward not run, or already "
            "released)");
  const std::int64_t B = saved.ids.size(0), T = saved.ids.size(1), C = tokens.size(1);
  Tensor all_dx = dx;
  if (sequence_parallel) {
    all_dx = Tensor::empty(Shape{B, T, C}, dx.dtype(), dx.device(), MemoryCategory::other);
    tp->all_gather(dx, all_dx);
  }
  Tensor token_grad = tokens_grad, position_grad = positions_grad;
  ops::embedding_shard_backward(saved.ids, all_dx, vocab_start, token_grad);
  ops::positions_backward(all_dx.view(Shape{B, T, C}), position_grad);
  saved = VocabParallelEmbeddingSaved{};
}

// --- 4.6 -------------------------------------------------------------------------------

double VocabParallelCrossEntropy::forward(const Tensor& logits, const Tensor& targets,
                                          VocabParallelCrossEntropySaved& saved) const {
  const std::int64_t slice = logits.size(logits.ndim() - 1), N = logits.numel() / slice;
  DTP_CHECK(slice * tp->size() == vocab_size, "vocabulary-parallel cross-entropy: logits hold ",
            slice, " token ids per row, expected this rank's ", vocab_size / tp->size(), " of ",
            vocab_size);
  Tensor row_max = new_activation(Shape{N}, logits);
  ops::row_max(logits, row_max);
  tp->all_reduce(row_max, ReduceOp::max);
  // One all-reduce for both sums: [sum of exp | target logit].
  Tensor sums = new_activation(Shape{2 * N}, logits);
  Tensor sum_exp = sums.slice(0, N), target_logit = sums.slice(N, N);
  ops::vocab_shard_softmax_sums(logits, targets, vocab_start, row_max, sum_exp, target_logit);
  tp->all_reduce(sums);
  const std::vector<double> m = row_max.to_vector(), s = sums.to_vector();
  double total = 0;
  for (std::int64_t n = 0; n < N; ++n) total += std::log(s[n]) + m[n] - s[N + n];
  saved.logits = logits;
  saved.targets = targets;
  saved.row_max = row_max;
  saved.sum_exp = sum_exp;
  return N > 0 ? total / static_cast<double>(N) : 0.0;
}

Tensor VocabParallelCrossEntropy::backward(VocabParallelCrossEntropySaved& saved,
                                           double loss_scale) const {
  DTP_CHECK(saved.logits.defined(),
            "vocabulary-parallel cross-entropy backward: no saved logits (forward not run, or "
            "already released)");
  Tensor dlogits = saved.logits;  // in place
  const std::int64_t rows = saved.targets.numel();
  ops::vocab_shard_cross_entropy_backward(
      saved.logits, saved.targets, vocab_start, saved.row_max, saved.sum_exp,
      rows > 0 ? loss_scale / static_cast<double>(rows) : 0.0, dlogits);
  saved = VocabParallelCrossEntropySaved{};
  return dlogits;
}

}  // namespace dtp::ch04
