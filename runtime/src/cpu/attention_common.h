// Internal: shape checks and indexing shared by naive and flash attention.
// Activations are [B, T, H, D]; row i of head h in batch b starts at
// ((b * T + i) * H + h) * D, so consecutive rows of one head are H * D apart.
#pragma once

#include <algorithm>
#include <cmath>

#include "cpu/gemm.h"
#include "cpu/nn_ops_common.h"
#include "dtp/nn_ops.h"

namespace dtp::detail {

struct AttentionDims {
  std::int64_t B, Tq, Tk, H, D;
  double scale;
  std::int64_t row_stride() const { return H * D; }
  std::int64_t q_offset(std::int64_t b, std::int64_t i, std::int64_t h) const {
    return ((b * Tq + i) * H + h) * D;
  }
  std::int64_t k_offset(std::int64_t b, std::int64_t j, std::int64_t h) const {
    return ((b * Tk + j) * H + h) * D;
  }
  std::int64_t stat_offset(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return (b * H + h) * Tq + i;
  }
  /// Number of keys query row i sees: keys [0, visible_keys(i)).
  std::int64_t visible_keys(const ops::AttentionMask& mask, std::int64_t i) const {
    if (!mask.causal) return Tk;
    const std::int64_t last = mask.q_start + i - mask.k_start;  // last visible key index
    return std::clamp<std::int64_t>(last + 1, 0, Tk);
  }
};

/// Where one (batch, head) pair's keys start in K and V, which the backward
/// pass reads, and in dK and dV, which it adds to.
template <typename T>
struct KeyHeads {
  const T* k;
  const T* v;
  T* dk;
  T* dv;
};
template <typename T>
KeyHeads<T> key_heads(const AttentionDims& d, std::int64_t b, std::int64_t h, const T* k,
                      const T* v, T* dk, T* dv) {
  const std::int64_t start = d.k_offset(b, 0, h);
  return {k + start, v + start, dk + start, dv + start};
}

/// Checks q [B, Tq, H, D], k and v [B, Tk, H, D] (same dtype, f32 or f64) and
/// returns the dims with the default scale 1/sqrt(D) filled in.
inline AttentionDims attention_dims(const char* op, const Tensor& q, const Tensor& k,
                                    const Tensor& v, double scale) {
  check_float(op, "q", q);
  check_float(op, "k", k);
  check_float(op, "v", v);
  check_dtype_is(op, "k", k, q.dtype());
  check_dtype_is(op, "v", v, q.dtype());
  DTP_CHECK(q.ndim() == 4, op, ": q must be [B, T, H, D] (view a [B, T, C] activation as ",
            "[B, T, heads, C / heads]), got ", q.describe());
  DTP_CHECK(
      k.ndim() == 4 && k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == q.size(3),
      op, ": k must be [", q.size(0), ", Tk, ", q.size(2), ", ", q.size(3), "] to match q ",
      q.describe(), ", got ", k.describe());
  check_shape(op, "v", v, k.shape());
  AttentionDims dims{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), scale};
  if (dims.scale <= 0) dims.scale = dims.D > 0 ? 1.0 / std::sqrt(static_cast<double>(dims.D)) : 1.0;
  return dims;
}

/// Checks a per-row statistic: [B, H, Tq], dtype of q.
inline void check_attention_stat(const char* op, const char* name, const Tensor& t,
                                 const AttentionDims& d, DType dtype) {
  check_float(op, name, t);
  check_dtype_is(op, name, t, dtype);
  check_shape(op, name, t, Shape{d.B, d.H, d.Tq});
}

/// Enough (batch, head) pairs per thread for about 256k multiply-adds. A
/// pair's rows of every output are its own, so pairs go to the rank's
/// threads whole and each element's arithmetic is the same at any thread count.
inline std::int64_t pairs_per_part(const AttentionDims& d) {
  return std::max<std::int64_t>(
      1, (std::int64_t{1} << 18) / std::max<std::int64_t>(1, d.Tq * d.Tk * d.D));
}

/// Query rows are taken kQueryBlock at a time, as matrix products.
inline constexpr std::int64_t kQueryBlock = 32;

/// Query rows [i0, i0 + rows) of one head see keys [0, keys) at most (the
/// last row sees the most: visible_keys grows with the row).
struct QueryBlock {
  std::int64_t i0, rows, keys;
};

template <typename Body>
void for_each_query_block(const AttentionDims& d, const ops::AttentionMask& mask, Body body) {
  for (std::int64_t i0 = 0; i0 < d.Tq; i0 += kQueryBlock) {
    const std::int64_t rows = std::min(kQueryBlock, d.Tq - i0);
    body(QueryBlock{i0, rows, d.visible_keys(mask, i0 + rows - 1)});
  }
}

/// op(A) @ op(B) into C, overwriting it or adding to it (cpu/gemm.h).
template <typename T>
void product(std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, cpu::Strides a,
             const T* B, cpu::Strides b, T* C, std::int64_t ldc, bool accumulate) {
  cpu::gemm(M, N, K, alpha, A, a, B, b, cpu::Output<T>{C, ldc, accumulate});
}

template <typename T>
T dot(const T* __restrict a, const T* __restrict b, std::int64_t n) {
  // Four partial sums: lets the compiler vectorize without -ffast-math.
  T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

template <typename T>
void axpy_row(T* __restrict y, T a, const T* __restrict x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

/// The online-softmax merge of one query row: (o_a, m_a, l_a) becomes the
/// result over both key sets. See ops::attention_merge.
template <typename T>
void merge_attention_row(std::int64_t D, T* __restrict o_a, T& m_a, T& l_a, const T* __restrict o_b,
                         T m_b, T l_b) {
  if (l_b == T(0)) return;  // b saw no key
  if (l_a == T(0)) {
    std::copy(o_b, o_b + D, o_a);
    m_a = m_b;
    l_a = l_b;
    return;
  }
  const T m = std::max(m_a, m_b);
  const T w_a = l_a * std::exp(m_a - m);
  const T w_b = l_b * std::exp(m_b - m);
  const T l = w_a + w_b;
  const T c_a = w_a / l, c_b = w_b / l;
  for (std::int64_t d = 0; d < D; ++d) o_a[d] = c_a * o_a[d] + c_b * o_b[d];
  m_a = m;
  l_a = l;
}

}  // namespace dtp::detail
