// Flash-style attention on the CPU. For each query row, keys are visited in
// blocks; each block gives a partial result (output normalized over the
// block, the block's max score and its sum of exponentials) that is folded
// into the running result with the same merge that attention_merge exposes
// (and that ring attention uses across ranks). Only O(block) scores exist at
// a time; the backward recomputes probabilities from the saved row max and sum.
#include <limits>
#include <tuple>
#include <vector>

#include "cpu/attention_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"

namespace dtp::ops {

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                             Tensor& row_max, Tensor& row_sum, const AttentionMask& mask,
                             double scale, std::int64_t block_size) {
  if (q.device().is_cuda()) return cuda::flash_attention_forward(q, k, v, out, row_max, row_sum, mask, scale, block_size);
  if (detail::is_half(q.dtype())) {
    detail::Widened f32("flash_attention_forward", q.dtype());
    flash_attention_forward(f32.in("q", q), f32.in("k", k), f32.in("v", v), f32.out("out", out),
                            f32.out("row_max", row_max), f32.out("row_sum", row_sum), mask, scale, block_size);
    return f32.store();
  }
  const char* op = "flash_attention_forward";
  const detail::AttentionDims d = detail::attention_dims(op, q, k, v, scale);
  DTP_CHECK(block_size >= 1, op, ": block_size must be at least 1, got ", block_size);
  detail::check_float(op, "out", out);
  detail::check_dtype_is(op, "out", out, q.dtype());
  detail::check_shape(op, "out", out, q.shape());
  detail::check_attention_stat(op, "row_max", row_max, d, q.dtype());
  detail::check_attention_stat(op, "row_sum", row_sum, d, q.dtype());
  detail::with_float(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    T* po = out.data<T>();
    T* pm = row_max.data<T>();
    T* pl = row_sum.data<T>();
    const T sc = static_cast<T>(d.scale);
    const T neg_inf = -std::numeric_limits<T>::infinity();
    std::vector<T> scores(static_cast<std::size_t>(block_size));
    std::vector<T> block_out(static_cast<std::size_t>(d.D));
    for (std::int64_t b = 0; b < d.B; ++b) {
      for (std::int64_t h = 0; h < d.H; ++h) {
        for (std::int64_t i = 0; i < d.Tq; ++i) {
          const T* qi = pq + d.q_offset(b, i, h);
          T* oi = po + d.q_offset(b, i, h);
          T& m = pm[d.stat_offset(b, h, i)];
          T& l = pl[d.stat_offset(b, h, i)];
          std::fill(oi, oi + d.D, T(0));
          m = neg_inf;
          l = 0;
          const std::int64_t nk = d.visible_keys(mask, i);
          for (std::int64_t j0 = 0; j0 < nk; j0 += block_size) {
            const std::int64_t j1 = std::min(nk, j0 + block_size);
            // The block's own partial result: (block_out, block_max, block_sum).
            T block_max = neg_inf;
            for (std::int64_t j = j0; j < j1; ++j) {
              scores[j - j0] = sc * detail::dot(qi, pk + d.k_offset(b, j, h), d.D);
              block_max = std::max(block_max, scores[j - j0]);
            }
            T block_sum = 0;
            std::fill(block_out.begin(), block_out.end(), T(0));
            for (std::int64_t j = j0; j < j1; ++j) {
              const T e = std::exp(scores[j - j0] - block_max);
              block_sum += e;
              detail::axpy_row(block_out.data(), e, pv + d.k_offset(b, j, h), d.D);
            }
            const T inv = T(1) / block_sum;
            for (T& x : block_out) x *= inv;
            detail::merge_attention_row(d.D, oi, m, l, block_out.data(), block_max, block_sum);
          }
        }
      }
    }
  });
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& row_max, const Tensor& row_sum, const Tensor& dout,
                              Tensor& dq, Tensor& dk, Tensor& dv, const AttentionMask& mask,
                              double scale) {
  if (q.device().is_cuda()) return cuda::flash_attention_backward(q, k, v, out, row_max, row_sum, dout, dq, dk, dv, mask, scale);
  if (detail::is_half(q.dtype())) {
    detail::Widened f32("flash_attention_backward", q.dtype());
    flash_attention_backward(f32.in("q", q), f32.in("k", k), f32.in("v", v), f32.in("out", out),
                             f32.in("row_max", row_max), f32.in("row_sum", row_sum), f32.in("dout", dout),
                             f32.out("dq", dq), f32.out("dk", dk), f32.out("dv", dv), mask, scale);
    return f32.store();
  }
  const char* op = "flash_attention_backward";
  const detail::AttentionDims d = detail::attention_dims(op, q, k, v, scale);
  for (auto [name, t, shape] :
       {std::tuple<const char*, const Tensor*, Shape>{"out", &out, q.shape()},
        {"dout", &dout, q.shape()},
        {"dq", &dq, q.shape()},
        {"dk", &dk, k.shape()},
        {"dv", &dv, v.shape()}}) {
    detail::check_float(op, name, *t);
    detail::check_dtype_is(op, name, *t, q.dtype());
    detail::check_shape(op, name, *t, shape);
  }
  detail::check_attention_stat(op, "row_max", row_max, d, q.dtype());
  detail::check_attention_stat(op, "row_sum", row_sum, d, q.dtype());
  detail::with_float(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    const T* po = out.data<T>();
    const T* pm = row_max.data<T>();
    const T* pl = row_sum.data<T>();
    const T* pdo = dout.data<T>();
    T* pdq = dq.data<T>();
    T* pdk = dk.data<T>();
    T* pdv = dv.data<T>();
    std::fill(pdq, pdq + dq.numel(), T(0));
    std::fill(pdk, pdk + dk.numel(), T(0));
    std::fill(pdv, pdv + dv.numel(), T(0));
    const T sc = static_cast<T>(d.scale);
    for (std::int64_t b = 0; b < d.B; ++b) {
      for (std::int64_t h = 0; h < d.H; ++h) {
        for (std::int64_t i = 0; i < d.Tq; ++i) {
          const T m = pm[d.stat_offset(b, h, i)];
          const T l = pl[d.stat_offset(b, h, i)];
          if (l == T(0)) continue;  // the row saw no key at all
          const T inv_l = T(1) / l;
          const T* qi = pq + d.q_offset(b, i, h);
          const T* doi = pdo + d.q_offset(b, i, h);
          T* dqi = pdq + d.q_offset(b, i, h);
          // rowsum(P * dP) equals dO . O, so it needs no second pass over keys.
          const T row_dot = detail::dot(doi, po + d.q_offset(b, i, h), d.D);
          const std::int64_t nk = d.visible_keys(mask, i);
          for (std::int64_t j = 0; j < nk; ++j) {
            const T* kj = pk + d.k_offset(b, j, h);
            const T p = std::exp(sc * detail::dot(qi, kj, d.D) - m) * inv_l;
            const T dp = detail::dot(doi, pv + d.k_offset(b, j, h), d.D);
            detail::axpy_row(pdv + d.k_offset(b, j, h), p, doi, d.D);
            const T ds = sc * p * (dp - row_dot);
            detail::axpy_row(dqi, ds, kj, d.D);
            detail::axpy_row(pdk + d.k_offset(b, j, h), ds, qi, d.D);
          }
        }
      }
    }
  });
}

