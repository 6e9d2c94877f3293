// Naive attention: the full (masked) probability matrix per head is formed,
// kept for the backward, and multiplied by V. Memory O(B H Tq Tk): what flash
// attention avoids.
#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include "cpu/attention_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/parallel.h"

namespace dtp::ops {

namespace {
// Enough (batch, head) pairs per thread for about 256k multiply-adds.
std::int64_t pairs_per_part(const detail::AttentionDims& d) {
  return std::max<std::int64_t>(1, (std::int64_t{1} << 18) / std::max<std::int64_t>(1, d.Tq * d.Tk * d.D));
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& probs, const AttentionMask& mask, double scale) {
  if (q.device().is_cuda()) return cuda::attention_forward(q, k, v, out, probs, mask, scale);
  if (detail::is_half(q.dtype())) {
    detail::Widened f32("attention_forward", q.dtype());
    attention_forward(f32.in("q", q), f32.in("k", k), f32.in("v", v), f32.out("out", out),
                      f32.out("probs", probs), mask, scale);
    return f32.store();
  }
  const char* op = "attention_forward";
  const detail::AttentionDims d = detail::attention_dims(op, q, k, v, scale);
  detail::check_float(op, "out", out);
  detail::check_dtype_is(op, "out", out, q.dtype());
  detail::check_shape(op, "out", out, q.shape());
  detail::check_float(op, "probs", probs);
  detail::check_dtype_is(op, "probs", probs, q.dtype());
  detail::check_shape(op, "probs", probs, Shape{d.B, d.H, d.Tq, d.Tk});
  detail::with_float(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    T* po = out.data<T>();
    T* pp = probs.data<T>();
    const T sc = static_cast<T>(d.scale);
    // (batch, head) pairs touch disjoint rows of every output: they go to
    // the rank's threads whole, so each element's arithmetic is unchanged.
    parallel_for(d.B * d.H, pairs_per_part(d), [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t bh = first; bh < last; ++bh) {
        const std::int64_t b = bh / d.H, h = bh % d.H;
        for (std::int64_t i = 0; i < d.Tq; ++i) {
          const T* qi = pq + d.q_offset(b, i, h);
          T* oi = po + d.q_offset(b, i, h);
          T* p = pp + ((b * d.H + h) * d.Tq + i) * d.Tk;
          const std::int64_t nk = d.visible_keys(mask, i);
          std::fill(p, p + d.Tk, T(0));
          std::fill(oi, oi + d.D, T(0));
          if (nk == 0) continue;  // sees no key: zeros
          T m = -std::numeric_limits<T>::infinity();
          for (std::int64_t j = 0; j < nk; ++j) {
            p[j] = sc * detail::dot(qi, pk + d.k_offset(b, j, h), d.D);
            m = std::max(m, p[j]);
          }
          T sum = 0;
          for (std::int64_t j = 0; j < nk; ++j) {
            p[j] = std::exp(p[j] - m);
            sum += p[j];
          }
          const T inv = T(1) / sum;
          for (std::int64_t j = 0; j < nk; ++j) {
            p[j] *= inv;
            detail::axpy_row(oi, p[j], pv + d.k_offset(b, j, h), d.D);
          }
        }
      }
    });
  });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionMask& mask, double scale) {
  if (q.device().is_cuda()) return cuda::attention_backward(q, k, v, probs, dout, dq, dk, dv, mask, scale);
  if (detail::is_half(q.dtype())) {
    detail::Widened f32("attention_backward", q.dtype());
    attention_backward(f32.in("q", q), f32.in("k", k), f32.in("v", v), f32.in("probs", probs),
                       f32.in("dout", dout), f32.out("dq", dq), f32.out("dk", dk), f32.out("dv", dv), mask, scale);
    return f32.store();
  }
  const char* op = "attention_backward";
  const detail::AttentionDims d = detail::attention_dims(op, q, k, v, scale);
  for (auto [name, t, shape] :
       {std::tuple<const char*, const Tensor*, Shape>{"probs", &probs, Shape{d.B, d.H, d.Tq, d.Tk}},
        {"dout", &dout, q.shape()},
        {"dq", &dq, q.shape()},
        {"dk", &dk, k.shape()},
        {"dv", &dv, v.shape()}}) {
    detail::check_float(op, name, *t);
    detail::check_dtype_is(op, name, *t, q.dtype());
    detail::check_shape(op, name, *t, shape);
  }
  detail::with_float(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    const T* pp = probs.data<T>();
    const T* pdo = dout.data<T>();
    T* pdq = dq.data<T>();
    T* pdk = dk.data<T>();
    T* pdv = dv.data<T>();
    std::fill(pdq, pdq + dq.numel(), T(0));
    std::fill(pdk, pdk + dk.numel(), T(0));
    std::fill(pdv, pdv + dv.numel(), T(0));
    const T sc = static_cast<T>(d.scale);
    parallel_for(d.B * d.H, pairs_per_part(d), [&](std::int64_t first, std::int64_t last) {
      std::vector<T> dp(static_cast<std::size_t>(d.Tk));
      for (std::int64_t bh = first; bh < last; ++bh) {
        const std::int64_t b = bh / d.H, h = bh % d.H;
        for (std::int64_t i = 0; i < d.Tq; ++i) {
          const std::int64_t nk = d.visible_keys(mask, i);
          const T* p = pp + ((b * d.H + h) * d.Tq + i) * d.Tk;
          const T* doi = pdo + d.q_offset(b, i, h);
          // dP = dO V^T; dV += P^T dO; dS = P (dP - rowsum(P dP)).
          T row_dot = 0;
          for (std::int64_t j = 0; j < nk; ++j) {
            dp[j] = detail::dot(doi, pv + d.k_offset(b, j, h), d.D);
            row_dot += p[j] * dp[j];
            detail::axpy_row(pdv + d.k_offset(b, j, h), p[j], doi, d.D);
          }
          const T* qi = pq + d.q_offset(b, i, h);
          T* dqi = pdq + d.q_offset(b, i, h);
          for (std::int64_t j = 0; j < nk; ++j) {
            const T ds = sc * p[j] * (dp[j] - row_dot);
            detail::axpy_row(dqi, ds, pk + d.k_offset(b, j, h), d.D);
            detail::axpy_row(pdk + d.k_offset(b, j, h), ds, qi, d.D);
          }
        }
      }
    });
  });
}

}  // namespace dtp::ops
