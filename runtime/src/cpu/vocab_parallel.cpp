// One rank's share of a vocabulary split over tensor-parallel ranks (chapter
// 04): a lookup that only knows rows [vocab_start, vocab_start + Vs) of the
// token table, and the per-row softmax statistics of a logits slice. The
// ranks' shares are combined by collectives in the chapter's layers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"

namespace dtp::ops {

namespace {
struct Rows {
  std::int64_t N, C;
};

// ids i32 on the CPU, a 2-D table, and N rows of C in @p rows_tensor.
Rows check_shard_lookup(const char* op, const Tensor& ids, const Tensor& table,
                        const char* table_name, const Tensor& rows_tensor, const char* rows_name) {
  detail::check_cpu(op, "ids", ids);
  DTP_CHECK(ids.dtype() == DType::i32, op, ": ids must be i32 token ids, got ", ids.describe());
  detail::check_float(op, table_name, table);
  detail::check_float(op, rows_name, rows_tensor);
  detail::check_dtype_is(op, rows_name, rows_tensor, table.dtype());
  DTP_CHECK(table.ndim() == 2, op, ": ", table_name, " must be [V/t, C], got ", table.describe());
  const std::int64_t C = table.size(1), N = ids.numel();
  DTP_CHECK(rows_tensor.numel() == N * C && detail::last_dim(op, rows_name, rows_tensor) == C, op,
            ": ", rows_name, " must be [..., ", C, "] with ", N, " rows (one per id), got ",
            rows_tensor.describe());
  return {N, C};
}

detail::LogitRows check_logits_slice(const char* op, const Tensor& logits, const Tensor& targets) {
  detail::check_float(op, "logits", logits);
  detail::check_cpu(op, "targets", targets);
  return detail::logit_rows(op, logits, targets, "vocabulary slice");
}

void check_row_stat(const char* op, const char* name, const Tensor& stat, const Tensor& logits,
                    std::int64_t N) {
  detail::check_float(op, name, stat);
  detail::check_dtype_is(op, name, stat, logits.dtype());
  detail::check_numel(op, name, stat, N, "one per row of logits");
}
}  // namespace

void embedding_shard_forward(const Tensor& ids, const Tensor& table_shard, std::int64_t vocab_start,
                             Tensor& out) {
  if (table_shard.device().is_cuda())
    return cuda::embedding_shard_forward(ids, table_shard, vocab_start, out);
  if (detail::is_half(table_shard.dtype())) {
    detail::Widened f32("embedding_shard_forward", table_shard.dtype());
    embedding_shard_forward(ids, f32.in("table_shard", table_shard), vocab_start,
                            f32.out("out", out));
    return f32.store();
  }
  const char* op = "embedding_shard_forward";
  const Rows r = check_shard_lookup(op, ids, table_shard, "table_shard", out, "out");
  const std::int64_t rows = table_shard.size(0);
  detail::with_float(table_shard.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const std::int32_t* pid = ids.data<std::int32_t>();
    const T* pt = table_shard.data<T>();
    T* po = out.data<T>();
    for (std::int64_t n = 0; n < r.N; ++n) {
      const std::int64_t local = std::int64_t{pid[n]} - vocab_start;
      if (local >= 0 && local < rows) {
        std::memcpy(po + n * r.C, pt + local * r.C, static_cast<std::size_t>(r.C) * sizeof(T));
      } else {
        std::fill(po + n * r.C, po + (n + 1) * r.C, T(0));
      }
    }
  });
}

void embedding_shard_backward(const Tensor& ids, const Tensor& dout, std::int64_t vocab_start,
                              Tensor& dtable_shard) {
  if (dout.device().is_cuda())
    return cuda::embedding_shard_backward(ids, dout, vocab_start, dtable_shard);
  if (detail::is_half(dout.dtype())) {
    detail::Widened f32("embedding_shard_backward", dout.dtype());
    embedding_shard_backward(ids, f32.in("dout", dout), vocab_start,
                             f32.out("dtable_shard", dtable_shard));
    return f32.store();
  }
  const char* op = "embedding_shard_backward";
  const Rows r = check_shard_lookup(op, ids, dtable_shard, "dtable_shard", dout, "dout");
  const std::int64_t rows = dtable_shard.size(0);
  detail::with_float(dtable_shard.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const std::int32_t* pid = ids.data<std::int32_t>();
    const T* pg = dout.data<T>();
    T* pt = dtable_shard.data<T>();
    for (std::int64_t n = 0; n < r.N; ++n) {
      const std::int64_t local = std::int64_t{pid[n]} - vocab_start;
      if (local < 0 || local >= rows) continue;  // another rank's row
      T* __restrict row = pt + local * r.C;
      const T* __restrict g = pg + n * r.C;
      for (std::int64_t c = 0; c < r.C; ++c) row[c] += g[c];
    }
  });
}

