// Softmax cross-entropy, fused: the forward never stores probabilities and
// the backward turns logits into their gradient in place (llm.c style).
// Rows are spread over the rank's threads; the targets are checked first, in
// order, so a bad one is always reported at its first row, and the mean loss
// adds the rows in order, so the bits do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"
#include "dtp/parallel.h"

namespace dtp::ops {

namespace {
detail::LogitRows check_logits(const char* op, const Tensor& logits, const Tensor& targets) {
  detail::check_float(op, "logits", logits);
  detail::check_cpu(op, "targets", targets);
  return detail::logit_rows(op, logits, targets);
}

/// Every target, checked in row order before any row is computed.
const std::int32_t* checked_targets(const char* op, const Tensor& targets, std::int64_t N,
                                    std::int64_t V) {
  const std::int32_t* t = targets.data<std::int32_t>();
  for (std::int64_t n = 0; n < N; ++n)
    DTP_CHECK(t[n] >= 0 && t[n] < V, op, ": target ", t[n], " at row ", n,
              " is outside the vocabulary [0, ", V, ")");
  return t;
}

// log(sum(exp(row))) computed stably in T.
template <typename T>
T row_logsumexp(const T* row, std::int64_t V, T& max_out) {
  T m = -std::numeric_limits<T>::infinity();
  for (std::int64_t c = 0; c < V; ++c) m = std::max(m, row[c]);
  T sum = 0;
  for (std::int64_t c = 0; c < V; ++c) sum += std::exp(row[c] - m);
  max_out = m;
  return m + std::log(sum);
}
}  // namespace

double cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses) {
  if (logits.device().is_cuda()) return cuda::cross_entropy_forward(logits, targets, losses);
  if (detail::is_half(logits.dtype())) {
    detail::Widened f32("cross_entropy_forward", logits.dtype());
    const double result =
        cross_entropy_forward(f32.in("logits", logits), targets, f32.out("losses", losses));
    f32.store();
    return result;
  }
  const char* op = "cross_entropy_forward";
  const detail::LogitRows r = check_logits(op, logits, targets);
  if (losses.defined()) {
    detail::check_float(op, "losses", losses);
    detail::check_dtype_is(op, "losses", losses, logits.dtype());
    detail::check_numel(op, "losses", losses, r.N, "one per row of logits");
  }
  const std::int32_t* target = checked_targets(op, targets, r.N, r.V);
  double total = 0;
  detail::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pl = logits.data<T>();
    std::vector<T> row_loss(static_cast<std::size_t>(r.N));
    parallel_for(r.N, rows_per_part(r.V), [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t n = first; n < last; ++n) {
        const T* row = pl + n * r.V;
        T m;
        row_loss[static_cast<std::size_t>(n)] = row_logsumexp(row, r.V, m) - row[target[n]];
      }
    });
    T* out = losses.defined() ? losses.data<T>() : nullptr;
    for (std::int64_t n = 0; n < r.N; ++n) {
      if (out) out[n] = row_loss[static_cast<std::size_t>(n)];
      total += static_cast<double>(row_loss[static_cast<std::size_t>(n)]);
    }
  });
  return r.N > 0 ? total / static_cast<double>(r.N) : 0.0;
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, double loss_scale,
                            Tensor& dlogits) {
  if (logits.device().is_cuda())
    return cuda::cross_entropy_backward(logits, targets, loss_scale, dlogits);
  if (detail::is_half(logits.dtype())) {
    detail::Widened f32("cross_entropy_backward", logits.dtype());
    cross_entropy_backward(f32.in("logits", logits), targets, loss_scale,
                           f32.out("dlogits", dlogits));
    return f32.store();
  }
  const char* op = "cross_entropy_backward";
  const detail::LogitRows r = check_logits(op, logits, targets);
  detail::check_float(op, "dlogits", dlogits);
  detail::check_dtype_is(op, "dlogits", dlogits, logits.dtype());
  detail::check_shape(op, "dlogits", dlogits, logits.shape());
  const std::int32_t* target = checked_targets(op, targets, r.N, r.V);
  detail::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pl = logits.data<T>();
    T* pd = dlogits.data<T>();
    const T s = static_cast<T>(loss_scale);
    parallel_for(r.N, rows_per_part(r.V), [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t n = first; n < last; ++n) {
        const T* row = pl + n * r.V;
        T* grad = pd + n * r.V;  // may be the same memory as row
        T m;
        const T lse = row_logsumexp(row, r.V, m);
        for (std::int64_t c = 0; c < r.V; ++c) grad[c] = std::exp(row[c] - lse) * s;
        grad[target[n]] -= s;
      }
    });
  });
}

}  // namespace dtp::ops
