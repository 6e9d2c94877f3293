// Embedding lookup (token ids -> rows of a table) and learned positions.
#include <cstring>

#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"

namespace dtp::ops {

namespace {
void check_ids(const char* op, const Tensor& ids) {
  detail::check_cpu(op, "ids", ids);
  DTP_CHECK(ids.dtype() == DType::i32, op, ": ids must be i32 token ids, got ", ids.describe());
}

std::int32_t checked_id(const char* op, const std::int32_t* ids, std::int64_t n, std::int64_t V) {
  const std::int32_t id = ids[n];
  DTP_CHECK(id >= 0 && id < V, op, ": token id ", id, " at position ", n,
            " is outside the table's vocabulary [0, ", V, ")");
  return id;
}
}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) {
  if (table.device().is_cuda()) return cuda::embedding_forward(ids, table, out);
  if (detail::is_half(table.dtype())) {
    detail::Widened f32("embedding_forward", table.dtype());
    embedding_forward(ids, f32.in("table", table), f32.out("out", out));
    return f32.store();
  }
  const char* op = "embedding_forward";
  check_ids(op, ids);
  detail::check_float(op, "table", table);
  detail::check_float(op, "out", out);
  detail::check_dtype_is(op, "out", out, table.dtype());
  DTP_CHECK(table.ndim() == 2, op, ": table must be [V, C], got ", table.describe());
  const std::int64_t V = table.size(0), C = table.size(1), N = ids.numel();
  DTP_CHECK(out.numel() == N * C && detail::last_dim(op, "out", out) == C, op,
            ": out must be [..., ", C, "] with ", N, " rows (one per id), got ", out.describe());
  detail::with_float(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const std::int32_t* pid = ids.data<std::int32_t>();
    const T* pt = table.data<T>();
    T* po = out.data<T>();
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int32_t id = checked_id(op, pid, n, V);
      std::memcpy(po + n * C, pt + id * C, static_cast<std::size_t>(C) * sizeof(T));
    }
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  if (dout.device().is_cuda()) return cuda::embedding_backward(ids, dout, dtable);
  if (detail::is_half(dout.dtype())) {
    detail::Widened f32("embedding_backward", dout.dtype());
    embedding_backward(ids, f32.in("dout", dout), f32.out("dtable", dtable));
    return f32.store();
  }
  const char* op = "embedding_backward";
  check_ids(op, ids);
  detail::check_float(op, "dtable", dtable);
  detail::check_float(op, "dout", dout);
  detail::check_dtype_is(op, "dout", dout, dtable.dtype());
  DTP_CHECK(dtable.ndim() == 2, op, ": dtable must be [V, C], got ", dtable.describe());
  const std::int64_t V = dtable.size(0), C = dtable.size(1), N = ids.numel();
  DTP_CHECK(dout.numel() == N * C && detail::last_dim(op, "dout", dout) == C, op,
            ": dout must be [..., ", C, "] with ", N, " rows (one per id), got ", dout.describe());
  detail::with_float(dtable.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const std::int32_t* pid = ids.data<std::int32_t>();
    const T* pg = dout.data<T>();
    T* pt = dtable.data<T>();
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int32_t id = checked_id(op, pid, n, V);
      T* __restrict row = pt + id * C;
      const T* __restrict g = pg + n * C;
      for (std::int64_t c = 0; c < C; ++c) row[c] += g[c];
    }
  });
}

namespace {
void check_positions(const char* op, const Tensor& x, const char* table_name, const Tensor& table,
                     std::int64_t start) {
  detail::check_float(op, "x", x);
  detail::check_float(op, table_name, table);
  detail::check_dtype_is(op, table_name, table, x.dtype());
  DTP_CHECK(x.ndim() == 3, op, ": x must be [B, T, C], got ", x.describe());
  DTP_CHECK(table.ndim() == 2 && table.size(1) == x.size(2), op, ": ", table_name, " must be [P, ",
            x.size(2), "], got ", table.describe());
  DTP_CHECK(start >= 0 && start + x.size(1) <= table.size(0), op, ": positions [", start, ", ",
            start + x.size(1), ") do not fit a table of ", table.size(0),
            " positions (the model's context length)");
}
}  // namespace

void add_positions(Tensor& x, const Tensor& positions, std::int64_t start) {
  if (x.device().is_cuda()) return cuda::add_positions(x, positions, start);
  if (detail::is_half(x.dtype())) {
    detail::Widened f32("add_positions", x.dtype());
    add_positions(f32.out("x", x), f32.in("positions", positions), start);
    return f32.store();
  }
  check_positions("add_positions", x, "positions", positions, start);
  const std::int64_t B = x.size(0), T_ = x.size(1), C = x.size(2);
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* px = x.data<T>();
    const T* pp = positions.data<T>() + start * C;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T_; ++t) {
        T* __restrict row = px + (b * T_ + t) * C;
        const T* __restrict pos = pp + t * C;
        for (std::int64_t c = 0; c < C; ++c) row[c] += pos[c];
      }
  });
}

void positions_backward(const Tensor& dx, Tensor& dpositions, std::int64_t start) {
  if (dx.device().is_cuda()) return cuda::positions_backward(dx, dpositions, start);
  if (detail::is_half(dx.dtype())) {
    detail::Widened f32("positions_backward", dx.dtype());
    positions_backward(f32.in("dx", dx), f32.out("dpositions", dpositions), start);
    return f32.store();
  }
  check_positions("positions_backward", dx, "dpositions", dpositions, start);
  const std::int64_t B = dx.size(0), T_ = dx.size(1), C = dx.size(2);
  detail::with_float(dx.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pg = dx.data<T>();
    T* pp = dpositions.data<T>() + start * C;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T_; ++t) {
        const T* __restrict g = pg + (b * T_ + t) * C;
        T* __restrict pos = pp + t * C;
        for (std::int64_t c = 0; c < C; ++c) pos[c] += g[c];
      }
  });
}

}  // namespace dtp::ops
