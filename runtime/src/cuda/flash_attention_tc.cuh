// FlashAttention-2 on tensor cores (TF32 WMMA), f32 in and out.
//
// Layout: q, out, dq are [B, Tq, H, D] and k, v, dk, dv are [B, Tk, H, D];
// row i of head h in batch b starts at ((b T + i) H + h) D. The statistics
// row_max, row_sum and delta are [B, H, Tq].
//
// A block is 4 warps; each warp owns 16 rows, so a block owns 64 query rows
// (forward, dQ) or 64 key rows (dK, dV), and walks the other side 64 rows
// at a time through shared memory:
//   forward  S = Q K^T, online softmax, O = O * correction + P V
//   dQ       S, dP = dO V^T, dS = scale P (dP - delta), dQ += dS K
//   dK, dV   S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q
// so each output row is written by exactly one block: no atomics, and the
// result does not depend on scheduling.
//
// Every product is a 16 x 16 x 8 TF32 WMMA with f32 accumulation. The score
// tiles go through shared memory, where two lanes per row apply the mask and
// the softmax. The forward keeps O in shared memory as well: its rows are
// rescaled whenever the running max grows, and which lane holds which
// accumulator element is unspecified in WMMA. Inputs are rounded to TF32 as
// they are staged (10 mantissa bits, like cuBLAS's TF32 matmuls); bf16 and
// f16 values are exact in TF32.
//
// The same source runs on the CPU under tests/emulated/cuda_emulator.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#ifndef DTP_CUDA_EMULATION
#include <mma.h>
#define DTP_DYNAMIC_SHARED(type, name) extern __shared__ __align__(128) type name[]
#endif

