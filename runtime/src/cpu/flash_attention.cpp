// Flash-style attention on the CPU. Query rows go kQueryBlock at a time and
// keys in blocks; each key block gives every row a partial result (its output
// normalized over the block, the block's max score and its sum of
// exponentials), folded into the row's running result with the same merge
// that attention_merge exposes (and that ring attention uses across ranks).
// Only a query block's scores against one key block exist at a time; the
// backward recomputes probabilities from the saved row max and sum. The
// scores and the products with V, dO, K and Q are matrix products
// (cpu/gemm.h) straight on the [B, T, H, D] layout, as in naive attention.
//
// bf16 and f16 run in f32 on exact widened copies, but round P and dS to the
// 16-bit type before the products that use them: naive attention stores P
// in that type, and the GPU's flash kernels multiply P and dS on tensor
// cores in it, so every attention rounds at the same places.
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
// The backward's key blocks: a query block's P and dS against this many keys
// at a time (its memory, and the size of the products).
constexpr std::int64_t kBackwardKeyBlock = 128;

// Rounds the values of P and dS that enter a product to @p operands (bf16 or
// f16); f32 and f64 keep theirs.
template <typename T>
void round_operands(T* values, std::int64_t count, DType operands) {
  if (operands == DType::bf16)
    for (std::int64_t i = 0; i < count; ++i)
      values[i] = bf16_to_float(float_to_bf16(static_cast<float>(values[i])));
  else if (operands == DType::f16)
    for (std::int64_t i = 0; i < count; ++i)
      values[i] = f16_to_float(float_to_f16(static_cast<float>(values[i])));
}

void forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& row_max,
             Tensor& row_sum, const AttentionMask& mask, double scale, std::int64_t block_size,
             DType operands) {
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
    const std::int64_t ld = d.row_stride();
    const std::int64_t key_block = std::min(block_size, std::max<std::int64_t>(1, d.Tk));
    parallel_for(d.B * d.H, detail::pairs_per_part(d), [&](std::int64_t first, std::int64_t last) {
      // One query block against one key block: scores, then exponentials.
      std::vector<T> scores(static_cast<std::size_t>(detail::kQueryBlock * key_block));
      std::vector<T> block_out(static_cast<std::size_t>(detail::kQueryBlock * d.D));
      std::vector<T> block_max(detail::kQueryBlock), block_sum(detail::kQueryBlock);
      for (std::int64_t bh = first; bh < last; ++bh) {
        const std::int64_t b = bh / d.H, h = bh % d.H;
        const T* k_head = pk + d.k_offset(b, 0, h);
        const T* v_head = pv + d.k_offset(b, 0, h);
        detail::for_each_query_block(d, mask, [&](const detail::QueryBlock& blk) {
          const T* q_blk = pq + d.q_offset(b, blk.i0, h);
          T* o_blk = po + d.q_offset(b, blk.i0, h);
          T* m = pm + d.stat_offset(b, h, blk.i0);
          T* l = pl + d.stat_offset(b, h, blk.i0);
          for (std::int64_t r = 0; r < blk.rows; ++r) {
            std::fill(o_blk + r * ld, o_blk + r * ld + d.D, T(0));
            m[r] = neg_inf;
            l[r] = 0;
          }
          for (std::int64_t j0 = 0; j0 < blk.keys; j0 += key_block) {
            const std::int64_t n = std::min(key_block, blk.keys - j0);
            detail::product<T>(blk.rows, n, d.D, sc, q_blk, {ld, 1}, k_head + j0 * ld, {1, ld},
                               scores.data(), n, false);
            // Each row's partial result over the keys of the block it sees
            // (a row that sees none of them gets a zero row and is not merged).
            for (std::int64_t r = 0; r < blk.rows; ++r) {
              T* row = scores.data() + r * n;
              const std::int64_t seen =
                  std::clamp<std::int64_t>(d.visible_keys(mask, blk.i0 + r) - j0, 0, n);
              T mx = neg_inf, sum = 0;
              for (std::int64_t c = 0; c < seen; ++c) mx = std::max(mx, row[c]);
              for (std::int64_t c = 0; c < seen; ++c) {
                row[c] = std::exp(row[c] - mx);
                sum += row[c];
              }
              std::fill(row + seen, row + n, T(0));
              round_operands(row, seen, operands);  // the sum above stays unrounded
              block_max[r] = mx;
              block_sum[r] = sum;
            }
            detail::product<T>(blk.rows, d.D, n, T(1), scores.data(), {n, 1}, v_head + j0 * ld,
                               {ld, 1}, block_out.data(), d.D, false);
            for (std::int64_t r = 0; r < blk.rows; ++r) {
              if (block_sum[r] == T(0)) continue;
              T* partial = block_out.data() + r * d.D;
              const T inv = T(1) / block_sum[r];
              for (std::int64_t c = 0; c < d.D; ++c) partial[c] *= inv;
              detail::merge_attention_row(d.D, o_blk + r * ld, m[r], l[r], partial, block_max[r],
                                          block_sum[r]);
            }
          }
        });
      }
    });
  });
}