void row_max(const Tensor& x, Tensor& out) {
  if (x.device().is_cuda()) return cuda::row_max(x, out);
  if (detail::is_half(x.dtype())) {
    detail::Widened f32("row_max", x.dtype());
    row_max(f32.in("x", x), f32.out("out", out));
    return f32.store();
  }
  const char* op = "row_max";
  detail::check_float(op, "x", x);
  const std::int64_t V = detail::last_dim(op, "x", x);
  DTP_CHECK(V >= 1, op, ": rows need at least one element, got ", x.describe());
  const std::int64_t N = x.numel() / V;
  check_row_stat(op, "out", out, x, N);
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (std::int64_t n = 0; n < N; ++n) po[n] = *std::max_element(px + n * V, px + (n + 1) * V);
  });
}

void vocab_shard_softmax_sums(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start,
                              const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  if (logits.device().is_cuda())
    return cuda::vocab_shard_softmax_sums(logits, targets, vocab_start, row_max, sum_exp,
                                          target_logit);
  if (detail::is_half(logits.dtype())) {
    detail::Widened f32("vocab_shard_softmax_sums", logits.dtype());
    vocab_shard_softmax_sums(f32.in("logits", logits), targets, vocab_start,
                             f32.in("row_max", row_max), f32.out("sum_exp", sum_exp),
                             f32.out("target_logit", target_logit));
    return f32.store();
  }
  const char* op = "vocab_shard_softmax_sums";
  const detail::LogitRows r = check_logits_slice(op, logits, targets);
  check_row_stat(op, "row_max", row_max, logits, r.N);
  check_row_stat(op, "sum_exp", sum_exp, logits, r.N);
  check_row_stat(op, "target_logit", target_logit, logits, r.N);
  detail::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pl = logits.data<T>();
    const T* pm = row_max.data<T>();
    const std::int32_t* pt = targets.data<std::int32_t>();
    T* ps = sum_exp.data<T>();
    T* pz = target_logit.data<T>();
    for (std::int64_t n = 0; n < r.N; ++n) {
      const T* row = pl + n * r.V;
      T sum = 0;
      for (std::int64_t v = 0; v < r.V; ++v) sum += std::exp(row[v] - pm[n]);
      ps[n] = sum;
      const std::int64_t local = std::int64_t{pt[n]} - vocab_start;
      pz[n] = local >= 0 && local < r.V ? row[local] : T(0);
    }
  });
}

void vocab_shard_cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        std::int64_t vocab_start, const Tensor& row_max,
                                        const Tensor& sum_exp, double loss_scale, Tensor& dlogits) {
  if (logits.device().is_cuda())
    return cuda::vocab_shard_cross_entropy_backward(logits, targets, vocab_start, row_max, sum_exp,
                                                    loss_scale, dlogits);
  if (detail::is_half(logits.dtype())) {
    detail::Widened f32("vocab_shard_cross_entropy_backward", logits.dtype());
    vocab_shard_cross_entropy_backward(f32.in("logits", logits), targets, vocab_start,
                                       f32.in("row_max", row_max), f32.in("sum_exp", sum_exp),
                                       loss_scale, f32.out("dlogits", dlogits));
    return f32.store();
  }
  const char* op = "vocab_shard_cross_entropy_backward";
  const detail::LogitRows r = check_logits_slice(op, logits, targets);
  check_row_stat(op, "row_max", row_max, logits, r.N);
  check_row_stat(op, "sum_exp", sum_exp, logits, r.N);
  detail::check_float(op, "dlogits", dlogits);
  detail::check_dtype_is(op, "dlogits", dlogits, logits.dtype());
  detail::check_shape(op, "dlogits", dlogits, logits.shape());
  detail::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pl = logits.data<T>();
    const T* pm = row_max.data<T>();
    const T* ps = sum_exp.data<T>();
    const std::int32_t* pt = targets.data<std::int32_t>();
    T* pd = dlogits.data<T>();
    const T s = static_cast<T>(loss_scale);
    for (std::int64_t n = 0; n < r.N; ++n) {
      const T* row = pl + n * r.V;
      T* grad = pd + n * r.V;  // may be the same memory as row
      const T inverse_sum = T(1) / ps[n];
      for (std::int64_t v = 0; v < r.V; ++v) grad[v] = std::exp(row[v] - pm[n]) * inverse_sum * s;
      const std::int64_t local = std::int64_t{pt[n]} - vocab_start;
      if (local >= 0 && local < r.V) grad[local] -= s;
    }
  });
}

}  // namespace dtp::ops
