// Puzzles 4.1 and 4.2: the column- and row-parallel linears, and the two
// pairs of conjugate operators they carry. Column-parallel: identity forward,
// all-reduce backward (with sequence parallelism: all-gather forward,
// reduce-scatter backward). Row-parallel: all-reduce forward, identity
// backward (reduce-scatter forward, all-gather backward).
#include "04_tensor_parallel/tensor_parallel.h"

namespace dtp::ch04 {

namespace {
// A [rows, features] buffer for every rank's tokens (or one rank's share).
Tensor token_rows(std::int64_t rows, std::int64_t features, const Tensor& like,
                  MemoryCategory category) {
  return Tensor::empty(Shape{rows, features}, like.dtype(), like.device(), category);
}

std::int64_t last_dim(const Tensor& x) { return x.size(x.ndim() - 1); }
}  // namespace

// --- 4.1 -------------------------------------------------------------------------------

Tensor ColumnParallelLinear::forward(const Tensor& x, LinearSaved& saved) const {
  if (!sequence_parallel) return local.forward(x, saved);
  const std::int64_t rows = x.numel() / local.in_features;
  Tensor all_tokens =
      token_rows(rows * tp->size(), local.in_features, x, MemoryCategory::activations);
  tp->all_gather(x, all_tokens);
  return local.forward(all_tokens, saved);
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, LinearSaved& saved) const {
  Tensor dx = local.backward_input(dy);  // this rank's part of the input gradient
  local.backward_weight(dy, saved);
  saved = LinearSaved{};
  if (!sequence_parallel) {
    tp->all_reduce(dx);
    return dx;
  }
  Tensor my_tokens = token_rows(dx.numel() / local.in_features / tp->size(), local.in_features, dx,
                                MemoryCategory::other);
  tp->reduce_scatter(dx, my_tokens);
  return my_tokens;
}

// --- 4.2 -------------------------------------------------------------------------------

Tensor RowParallelLinear::forward(const Tensor& x, LinearSaved& saved) const {
  Tensor partial = local.forward(x, saved);  // x_r W_r^T: a partial sum of y
  Tensor y = partial;
  if (!sequence_parallel) {
    tp->all_reduce(y);
  } else {
    y = token_rows(partial.numel() / last_dim(partial) / tp->size(), last_dim(partial), partial,
                   MemoryCategory::activations);
    tp->reduce_scatter(partial, y);
  }
  ops::add_bias(y, bias);  // after the reduction: once, not t times
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy, LinearSaved& saved) const {
  Tensor db = bias_grad;
  ops::bias_backward(dy, db);  // under sequence parallelism: this rank's tokens only
  Tensor all_dy = dy;
  if (sequence_parallel) {
    all_dy =
        token_rows(dy.numel() / last_dim(dy) * tp->size(), last_dim(dy), dy, MemoryCategory::other);
    tp->all_gather(dy, all_dy);
  }
  return local.backward(all_dy, saved);
}

}  // namespace dtp::ch04
