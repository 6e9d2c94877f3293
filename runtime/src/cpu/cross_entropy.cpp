// Softmax cross-entropy, fused: the forward never stores probabilities and
// the backward turns logits into their gradient in place (llm.c style).
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"

namespace dtp::ops {

namespace {
detail::LogitRows check_logits(const char* op, const Tensor& logits, const Tensor& targets) {
  detail::check_float(op, "logits", logits);
  detail::check_cpu(op, "targets", targets);
  return detail::logit_rows(op, logits, targets);
}

std::int32_t checked_target(const char* op, const Tensor& targets, std::int64_t n, std::int64_t V) {
  const std::int32_t t = targets.data<std::int32_t>()[n];
  DTP_CHECK(t >= 0 && t < V, op, ": target ", t, " at row ", n, " is outside the vocabulary [0, ",
            V, ")");
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
    const double result = cross_entropy_forward(f32.in("logits", logits), targets, f32.out("losses", losses));
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
  double total = 0;
  detail::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pl = logits.data<T>();
    T* out = losses.defined() ? losses.data<T>() : nullptr;
    for (std::int64_t n = 0; n < r.N; ++n) {
      const T* row = pl + n * r.V;
      const std::int32_t t = checked_target(op, targets, n, r.V);
      T m;
      const T loss = row_logsumexp(row, r.V, m) - row[t];
      if (out) out[n] = loss;
      total += static_cast<double>(loss);
    }
  });
  return r.N > 0 ? total / static_cast<double>(r.N) : 0.0;
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, double loss_scale,
                            Tensor& dlogits) {
  if (logits.device().is_cuda()) return cuda::cross_entropy_backward(logits, targets, loss_scale, dlogits);
  if (detail::is_half(logits.dtype())) {
    detail::Widened f32("cross_entropy_backward", logits.dtype());
    cross_entropy_backward(f32.in("logits", logits), targets, loss_scale, f32.out("dlogits", dlogits));
    return f32.store();
  }
  const char* op = "cross_entropy_backward";
  const detail::LogitRows r = check_logits(op, logits, targets);
  detail::check_float(op, "dlogits", dlogits);
  detail::check_dtype_is(op, "dlogits", dlogits, logits.dtype());
  detail::check_shape(op, "dlogits", dlogits, logits.shape());
  detail::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pl = logits.data<T>();
    T* pd = dlogits.data<T>();
    const T s = static_cast<T>(loss_scale);
    for (std::int64_t n = 0; n < r.N; ++n) {
      const T* row = pl + n * r.V;
      T* grad = pd + n * r.V;  // may be the same memory as row
      const std::int32_t t = checked_target(op, targets, n, r.V);
      T m;
      const T lse = row_logsumexp(row, r.V, m);
      for (std::int64_t c = 0; c < r.V; ++c) grad[c] = std::exp(row[c] - lse) * s;
      grad[t] -= s;
    }
  });
}

}  // namespace dtp::ops