void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& row_max, const Tensor& row_sum, const Tensor& dout, Tensor& dq,
              Tensor& dk, Tensor& dv, const AttentionMask& mask, double scale, DType operands) {
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
    std::fill(pdq, pdq + dq.numel(), T(0));  // every key block adds to dQ, dK and dV
    std::fill(pdk, pdk + dk.numel(), T(0));
    std::fill(pdv, pdv + dv.numel(), T(0));
    const T sc = static_cast<T>(d.scale);
    const std::int64_t ld = d.row_stride();
    const std::int64_t key_block = std::min(kBackwardKeyBlock, std::max<std::int64_t>(1, d.Tk));
    parallel_for(d.B * d.H, detail::pairs_per_part(d), [&](std::int64_t first, std::int64_t last) {
      const auto size = static_cast<std::size_t>(detail::kQueryBlock * key_block);
      std::vector<T> p(size), ds(size), row_dot(detail::kQueryBlock);
      for (std::int64_t bh = first; bh < last; ++bh) {
        const std::int64_t b = bh / d.H, h = bh % d.H;
        const auto [k_head, v_head, dk_head, dv_head] =
            detail::key_heads(d, b, h, pk, pv, pdk, pdv);
        detail::for_each_query_block(d, mask, [&](const detail::QueryBlock& blk) {
          const T* q_blk = pq + d.q_offset(b, blk.i0, h);
          const T* do_blk = pdo + d.q_offset(b, blk.i0, h);
          T* dq_blk = pdq + d.q_offset(b, blk.i0, h);
          const T* m = pm + d.stat_offset(b, h, blk.i0);
          const T* l = pl + d.stat_offset(b, h, blk.i0);
          // rowsum(P * dP) equals dO . O, so it needs no pass over the keys.
          for (std::int64_t r = 0; r < blk.rows; ++r)
            row_dot[r] = detail::dot(do_blk + r * ld, po + d.q_offset(b, blk.i0 + r, h), d.D);
          for (std::int64_t j0 = 0; j0 < blk.keys; j0 += key_block) {
            const std::int64_t n = std::min(key_block, blk.keys - j0);
            // P from the saved statistics (0 for keys a row does not see);
            // dP = dO V^T.
            detail::product<T>(blk.rows, n, d.D, sc, q_blk, {ld, 1}, k_head + j0 * ld, {1, ld},
                               p.data(), n, false);
            detail::product<T>(blk.rows, n, d.D, T(1), do_blk, {ld, 1}, v_head + j0 * ld, {1, ld},
                               ds.data(), n, false);
            for (std::int64_t r = 0; r < blk.rows; ++r) {
              T* p_row = p.data() + r * n;
              T* ds_row = ds.data() + r * n;
              // A row that saw no key at all (l = 0) has no gradient.
              const std::int64_t seen =
                  l[r] == T(0)
                      ? 0
                      : std::clamp<std::int64_t>(d.visible_keys(mask, blk.i0 + r) - j0, 0, n);
              const T inv_l = l[r] == T(0) ? T(0) : T(1) / l[r];
              for (std::int64_t c = 0; c < seen; ++c) {
                p_row[c] = std::exp(p_row[c] - m[r]) * inv_l;
                ds_row[c] = sc * p_row[c] * (ds_row[c] - row_dot[r]);  // dS
              }
              std::fill(p_row + seen, p_row + n, T(0));
              std::fill(ds_row + seen, ds_row + n, T(0));
              round_operands(p_row, seen, operands);  // after dS used the unrounded P
              round_operands(ds_row, seen, operands);
            }
            // dV += P^T dO; dQ += dS K; dK += dS^T Q.
            detail::product<T>(n, d.D, blk.rows, T(1), p.data(), {1, n}, do_blk, {ld, 1},
                               dv_head + j0 * ld, ld, true);
            detail::product<T>(blk.rows, d.D, n, T(1), ds.data(), {n, 1}, k_head + j0 * ld, {ld, 1},
                               dq_blk, ld, true);
            detail::product<T>(n, d.D, blk.rows, T(1), ds.data(), {1, n}, q_blk, {ld, 1},
                               dk_head + j0 * ld, ld, true);
          }
        });
      }
    });
  });
}

}  // namespace

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                             Tensor& row_max, Tensor& row_sum, const AttentionMask& mask,
                             double scale, std::int64_t block_size) {
  count_flops(4 * q.numel() * detail::key_count(k));  // S = Q K^T and O = P V
  // The CUDA kernels take bf16 and f16 as they are (tensor cores in the 16-bit type).
  if (q.device().is_cuda())
    return cuda::flash_attention_forward(q, k, v, out, row_max, row_sum, mask, scale, block_size);
  if (detail::is_half(q.dtype())) {
    detail::Widened f32("flash_attention_forward", q.dtype());
    forward(f32.in("q", q), f32.in("k", k), f32.in("v", v), f32.out("out", out),
            f32.out("row_max", row_max), f32.out("row_sum", row_sum), mask, scale, block_size,
            q.dtype());
    return f32.store();
  }
  forward(q, k, v, out, row_max, row_sum, mask, scale, block_size, q.dtype());
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& row_max, const Tensor& row_sum, const Tensor& dout,
                              Tensor& dq, Tensor& dk, Tensor& dv, const AttentionMask& mask,
                              double scale) {
  count_flops(10 * q.numel() * detail::key_count(k));  // S again, dP, dV, dQ and dK
  if (q.device().is_cuda())
    return cuda::flash_attention_backward(q, k, v, out, row_max, row_sum, dout, dq, dk, dv, mask,
                                          scale);
  if (detail::is_half(q.dtype())) {
    detail::Widened f32("flash_attention_backward", q.dtype());
    backward(f32.in("q", q), f32.in("k", k), f32.in("v", v), f32.in("out", out),
             f32.in("row_max", row_max), f32.in("row_sum", row_sum), f32.in("dout", dout),
             f32.out("dq", dq), f32.out("dk", dk), f32.out("dv", dv), mask, scale, q.dtype());
    return f32.store();
  }
  backward(q, k, v, out, row_max, row_sum, dout, dq, dk, dv, mask, scale, q.dtype());
}

void attention_merge(Tensor& out, Tensor& row_max, Tensor& row_sum, const Tensor& other_out,
                     const Tensor& other_max, const Tensor& other_sum) {
  if (detail::is_half(out.dtype())) {
    detail::Widened f32("attention_merge", out.dtype());
    attention_merge(f32.out("out", out), f32.out("row_max", row_max), f32.out("row_sum", row_sum),
                    f32.in("other_out", other_out), f32.in("other_max", other_max),
                    f32.in("other_sum", other_sum));
    return f32.store();
  }
  if (out.device().is_cuda())
    return cuda::attention_merge(out, row_max, row_sum, other_out, other_max, other_sum);
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
