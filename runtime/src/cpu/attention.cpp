// Naive attention: the full (masked) probability matrix per head is formed,
// kept for the backward, and multiplied by V. Memory O(B H Tq Tk): what flash
// attention avoids.
//
// Each (batch, head) pair is a few matrix products, done by the CPU matmul
// (cpu/gemm.h) straight on the [B, T, H, D] layout (a head's rows are H * D
// apart), in blocks of kQueryBlock query rows: under a causal mask a block
// needs only the keys its last row sees, so about half of the products of
// Q K^T, P V and their gradients are never computed.
#include <algorithm>
#include <tuple>
#include <vector>

#include "cpu/attention_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/parallel.h"

namespace dtp::ops {

using detail::for_each_query_block;
using detail::kQueryBlock;
using detail::pairs_per_part;
using detail::product;
using detail::QueryBlock;

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& probs, const AttentionMask& mask, double scale) {
  if (detail::is_half(q.dtype())) {
    detail::Widened f32("attention_forward", q.dtype());
    attention_forward(f32.in("q", q), f32.in("k", k), f32.in("v", v), f32.out("out", out),
                      f32.out("probs", probs), mask, scale);
    return f32.store();
  }
  count_flops(4 * q.numel() * detail::key_count(k));  // S = Q K^T and O = P V
  if (q.device().is_cuda()) return cuda::attention_forward(q, k, v, out, probs, mask, scale);
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
    const std::int64_t ld = d.row_stride();  // between a head's consecutive rows
    // (batch, head) pairs touch disjoint rows of every output: they go to
    // the rank's threads whole, so each element's arithmetic is unchanged.
    parallel_for(d.B * d.H, pairs_per_part(d), [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t bh = first; bh < last; ++bh) {
        const std::int64_t b = bh / d.H, h = bh % d.H;
        const T* k_head = pk + d.k_offset(b, 0, h);
        const T* v_head = pv + d.k_offset(b, 0, h);
        T* p_head = pp + bh * d.Tq * d.Tk;
        for_each_query_block(d, mask, [&](const QueryBlock& blk) {
          T* p = p_head + blk.i0 * d.Tk;
          // S = scale * Q K^T over the keys the block sees, then each row's softmax.
          product<T>(blk.rows, blk.keys, d.D, sc, pq + d.q_offset(b, blk.i0, h), {ld, 1}, k_head,
                     {1, ld}, p, d.Tk, false);
          for (std::int64_t r = 0; r < blk.rows; ++r) {
            T* row = p + r * d.Tk;
            const std::int64_t nk = d.visible_keys(mask, blk.i0 + r);
            std::fill(row + nk, row + d.Tk,
                      T(0));  // hidden keys (a row that sees none is all zeros)
            if (nk > 0) detail::softmax_row(row, row, nk);
          }
          // O = P V (hidden keys have probability 0).
          product<T>(blk.rows, d.D, blk.keys, T(1), p, {d.Tk, 1}, v_head, {ld, 1},
                     po + d.q_offset(b, blk.i0, h), ld, false);
        });
      }
    });
  });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        const AttentionMask& mask, double scale) {
  if (detail::is_half(q.dtype())) {
    detail::Widened f32("attention_backward", q.dtype());
    attention_backward(f32.in("q", q), f32.in("k", k), f32.in("v", v), f32.in("probs", probs),
                       f32.in("dout", dout), f32.out("dq", dq), f32.out("dk", dk),
                       f32.out("dv", dv), mask, scale);
    return f32.store();
  }
  count_flops(8 * q.numel() * detail::key_count(k));  // dP, dV, dQ and dK
  if (q.device().is_cuda())
    return cuda::attention_backward(q, k, v, probs, dout, dq, dk, dv, mask, scale);
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
    std::fill(pdk, pdk + dk.numel(), T(0));  // the query blocks add to dK and dV
    std::fill(pdv, pdv + dv.numel(), T(0));
    const T sc = static_cast<T>(d.scale);
    const std::int64_t ld = d.row_stride();
    parallel_for(d.B * d.H, pairs_per_part(d), [&](std::int64_t first, std::int64_t last) {
      std::vector<T> ds(static_cast<std::size_t>(kQueryBlock * d.Tk));
      for (std::int64_t bh = first; bh < last; ++bh) {
        const std::int64_t b = bh / d.H, h = bh % d.H;
        const auto [k_head, v_head, dk_head, dv_head] = key_heads(d, b, h, pk, pv, pdk, pdv);
        for_each_query_block(d, mask, [&](const QueryBlock& blk) {
          const T* p = pp + (bh * d.Tq + blk.i0) * d.Tk;
          const T* q_blk = pq + d.q_offset(b, blk.i0, h);
          const T* do_blk = pdo + d.q_offset(b, blk.i0, h);
          const std::int64_t n = blk.keys;
          // dP = dO V^T; dV += P^T dO.
          product<T>(blk.rows, n, d.D, T(1), do_blk, {ld, 1}, v_head, {1, ld}, ds.data(), n, false);
          product<T>(n, d.D, blk.rows, T(1), p, {1, d.Tk}, do_blk, {ld, 1}, dv_head, ld, true);
          // dS = scale * P (dP - rowsum(P dP)), in place of dP (0 where P is).
          for (std::int64_t r = 0; r < blk.rows; ++r) {
            const T* p_row = p + r * d.Tk;
            T* row = ds.data() + r * n;
            T row_dot = 0;
            for (std::int64_t j = 0; j < n; ++j) row_dot += p_row[j] * row[j];
            for (std::int64_t j = 0; j < n; ++j) row[j] = sc * p_row[j] * (row[j] - row_dot);
          }
          // dQ = dS K; dK += dS^T Q.
          product<T>(blk.rows, d.D, n, T(1), ds.data(), {n, 1}, k_head, {ld, 1},
                     pdq + d.q_offset(b, blk.i0, h), ld, false);
          product<T>(n, d.D, blk.rows, T(1), ds.data(), {1, n}, q_blk, {ld, 1}, dk_head, ld, true);
        });
      }
    });
  });
}

}  // namespace dtp::ops