void attention_merge(Tensor& out, Tensor& row_max, Tensor& row_sum, const Tensor& other_out,
                     const Tensor& other_max, const Tensor& other_sum) {
  if (out.device().is_cuda()) return cuda::attention_merge(out, row_max, row_sum, other_out, other_max, other_sum);
  if (detail::is_half(out.dtype())) {
    detail::Widened f32("attention_merge", out.dtype());
    attention_merge(f32.out("out", out), f32.out("row_max", row_max), f32.out("row_sum", row_sum),
                    f32.in("other_out", other_out), f32.in("other_max", other_max), f32.in("other_sum", other_sum));
    return f32.store();
  }
  const char* op = "attention_merge";
  detail::check_float(op, "out", out);
  DTP_CHECK(out.ndim() == 4, op, ": out must be [B, Tq, H, D], got ", out.describe());
  detail::check_float(op, "other_out", other_out);
  detail::check_dtype_is(op, "other_out", other_out, out.dtype());
  detail::check_shape(op, "other_out", other_out, out.shape());
  const detail::AttentionDims d{out.size(0), out.size(1), 0, out.size(2), out.size(3), 1.0};
  detail::check_attention_stat(op, "row_max", row_max, d, out.dtype());
  detail::check_attention_stat(op, "row_sum", row_sum, d, out.dtype());
  detail::check_attention_stat(op, "other_max", other_max, d, out.dtype());
  detail::check_attention_stat(op, "other_sum", other_sum, d, out.dtype());
  detail::with_float(out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* po = out.data<T>();
    T* pm = row_max.data<T>();
    T* pl = row_sum.data<T>();
    const T* qo = other_out.data<T>();
    const T* qm = other_max.data<T>();
    const T* ql = other_sum.data<T>();
    for (std::int64_t b = 0; b < d.B; ++b)
      for (std::int64_t h = 0; h < d.H; ++h)
        for (std::int64_t i = 0; i < d.Tq; ++i) {
          const std::int64_t s = d.stat_offset(b, h, i), o = d.q_offset(b, i, h);
          detail::merge_attention_row(d.D, po + o, pm[s], pl[s], qo + o, qm[s], ql[s]);
        }
  });
}

}  // namespace dtp::ops
