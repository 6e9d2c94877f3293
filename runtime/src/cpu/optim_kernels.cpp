// Optimizer updates on flat buffers. They work on any matching views, so a
// ZeRO shard or a bucket is updated exactly like a whole unit. Every element
// is updated on its own, so the parts run on all the rank's threads and the
// bits do not depend on how many.
#include <cmath>

#include "cpu/nn_ops_common.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"
#include "dtp/parallel.h"

namespace dtp::ops {

namespace {

// On every device: an optimizer updates f32 or f64 parameters. A 16-bit
// parameter would lose every update smaller than its spacing (chapter 07,
// section 4): mixed precision steps f32 master weights instead.
void check_optimizer_params(const char* op, const Tensor& params) {
  DTP_CHECK(params.defined(), op, ": params is an undefined tensor");
  DTP_CHECK(
      params.dtype() == DType::f32 || params.dtype() == DType::f64, op, ": params is ",
      params.describe(),
      "; optimizers update f32 or f64 parameters (a 16-bit weight loses the updates smaller than "
      "its "
      "spacing: keep f32 master weights and cast them down after the step, as chapter 07 does)");
}
}  // namespace

void adamw_update(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, double lr,
                  double beta1, double beta2, double eps, double weight_decay, std::int64_t step) {
  check_optimizer_params("adamw_update", params);
  if (params.device().is_cuda())
    return cuda::adamw_update(params, grads, m, v, lr, beta1, beta2, eps, weight_decay, step);
  const char* op = "adamw_update";
  detail::check_float(op, "params", params);
  for (auto [name, t] :
       {std::pair<const char*, const Tensor*>{"grads", &grads}, {"m", &m}, {"v", &v}}) {
    detail::check_float(op, name, *t);
    detail::check_dtype_is(op, name, *t, params.dtype());
    detail::check_numel(op, name, *t, params.numel(), "as many as params");
  }
  DTP_CHECK(step >= 1, op, ": step counts from 1, got ", step);
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  detail::with_float(params.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* __restrict p = params.data<T>();
    const T* __restrict g = grads.data<T>();
    T* __restrict pm = m.data<T>();
    T* __restrict pv = v.data<T>();
    const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2);
    const T step_size = static_cast<T>(lr / bias1);
    const T inv_sqrt_bias2 = static_cast<T>(1.0 / std::sqrt(bias2));
    const T e = static_cast<T>(eps), decay = static_cast<T>(lr * weight_decay);
    parallel_for(params.numel(), kElementsPerPart, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        pm[i] = b1 * pm[i] + (T(1) - b1) * g[i];
        pv[i] = b2 * pv[i] + (T(1) - b2) * g[i] * g[i];
        const T denom = std::sqrt(pv[i]) * inv_sqrt_bias2 + e;
        p[i] -= step_size * pm[i] / denom + decay * p[i];
      }
    });
  });
}

void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, double lr,
                double momentum, double weight_decay, bool nesterov) {
  check_optimizer_params("sgd_update", params);
  if (params.device().is_cuda())
    return cuda::sgd_update(params, grads, momentum_buffer, lr, momentum, weight_decay, nesterov);
  const char* op = "sgd_update";
  detail::check_float(op, "params", params);
  detail::check_float(op, "grads", grads);
  detail::check_dtype_is(op, "grads", grads, params.dtype());
  detail::check_numel(op, "grads", grads, params.numel(), "as many as params");
  const bool use_momentum = momentum != 0.0;
  if (use_momentum) {
    detail::check_float(op, "momentum_buffer", momentum_buffer);
    detail::check_dtype_is(op, "momentum_buffer", momentum_buffer, params.dtype());
    detail::check_numel(op, "momentum_buffer", momentum_buffer, params.numel(),
                        "as many as params");
  }
  detail::with_float(params.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* __restrict p = params.data<T>();
    const T* __restrict g = grads.data<T>();
    T* __restrict buf = use_momentum ? momentum_buffer.data<T>() : nullptr;
    const T mu = static_cast<T>(momentum), wd = static_cast<T>(weight_decay),
            rate = static_cast<T>(lr);
    parallel_for(params.numel(), kElementsPerPart, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        const T grad = g[i] + wd * p[i];
        if (!use_momentum) {
          p[i] -= rate * grad;
          continue;
        }
        buf[i] = mu * buf[i] + grad;
        p[i] -= rate * (nesterov ? grad + mu * buf[i] : buf[i]);
      }
    });
  });
}

}  // namespace dtp::ops