namespace dtp::cuda::flash {

struct Dims {
  std::int64_t B, Tq, Tk, H, D;
  float scale;
};

struct Mask {
  bool causal;
  std::int64_t q_start, k_start;
  // Keys [0, visible(i)) are visible to query row i.
  __host__ __device__ std::int64_t visible(std::int64_t i, std::int64_t Tk) const {
    if (!causal) return Tk;
    const std::int64_t n = q_start + i - k_start + 1;
    return n < 0 ? 0 : (n > Tk ? Tk : n);
  }
  // The first query row that sees key j (visibility only grows with i).
  __host__ __device__ std::int64_t first_row_seeing(std::int64_t j) const {
    if (!causal) return 0;
    const std::int64_t i = j + k_start - q_start;
    return i < 0 ? 0 : i;
  }
};

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // rows a block owns
constexpr int kCols = 64;           // rows of the other side per step
constexpr int kPad = 8;             // floats after each shared row: keeps rows 32-byte aligned, staggers banks
template <int MAXD>
constexpr int kPitch = MAXD + kPad;  // a shared row of head-dim values
constexpr int kScorePitch = kCols + kPad;  // a shared row of scores
constexpr float kNegInf = -INFINITY;
// Two blocks per SM lets a thread use up to 255 registers (ptxas otherwise
// settles near 168 and spills the dK/dV kernel at MAXD 128); the shared
// memory of two D = 64 blocks (at most 2 x 111 KB) fits an H100's 228 KB.
constexpr int kMinBlocksPerSm = 2;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

/// Shared memory of each kernel, in bytes: the other side's two tiles, the
/// block's own two row sets (Q and O; Q and dO; K and V) and score tiles.
template <int MAXD>
constexpr std::size_t forward_shared_bytes() {
  return sizeof(float) * ((2 * kCols + 2 * kRows) * kPitch<MAXD> + kRows * kScorePitch);
}
template <int MAXD>
constexpr std::size_t dq_shared_bytes() {  // and dP
  return sizeof(float) * ((2 * kCols + 2 * kRows) * kPitch<MAXD> + 2 * kRows * kScorePitch);
}
template <int MAXD>
constexpr std::size_t dkv_shared_bytes() {  // and dP^T and the query tile's three statistics
  return sizeof(float) * ((2 * kCols + 2 * kRows) * kPitch<MAXD> + 2 * kRows * kScorePitch + 3 * kCols);
}

__device__ __forceinline__ float to_tf32(float x) { return wmma::__float_to_tf32(x); }

/// Stages rows [r0, r0 + count) of a head (rows `stride` apart in global
/// memory, D wide) as TF32 in shared rows kPitch apart, zero past D and past
/// the last row. All threads of the block take part.
template <int MAXD>
__device__ __forceinline__ void stage_rows(float* dst, const float* src, std::int64_t stride, std::int64_t r0,
                                           std::int64_t rows, int D, int count) {
  for (int idx = threadIdx.x; idx < count * MAXD; idx += kThreads) {
    const int r = idx / MAXD, c = idx % MAXD;
    dst[r * kPitch<MAXD> + c] = (r0 + r < rows && c < D) ? to_tf32(src[(r0 + r) * stride + c]) : 0.f;
  }
}

/// out[16][kCols] (kScorePitch apart) = A B^T, where A is the warp's 16
/// shared rows and B the kCols shared rows at `other` (both kPitch apart).
/// Up to MAXD 64 the four column blocks accumulate together (A is loaded
/// once per k step); wider heads do one block at a time, which keeps 24 fewer
/// registers live next to the dK/dV kernel's 128 registers of accumulators.
template <int MAXD>
__device__ __forceinline__ void warp_scores(float* out, const float* a_rows, const float* other) {
  if constexpr (MAXD > 64) {
#pragma unroll 1
    for (int n = 0; n < kCols / 16; ++n) {
      FragC c;
      wmma::fill_fragment(c, 0.f);
#pragma unroll 2
      for (int kk = 0; kk < MAXD / 8; ++kk) {
        FragA a;
        FragBT b;
        wmma::load_matrix_sync(a, a_rows + kk * 8, kPitch<MAXD>);
        wmma::load_matrix_sync(b, other + n * 16 * kPitch<MAXD> + kk * 8, kPitch<MAXD>);
        wmma::mma_sync(c, a, b, c);
      }
      wmma::store_matrix_sync(out + n * 16, c, kScorePitch, wmma::mem_row_major);
    }
  } else {
    FragC c[kCols / 16];
#pragma unroll
    for (int n = 0; n < kCols / 16; ++n) wmma::fill_fragment(c[n], 0.f);
#pragma unroll 2
    for (int kk = 0; kk < MAXD / 8; ++kk) {
      FragA a;
      wmma::load_matrix_sync(a, a_rows + kk * 8, kPitch<MAXD>);
#pragma unroll
      for (int n = 0; n < kCols / 16; ++n) {
        FragBT b;  // B^T's column n is B's row n: col-major over B's rows
        wmma::load_matrix_sync(b, other + n * 16 * kPitch<MAXD> + kk * 8, kPitch<MAXD>);
        wmma::mma_sync(c[n], a, b, c[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < kCols / 16; ++n)
      wmma::store_matrix_sync(out + n * 16, c[n], kScorePitch, wmma::mem_row_major);
  }
}

/// acc += W X, where W is the warp's [16][kCols] weights (kScorePitch apart)
/// and X the kCols shared rows at `x`; acc[n] holds output columns [16 n, 16 n + 16).
template <int MAXD>
__device__ __forceinline__ void warp_accumulate(FragC (&acc)[MAXD / 16], const float* w, const float* x) {
#pragma unroll 2
  for (int kk = 0; kk < kCols / 8; ++kk) {
    FragA a;
    wmma::load_matrix_sync(a, w + kk * 8, kScorePitch);
#pragma unroll
    for (int n = 0; n < MAXD / 16; ++n) {
      FragB b;
      wmma::load_matrix_sync(b, x + kk * 8 * kPitch<MAXD> + n * 16, kPitch<MAXD>);
      wmma::mma_sync(acc[n], a, b, acc[n]);
    }
  }
}

/// Writes the warp's 16 x MAXD accumulators to global rows [row0, row0 + 16)
/// (those below `rows`), through the warp's 16 shared staging rows.
template <int MAXD>
__device__ __forceinline__ void write_rows(float* dst, std::int64_t stride, std::int64_t row0, std::int64_t rows,
                                           int D, const FragC (&acc)[MAXD / 16], float* staging) {
  __syncwarp();  // every lane is done reading whatever the staging rows held
#pragma unroll
  for (int n = 0; n < MAXD / 16; ++n)
    wmma::store_matrix_sync(staging + n * 16, acc[n], kPitch<MAXD>, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32;
  for (int idx = lane; idx < 16 * MAXD; idx += 32) {
    const int r = idx / MAXD, c = idx % MAXD;
    if (row0 + r < rows && c < D) dst[(row0 + r) * stride + c] = staging[r * kPitch<MAXD> + c];
  }
  __syncwarp();  // the staging rows are read before anyone reuses them
}

// Lanes 2r and 2r + 1 of a warp handle its row r in the element-wise steps,
// each half of the kCols columns.
__device__ __forceinline__ int my_row() { return (threadIdx.x % 32) / 2; }
__device__ __forceinline__ int my_half() { return threadIdx.x % 2; }

template <int MAXD>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) forward_kernel(const float* q, const float* k, const float* v,
                                                           float* out, float* row_max, float* row_sum, Dims d,
                                                           Mask mask) {
  constexpr int P = kPitch<MAXD>;
  DTP_DYNAMIC_SHARED(float, smem);
  float* ks = smem;            // [kCols][P] key tile
  float* vs = ks + kCols * P;  // [kCols][P] value tile
  float* qs = vs + kCols * P;  // [kRows][P] the block's query rows
  float* os = qs + kRows * P;  // [kRows][P] their output rows (unnormalized)
  float* ss = os + kRows * P;  // [kRows][kScorePitch] scores, then probabilities
  const int warp = threadIdx.x / 32, r = my_row(), half = my_half();
  const std::int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const std::int64_t stride = d.H * d.D, qoff = (b * d.Tq * d.H + h) * d.D, koff = (b * d.Tk * d.H + h) * d.D;
  const int D = static_cast<int>(d.D);
  const float* my_qs = qs + warp * 16 * P;
  float* my_os = os + warp * 16 * P;
  float* my_ss = ss + warp * 16 * kScorePitch;

  stage_rows<MAXD>(qs, q + qoff, stride, i0, d.Tq, D, kRows);

  const std::int64_t i = i0 + warp * 16 + r;
  const std::int64_t nk = mask.visible(i, d.Tk);
  const std::int64_t last_row = (i0 + kRows < d.Tq ? i0 + kRows : d.Tq) - 1;
  const std::int64_t block_nk = mask.visible(last_row, d.Tk);  // visibility grows with i
  float m = kNegInf, l = 0.f;  // this row's running max and sum (both lanes of the row keep them)
  float* srow = my_ss + r * kScorePitch + half * (kCols / 2);
  float* orow = my_os + r * P + half * (MAXD / 2);  // this lane's half of its output row
  for (int c = 0; c < MAXD / 2; ++c) orow[c] = 0.f;
  for (std::int64_t j0 = 0; j0 < block_nk; j0 += kCols) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    stage_rows<MAXD>(ks, k + koff, stride, j0, d.Tk, D, kCols);
    stage_rows<MAXD>(vs, v + koff, stride, j0, d.Tk, D, kCols);
    __syncthreads();
    warp_scores<MAXD>(my_ss, my_qs, ks);
    __syncwarp();
    const std::int64_t j_first = j0 + half * (kCols / 2);
    float tile_max = kNegInf;
#pragma unroll 4
    for (int c = 0; c < kCols / 2; ++c) {
      const float s = j_first + c < nk ? d.scale * srow[c] : kNegInf;
      srow[c] = s;
      tile_max = fmaxf(tile_max, s);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const bool seen = m_new != kNegInf;  // has this row seen any key yet?
    const float correction = seen ? expf(m - m_new) : 1.f;  // 0 on the first key seen
    float sum = 0.f;
#pragma unroll 4
    for (int c = 0; c < kCols / 2; ++c) {
      const float p = seen ? expf(srow[c] - m_new) : 0.f;  // 0 for hidden keys (s = -inf)
      sum += p;
      srow[c] = to_tf32(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * correction + sum;
    m = m_new;
    for (int c = 0; c < MAXD / 2; ++c) orow[c] *= correction;
    __syncwarp();
    FragC acc[MAXD / 16];
#pragma unroll
    for (int n = 0; n < MAXD / 16; ++n) wmma::load_matrix_sync(acc[n], my_os + n * 16, P, wmma::mem_row_major);
    warp_accumulate<MAXD>(acc, my_ss, vs);
#pragma unroll
    for (int n = 0; n < MAXD / 16; ++n) wmma::store_matrix_sync(my_os + n * 16, acc[n], P, wmma::mem_row_major);
    __syncwarp();
  }
  if (i >= d.Tq) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that saw no key outputs zeros
  float* o = out + qoff + i * stride + half * (MAXD / 2);
  for (int c = 0; c < MAXD / 2; ++c)
    if (half * (MAXD / 2) + c < D) o[c] = orow[c] * inv;
  if (half == 0) {
    const std::int64_t stat = (b * d.H + h) * d.Tq + i;
    row_max[stat] = m;
    row_sum[stat] = l;
  }
}

/// A query row's saved statistics, read for the backward.
struct RowStats {
  float max, inv_sum, delta;  // inv_sum 0: the row saw no key and gets no gradient
};
__device__ __forceinline__ RowStats row_stats(const float* row_max, const float* row_sum, const float* delta,
                                              std::int64_t stat, bool in_range) {
  const bool live = in_range && row_sum[in_range ? stat : 0] > 0.f;
  return live ? RowStats{row_max[stat], 1.f / row_sum[stat], delta[stat]} : RowStats{0.f, 0.f, 0.f};
}

/// P = exp(scale S - max) / sum, recomputed from a score and its row's statistics.
__device__ __forceinline__ float probability(float s, const RowStats& st, float scale) {
  return expf(scale * s - st.max) * st.inv_sum;
}
/// dS = scale P (dP - delta): the softmax backward of one score.
__device__ __forceinline__ float score_grad(float p, float dp, const RowStats& st, float scale) {
  return scale * p * (dp - st.delta);
}

template <int MAXD>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) dq_kernel(const float* q, const float* k, const float* v,
                                                      const float* dout, const float* row_max,
                                                      const float* row_sum, const float* delta, float* dq, Dims d,
                                                      Mask mask) {
  constexpr int P = kPitch<MAXD>;
  DTP_DYNAMIC_SHARED(float, smem);
  float* ks = smem;                       // [kCols][P] key tile
  float* vs = ks + kCols * P;             // [kCols][P] value tile
  float* qs = vs + kCols * P;             // [kRows][P] the block's query rows, then dQ on its way out
  float* dos = qs + kRows * P;            // [kRows][P] their output gradients
  float* ss = dos + kRows * P;            // [kRows][kScorePitch] scores, then dS
  float* dps = ss + kRows * kScorePitch;  // [kRows][kScorePitch] dP
  const int warp = threadIdx.x / 32, r = my_row(), half = my_half();
  const std::int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const std::int64_t stride = d.H * d.D, qoff = (b * d.Tq * d.H + h) * d.D, koff = (b * d.Tk * d.H + h) * d.D;
  const int D = static_cast<int>(d.D);
  float* my_qs = qs + warp * 16 * P;
  const float* my_dos = dos + warp * 16 * P;
  float* my_ss = ss + warp * 16 * kScorePitch;
  float* my_dps = dps + warp * 16 * kScorePitch;

  stage_rows<MAXD>(qs, q + qoff, stride, i0, d.Tq, D, kRows);
  stage_rows<MAXD>(dos, dout + qoff, stride, i0, d.Tq, D, kRows);

  const std::int64_t i = i0 + warp * 16 + r;
  const RowStats st = row_stats(row_max, row_sum, delta, (b * d.H + h) * d.Tq + i, i < d.Tq);
  const std::int64_t nk = st.inv_sum > 0.f ? mask.visible(i, d.Tk) : 0;
  const std::int64_t last_row = (i0 + kRows < d.Tq ? i0 + kRows : d.Tq) - 1;
  const std::int64_t block_nk = mask.visible(last_row, d.Tk);
  FragC acc[MAXD / 16];
#pragma unroll
  for (int n = 0; n < MAXD / 16; ++n) wmma::fill_fragment(acc[n], 0.f);
  float* srow = my_ss + r * kScorePitch + half * (kCols / 2);
  const float* dprow = my_dps + r * kScorePitch + half * (kCols / 2);
  for (std::int64_t j0 = 0; j0 < block_nk; j0 += kCols) {
    __syncthreads();
    stage_rows<MAXD>(ks, k + koff, stride, j0, d.Tk, D, kCols);
    stage_rows<MAXD>(vs, v + koff, stride, j0, d.Tk, D, kCols);
    __syncthreads();
    warp_scores<MAXD>(my_ss, my_qs, ks);
    warp_scores<MAXD>(my_dps, my_dos, vs);
    __syncwarp();
    const std::int64_t j_first = j0 + half * (kCols / 2);
#pragma unroll 4
    for (int c = 0; c < kCols / 2; ++c)
      srow[c] = j_first + c < nk ? to_tf32(score_grad(probability(srow[c], st, d.scale), dprow[c], st, d.scale)) : 0.f;
    __syncwarp();
    warp_accumulate<MAXD>(acc, my_ss, ks);  // dQ += dS K
  }
  write_rows<MAXD>(dq + qoff, stride, i0 + warp * 16, d.Tq, D, acc, my_qs);
}

/// Which key gradients a dkv_kernel launch computes. Up to MAXD 64 one
/// launch does both; wider heads take two launches (the 2 x MAXD / 16
/// accumulator fragments alone would need 128 of a thread's 255 registers).
enum class KeyGrads { both, values, keys };
template <int MAXD>
constexpr bool kSplitKeyGrads = MAXD > 64;
/// Calls launch(std::integral_constant<KeyGrads, G>{}) for each launch of
/// dkv_kernel<MAXD, G> that the key gradients take.
template <int MAXD, typename Launch>
void for_each_key_grads_launch(Launch&& launch) {
  if constexpr (kSplitKeyGrads<MAXD>) {
    launch(std::integral_constant<KeyGrads, KeyGrads::values>{});
    launch(std::integral_constant<KeyGrads, KeyGrads::keys>{});
  } else {
    launch(std::integral_constant<KeyGrads, KeyGrads::both>{});
  }
}

template <int MAXD, KeyGrads G>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) dkv_kernel(const float* q, const float* k, const float* v,
                                                       const float* dout, const float* row_max,
                                                       const float* row_sum, const float* delta, float* dk,
                                                       float* dv, Dims d, Mask mask) {
  constexpr int P = kPitch<MAXD>;
  DTP_DYNAMIC_SHARED(float, smem);
  float* qs = smem;                         // [kCols][P] query tile
  float* dos = qs + kCols * P;              // [kCols][P] dO tile
  float* ks = dos + kCols * P;              // [kRows][P] the block's key rows, then dK and dV on their way out
  float* vs = ks + kRows * P;               // [kRows][P] their value rows
  float* sts = vs + kRows * P;              // [kRows][kScorePitch] S^T, then P^T
  float* dpts = sts + kRows * kScorePitch;  // [kRows][kScorePitch] dP^T, then dS^T
  float* stats = dpts + kRows * kScorePitch;  // [3][kCols] the query tile's max, 1 / sum, delta
  const int warp = threadIdx.x / 32, r = my_row(), half = my_half();
  const std::int64_t b = blockIdx.z, h = blockIdx.y, j0 = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const std::int64_t stride = d.H * d.D, qoff = (b * d.Tq * d.H + h) * d.D, koff = (b * d.Tk * d.H + h) * d.D;
  const int D = static_cast<int>(d.D);
  float* my_ks = ks + warp * 16 * P;
  const float* my_vs = vs + warp * 16 * P;
  float* my_sts = sts + warp * 16 * kScorePitch;
  float* my_dpts = dpts + warp * 16 * kScorePitch;

  stage_rows<MAXD>(ks, k + koff, stride, j0, d.Tk, D, kRows);
  stage_rows<MAXD>(vs, v + koff, stride, j0, d.Tk, D, kRows);

  const std::int64_t j = j0 + warp * 16 + r;  // this lane's key row
  FragC gk[G == KeyGrads::values ? 1 : MAXD / 16], gv[G == KeyGrads::keys ? 1 : MAXD / 16];
  for (FragC& f : gk) wmma::fill_fragment(f, 0.f);
  for (FragC& f : gv) wmma::fill_fragment(f, 0.f);
  float* strow = my_sts + r * kScorePitch + half * (kCols / 2);
  float* dptrow = my_dpts + r * kScorePitch + half * (kCols / 2);
  for (std::int64_t i0 = mask.first_row_seeing(j0); i0 < d.Tq; i0 += kCols) {
    __syncthreads();  // every warp is done with the previous Q, dO and statistics
    stage_rows<MAXD>(qs, q + qoff, stride, i0, d.Tq, D, kCols);
    stage_rows<MAXD>(dos, dout + qoff, stride, i0, d.Tq, D, kCols);
    for (int t = threadIdx.x; t < kCols; t += kThreads) {
      const RowStats st = row_stats(row_max, row_sum, delta, (b * d.H + h) * d.Tq + i0 + t, i0 + t < d.Tq);
      stats[t] = st.max;
      stats[kCols + t] = st.inv_sum;
      stats[2 * kCols + t] = st.delta;
    }
    __syncthreads();
    warp_scores<MAXD>(my_sts, my_ks, qs);                                  // S^T = K Q^T
    if constexpr (G != KeyGrads::values) warp_scores<MAXD>(my_dpts, my_vs, dos);  // dP^T = V dO^T
    __syncwarp();
#pragma unroll 4
    for (int c = 0; c < kCols / 2; ++c) {
      const int ii = half * (kCols / 2) + c;
      const std::int64_t i = i0 + ii;
      const RowStats st{stats[ii], stats[kCols + ii], stats[2 * kCols + ii]};
      // Rows past Tq have inv_sum 0; hidden keys and keys past Tk fail the mask.
      const bool live = st.inv_sum > 0.f && j < mask.visible(i, d.Tk);
      const float p = live ? probability(strow[c], st, d.scale) : 0.f;
      if constexpr (G != KeyGrads::values) dptrow[c] = live ? to_tf32(score_grad(p, dptrow[c], st, d.scale)) : 0.f;
      strow[c] = to_tf32(p);
    }
    __syncwarp();
    if constexpr (G != KeyGrads::keys) warp_accumulate<MAXD>(gv, my_sts, dos);    // dV += P^T dO
    if constexpr (G != KeyGrads::values) warp_accumulate<MAXD>(gk, my_dpts, qs);  // dK += dS^T Q
  }
  if constexpr (G != KeyGrads::values) write_rows<MAXD>(dk + koff, stride, j0 + warp * 16, d.Tk, D, gk, my_ks);
  if constexpr (G != KeyGrads::keys) write_rows<MAXD>(dv + koff, stride, j0 + warp * 16, d.Tk, D, gv, my_ks);
}

}  // namespace dtp::cuda::flash
