// Flash attention in exact f32 on CUDA cores, for f32 tensors when TF32 is
// off (DTP_TF32=0): every product and sum is an f32 operation (2^-24 per
// rounding), as on the CPU. The tensor-core kernels instead round their
// operands to TF32 (2^-11).
//
// The layout, Dims, Mask, blocks and row statistics are those of
// flash_attention_tc.cuh. One thread owns one row, a query row in the
// forward and dQ, a key row in dK/dV, so a block of kExactThreads threads
// owns kRows rows as the tensor-core blocks do. Each thread walks the other
// side one row at a time, in order, keeps its output row in registers (MAXD
// floats) and writes it once:
//   forward  s = scale q . k_j, online softmax (max m, sum l), o = o * correction + p v_j
//   dQ       p = exp(s - m) / l, dp = dO . v_j, dS = scale p (dp - delta), dq += dS k_j
//   dK, dV   over the query rows i that see the key: dv += p dO_i, dk += dS q_i
// No shared memory, barriers or atomics: the sums run in one fixed order, so
// two runs give the same bits. Memory is O(T): the T x T scores never exist.
// The rows are read from global memory; a row of the other side is read by
// every thread of a block at about the same time, which the cache serves.
//
// dK and dV hold 2 MAXD accumulators per thread: heads wider than 64 take two
// launches (dV, then dK, as kSplitKeyGrads says), so no thread keeps more
// than 128 of them in registers.
// The same source runs on the CPU under tests/emulated/cuda_emulator.h.
#pragma once

#include <cstdint>

#include "cuda/flash_attention_tc.cuh"

namespace dtp::cuda::flash {

/// Threads of an exact kernel's block: one per row of its kRows rows.
constexpr int kExactThreads = kRows;

/// x . y over a head's D values, in column order.
__device__ __forceinline__ float dot_row(const float* x, const float* y, int D) {
  float s = 0.f;
  for (int c = 0; c < D; ++c) s += x[c] * y[c];
  return s;
}

/// acc += a x over a head's D values (acc is MAXD registers; columns past D stay 0).
template <int MAXD>
__device__ __forceinline__ void add_scaled_row(float (&acc)[MAXD], float a, const float* x, int D) {
#pragma unroll
  for (int c = 0; c < MAXD; ++c)
    if (c < D) acc[c] += a * x[c];
}

/// dst = acc over a head's D values.
template <int MAXD>
__device__ __forceinline__ void store_row(float* dst, const float (&acc)[MAXD], int D) {
#pragma unroll
  for (int c = 0; c < MAXD; ++c)
    if (c < D) dst[c] = acc[c];
}

template <int MAXD>
__global__ void forward_kernel_exact(const float* q, const float* k, const float* v, float* out,
                                     float* row_max, float* row_sum, Dims d, Mask mask) {
  const auto [b, h, i0, stride, qoff, koff, D] = block_place(d);
  const std::int64_t i = i0 + threadIdx.x;
  if (i >= d.Tq) return;
  const float* q_row = q + qoff + i * stride;
  const std::int64_t nk = mask.visible(i, d.Tk);
  float m = kNegInf, l = 0.f;  // the running max and sum
  float o[MAXD] = {};          // the output row, unnormalized
  for (std::int64_t j = 0; j < nk; ++j) {
    const float s = d.scale * dot_row(q_row, k + koff + j * stride, D);
    if (s > m) {  // a new max: rescale what is summed so far (by 0 at the first key)
      const float correction = expf(m - s);
      l *= correction;
#pragma unroll
      for (int c = 0; c < MAXD; ++c) o[c] *= correction;
      m = s;
    }
    const float p = expf(s - m);
    l += p;
    add_scaled_row<MAXD>(o, p, v + koff + j * stride, D);
  }
  // A row that sees no key outputs zeros, with max -inf and sum 0.
  if (l > 0.f) {
#pragma unroll
    for (int c = 0; c < MAXD; ++c) o[c] /= l;
  }
  store_row<MAXD>(out + qoff + i * stride, o, D);
  const std::int64_t stat = (b * d.H + h) * d.Tq + i;
  row_max[stat] = m;
  row_sum[stat] = l;
}

template <int MAXD>
__global__ void dq_kernel_exact(const float* q, const float* k, const float* v, const float* dout,
                                const float* row_max, const float* row_sum, const float* delta,
                                float* dq, Dims d, Mask mask) {
  const auto [b, h, i0, stride, qoff, koff, D] = block_place(d);
  const std::int64_t i = i0 + threadIdx.x;
  if (i >= d.Tq) return;
  const RowStats st = row_stats(row_max, row_sum, delta, (b * d.H + h) * d.Tq + i, true);
  // A row that saw no key (inv_sum 0) gets no gradient.
  const std::int64_t nk = st.inv_sum > 0.f ? mask.visible(i, d.Tk) : 0;
  const float* q_row = q + qoff + i * stride;
  const float* do_row = dout + qoff + i * stride;
  float g[MAXD] = {};
  for (std::int64_t j = 0; j < nk; ++j) {
    const float* k_row = k + koff + j * stride;
    const float p = probability(dot_row(q_row, k_row, D), st, d.scale);
    const float ds = score_grad(p, dot_row(do_row, v + koff + j * stride, D), st, d.scale);
    add_scaled_row<MAXD>(g, ds, k_row, D);  // dQ += dS K
  }
  store_row<MAXD>(dq + qoff + i * stride, g, D);
}

template <int MAXD, KeyGrads G>
__global__ void dkv_kernel_exact(const float* q, const float* k, const float* v, const float* dout,
                                 const float* row_max, const float* row_sum, const float* delta,
                                 float* dk, float* dv, Dims d, Mask mask) {
  const auto [b, h, j0, stride, qoff, koff, D] = block_place(d);
  const std::int64_t j = j0 + threadIdx.x;  // this thread's key row
  if (j >= d.Tk) return;
  const float* k_row = k + koff + j * stride;
  const float* v_row = v + koff + j * stride;
  float gk[G == KeyGrads::values ? 1 : MAXD] = {}, gv[G == KeyGrads::keys ? 1 : MAXD] = {};
  for (std::int64_t i = mask.first_row_seeing(j); i < d.Tq; ++i) {
    const RowStats st = row_stats(row_max, row_sum, delta, (b * d.H + h) * d.Tq + i, true);
    // Rows that saw no key (inv_sum 0) or do not see this one give nothing.
    if (st.inv_sum == 0.f || j >= mask.visible(i, d.Tk)) continue;
    const float* q_row = q + qoff + i * stride;
    const float* do_row = dout + qoff + i * stride;
    const float p = probability(dot_row(q_row, k_row, D), st, d.scale);
    if constexpr (G != KeyGrads::keys) add_scaled_row<MAXD>(gv, p, do_row, D);  // dV += P^T dO
    if constexpr (G != KeyGrads::values) {
      const float ds = score_grad(p, dot_row(do_row, v_row, D), st, d.scale);
      add_scaled_row<MAXD>(gk, ds, q_row, D);  // dK += dS^T Q
    }
  }
  if constexpr (G != KeyGrads::values) store_row<MAXD>(dk + koff + j * stride, gk, D);
  if constexpr (G != KeyGrads::keys) store_row<MAXD>(dv + koff + j * stride, gv, D);
}

}  // namespace dtp::cuda::flash
