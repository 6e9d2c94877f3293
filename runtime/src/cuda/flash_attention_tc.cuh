// FlashAttention-2 on tensor cores (WMMA), for f32, bf16 and f16 tensors.
//
// Layout: q, out, dq are [B, Tq, H, D] and k, v, dk, dv are [B, Tk, H, D];
// row i of head h in batch b starts at ((b T + i) H + h) D. The statistics
// row_max and row_sum are [B, H, Tq] in the tensors' type; delta is f32.
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
// Products run on tensor cores with f32 accumulation: f32 tensors as TF32
// (16 x 16 x 8; inputs rounded to 10 mantissa bits as they are staged, like
// cuBLAS's TF32 matmuls), bf16 and f16 tensors in their own type
// (16 x 16 x 16, twice the rate, half the shared memory). Scores, the
// softmax and every accumulator are f32; P and dS are rounded to the
// operand type for the next product, as in FlashAttention-2. The score
// tiles go through shared memory, where two lanes per row apply the mask and
// the softmax. The forward keeps O in shared memory as well: its rows are
// rescaled whenever the running max grows, and WMMA does not say which lane
// holds which accumulator element.
//
// The mma.sync kernels for bf16 and f16 (flash_attention_mma.cuh) share
// this file's blocks, masks, shared-memory staging and row statistics.
// The same source runs on the CPU under tests/emulated/cuda_emulator.h.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#ifndef DTP_CUDA_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
constexpr int kPad =
    8;  // elements after each shared row: keeps rows 32-byte aligned, staggers banks
template <int MAXD>
constexpr int kPitch = MAXD + kPad;  // a shared row of head-dim values
constexpr int kScorePitch =
    kCols + kPad;  // a shared row of scores (f32) or of P or dS (operand type)
constexpr float kNegInf = -INFINITY;
// Two blocks per SM lets a thread use up to 255 registers (ptxas otherwise
// settles near 168 and spills the dK/dV kernel at MAXD 128); the shared
// memory of two D = 64 blocks (at most 2 x 111 KB) fits an H100's 228 KB.
constexpr int kMinBlocksPerSm = 2;

/// How a storage type T meets the tensor cores: the operand type staged in
/// shared memory, the WMMA precision and k step, and the rounding on staging.
template <typename T>
struct Mma;
template <>
struct Mma<float> {
  using Operand = float;
  using Precision = wmma::precision::tf32;
  static constexpr int K = 8;
  __device__ static float operand(float x) { return wmma::__float_to_tf32(x); }
  __device__ static float output(float x) { return x; }
};
template <>
struct Mma<__nv_bfloat16> {
  using Operand = __nv_bfloat16;
  using Precision = __nv_bfloat16;
  static constexpr int K = 16;
  __device__ static __nv_bfloat16 operand(float x) { return __float2bfloat16_rn(x); }
  __device__ static __nv_bfloat16 output(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Mma<__half> {
  using Operand = __half;
  using Precision = __half;
  static constexpr int K = 16;
  __device__ static __half operand(float x) { return __float2half_rn(x); }
  __device__ static __half output(float x) { return __float2half_rn(x); }
};

template <typename T>
using Operand = typename Mma<T>::Operand;
template <typename T>
using FragA =
    wmma::fragment<wmma::matrix_a, 16, 16, Mma<T>::K, typename Mma<T>::Precision, wmma::row_major>;
template <typename T>  // B^T: its column n is B's row n, so col-major over B's rows
using FragBT =
    wmma::fragment<wmma::matrix_b, 16, 16, Mma<T>::K, typename Mma<T>::Precision, wmma::col_major>;
template <typename T>
using FragB =
    wmma::fragment<wmma::matrix_b, 16, 16, Mma<T>::K, typename Mma<T>::Precision, wmma::row_major>;
template <typename T>
using FragC = wmma::fragment<wmma::accumulator, 16, 16, Mma<T>::K, float>;

/// Carves a kernel's dynamic shared memory into consecutive arrays; every
/// array starts 32-byte aligned, as WMMA loads and stores require.
class SharedArena {
 public:
  __host__ __device__ explicit SharedArena(void* base)
      : base_(reinterpret_cast<std::uintptr_t>(base)) {}
  template <typename U>
  __host__ __device__ U* take(std::size_t count) {
    U* p = reinterpret_cast<U*>(base_ + used_);
    used_ += (count * sizeof(U) + 31) / 32 * 32;
    return p;
  }
  /// The bytes taken so far.
  __host__ __device__ std::size_t used() const { return used_; }

 private:
  std::uintptr_t base_;
  std::size_t used_ = 0;
};

/// The weights tile (P or dS, operand type) of a score tile: the score tile
/// itself when the operand is f32, its own array otherwise.
template <typename T>
__host__ __device__ Operand<T>* weights_tile(SharedArena& arena, float* scores) {
  if constexpr (std::is_same_v<Operand<T>, float>)
    return scores;
  else
    return arena.take<Operand<T>>(static_cast<std::size_t>(kRows) * kScorePitch);
}

/// Each kernel's shared arrays, in order; the kernel and its launcher both
/// build them, the launcher from a null base to learn the size.
template <typename T, int MAXD>
struct ForwardShared {
  __host__ __device__ explicit ForwardShared(void* base) : arena(base) {
    k = arena.take<Operand<T>>(kCols * kPitch<MAXD>);
    v = arena.take<Operand<T>>(kCols * kPitch<MAXD>);
    q = arena.take<Operand<T>>(kRows * kPitch<MAXD>);
    o = arena.take<float>(kRows * kPitch<MAXD>);
    s = arena.take<float>(kRows * kScorePitch);
    p = weights_tile<T>(arena, s);
  }
  SharedArena arena;
  Operand<T>*k, *v, *q;  // the key and value tiles, the block's query rows
  float *o, *s;          // the output rows (unnormalized), the scores
  Operand<T>* p;         // the probabilities
};
template <typename T, int MAXD>
struct DqShared {
  __host__ __device__ explicit DqShared(void* base) : arena(base) {
    k = arena.take<Operand<T>>(kCols * kPitch<MAXD>);
    v = arena.take<Operand<T>>(kCols * kPitch<MAXD>);
    q = arena.take<Operand<T>>(kRows * kPitch<MAXD>);
    dout = arena.take<Operand<T>>(kRows * kPitch<MAXD>);
    s = arena.take<float>(kRows * kScorePitch);
    dp = arena.take<float>(kRows * kScorePitch);
    ds = weights_tile<T>(arena, s);
  }
  SharedArena arena;
  Operand<T>*k, *v, *q,
      *dout;       // the key and value tiles, the block's query and output-gradient rows
  float *s, *dp;   // the scores and dP
  Operand<T>* ds;  // dS
};
template <typename T, int MAXD>
struct DkvShared {
  __host__ __device__ explicit DkvShared(void* base) : arena(base) {
    q = arena.take<Operand<T>>(kCols * kPitch<MAXD>);
    dout = arena.take<Operand<T>>(kCols * kPitch<MAXD>);
    k = arena.take<Operand<T>>(kRows * kPitch<MAXD>);
    v = arena.take<Operand<T>>(kRows * kPitch<MAXD>);
    st = arena.take<float>(kRows * kScorePitch);
    dpt = arena.take<float>(kRows * kScorePitch);
    pt = weights_tile<T>(arena, st);
    dst = weights_tile<T>(arena, dpt);
    stats = arena.take<float>(3 * kCols);
  }
  SharedArena arena;
  Operand<T>*q, *dout, *k, *v;  // the query and dO tiles, the block's key and value rows
  float *st, *dpt;              // S^T and dP^T
  Operand<T>*pt, *dst;          // P^T and dS^T
  float* stats;                 // [3][kCols]: the query tile's max, 1 / sum, delta
};
/// A kernel's dynamic shared memory in bytes: its arrays laid out from a null base.
template <typename Shared>
std::size_t shared_bytes() {
  return Shared(nullptr).arena.used();
}

/// Stages rows [r0, r0 + count) of a head (rows `stride` apart in global
/// memory, D wide) as operands in shared rows kPitch apart, zero past D and
/// past the last row. All threads of the block take part.
template <typename T, int MAXD>
__device__ __forceinline__ void stage_rows(Operand<T>* dst, const T* src, std::int64_t stride,
                                           std::int64_t r0, std::int64_t rows, int D, int count) {
  for (int idx = threadIdx.x; idx < count * MAXD; idx += kThreads) {
    const int r = idx / MAXD, c = idx % MAXD;
    const float x = (r0 + r < rows && c < D) ? static_cast<float>(src[(r0 + r) * stride + c]) : 0.f;
    dst[r * kPitch<MAXD> + c] = Mma<T>::operand(x);
  }
}

/// out[16][kCols] (kScorePitch apart) = A B^T, where A is the warp's 16
/// shared rows and B the kCols shared rows at `other` (both kPitch apart).
/// Up to MAXD 64 the four column blocks accumulate together (A is loaded
/// once per k step); wider heads do one block at a time, which keeps 24 fewer
/// registers live next to the dK/dV kernel's accumulators.
template <typename T, int MAXD>
__device__ __forceinline__ void warp_scores(float* out, const Operand<T>* a_rows,
                                            const Operand<T>* other) {
  constexpr int K = Mma<T>::K;
  if constexpr (MAXD > 64) {
#pragma unroll 1
    for (int n = 0; n < kCols / 16; ++n) {
      FragC<T> c;
      wmma::fill_fragment(c, 0.f);
#pragma unroll 2
      for (int kk = 0; kk < MAXD / K; ++kk) {
        FragA<T> a;
        FragBT<T> b;
        wmma::load_matrix_sync(a, a_rows + kk * K, kPitch<MAXD>);
        wmma::load_matrix_sync(b, other + n * 16 * kPitch<MAXD> + kk * K, kPitch<MAXD>);
        wmma::mma_sync(c, a, b, c);
      }
      wmma::store_matrix_sync(out + n * 16, c, kScorePitch, wmma::mem_row_major);
    }
  } else {
    FragC<T> c[kCols / 16];
#pragma unroll
    for (int n = 0; n < kCols / 16; ++n) wmma::fill_fragment(c[n], 0.f);
#pragma unroll 2
    for (int kk = 0; kk < MAXD / K; ++kk) {
      FragA<T> a;
      wmma::load_matrix_sync(a, a_rows + kk * K, kPitch<MAXD>);
#pragma unroll
      for (int n = 0; n < kCols / 16; ++n) {
        FragBT<T> b;
        wmma::load_matrix_sync(b, other + n * 16 * kPitch<MAXD> + kk * K, kPitch<MAXD>);
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
template <typename T, int MAXD>
__device__ __forceinline__ void warp_accumulate(FragC<T> (&acc)[MAXD / 16], const Operand<T>* w,
                                                const Operand<T>* x) {
  constexpr int K = Mma<T>::K;
#pragma unroll 2
  for (int kk = 0; kk < kCols / K; ++kk) {
    FragA<T> a;
    wmma::load_matrix_sync(a, w + kk * K, kScorePitch);
#pragma unroll
    for (int n = 0; n < MAXD / 16; ++n) {
      FragB<T> b;
      wmma::load_matrix_sync(b, x + kk * K * kPitch<MAXD> + n * 16, kPitch<MAXD>);
      wmma::mma_sync(acc[n], a, b, acc[n]);
    }
  }
}

/// Writes the warp's 16 x MAXD accumulators to global rows [row0, row0 + 16)
/// (those below `rows`), one 16 x 16 block at a time through the warp's
/// f32 scratch rows (kScorePitch apart).
template <typename T, int MAXD>
__device__ __forceinline__ void write_rows(T* dst, std::int64_t stride, std::int64_t row0,
                                           std::int64_t rows, int D,
                                           const FragC<T> (&acc)[MAXD / 16], float* scratch) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < MAXD / 16; ++n) {
    __syncwarp();  // every lane is done reading what the scratch rows held
    wmma::store_matrix_sync(scratch, acc[n], kScorePitch, wmma::mem_row_major);
    __syncwarp();
    for (int idx = lane; idx < 16 * 16; idx += 32) {
      const int r = idx / 16, c = n * 16 + idx % 16;
      if (row0 + r < rows && c < D)
        dst[(row0 + r) * stride + c] = Mma<T>::output(scratch[r * kScorePitch + idx % 16]);
    }
  }
}

/// Where a block works: batch b, head h, its first row (a multiple of
/// kRows: query rows in the forward and dQ, key rows in dK/dV), the distance
/// between consecutive rows of a head, and where the head's rows start in
/// the query-side and key-side tensors.
struct BlockPlace {
  std::int64_t b, h, row0, stride, qoff, koff;
  int D;
};
__device__ __forceinline__ BlockPlace block_place(const Dims& d) {
  const std::int64_t b = blockIdx.z, h = blockIdx.y;
  return {b,
          h,
          static_cast<std::int64_t>(blockIdx.x) * kRows,
          d.H * d.D,
          (b * d.Tq * d.H + h) * d.D,
          (b * d.Tk * d.H + h) * d.D,
          static_cast<int>(d.D)};
}

// Lanes 2r and 2r + 1 of a warp handle its row r in the element-wise steps,
// each half of the kCols columns.
__device__ __forceinline__ int my_row() { return (threadIdx.x % 32) / 2; }
__device__ __forceinline__ int my_half() { return threadIdx.x % 2; }

template <typename T, int MAXD>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    forward_kernel(const T* q, const T* k, const T* v, T* out, T* row_max, T* row_sum, Dims d,
                   Mask mask) {
  constexpr int P = kPitch<MAXD>;
  DTP_DYNAMIC_SHARED(float, smem);
  const ForwardShared<T, MAXD> sh(smem);
  const int warp = threadIdx.x / 32, r = my_row(), half = my_half();
  const auto [b, h, i0, stride, qoff, koff, D] = block_place(d);
  const Operand<T>* my_q = sh.q + warp * 16 * P;
  float* my_o = sh.o + warp * 16 * P;
  float* my_s = sh.s + warp * 16 * kScorePitch;
  const Operand<T>* my_p = sh.p + warp * 16 * kScorePitch;

  stage_rows<T, MAXD>(sh.q, q + qoff, stride, i0, d.Tq, D, kRows);

  const std::int64_t i = i0 + warp * 16 + r;
  const std::int64_t nk = mask.visible(i, d.Tk);
  const std::int64_t last_row = (i0 + kRows < d.Tq ? i0 + kRows : d.Tq) - 1;
  const std::int64_t block_nk = mask.visible(last_row, d.Tk);  // visibility grows with i
  float m = kNegInf, l = 0.f;  // this row's running max and sum (both lanes of the row keep them)
  float* srow = my_s + r * kScorePitch + half * (kCols / 2);
  Operand<T>* prow = sh.p + (warp * 16 + r) * kScorePitch + half * (kCols / 2);
  float* orow = my_o + r * P + half * (MAXD / 2);  // this lane's half of its output row
  for (int c = 0; c < MAXD / 2; ++c) orow[c] = 0.f;
  for (std::int64_t j0 = 0; j0 < block_nk; j0 += kCols) {
    __syncthreads();  // every warp is done with the previous K and V tiles (and Q is staged)
    stage_rows<T, MAXD>(sh.k, k + koff, stride, j0, d.Tk, D, kCols);
    stage_rows<T, MAXD>(sh.v, v + koff, stride, j0, d.Tk, D, kCols);
    __syncthreads();
    warp_scores<T, MAXD>(my_s, my_q, sh.k);
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
    const bool seen = m_new != kNegInf;                     // has this row seen any key yet?
    const float correction = seen ? expf(m - m_new) : 1.f;  // 0 on the first key seen
    float sum = 0.f;
#pragma unroll 4
    for (int c = 0; c < kCols / 2; ++c) {
      const float p = seen ? expf(srow[c] - m_new) : 0.f;  // 0 for hidden keys (s = -inf)
      sum += p;
      prow[c] = Mma<T>::operand(p);  // in place over srow for f32
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * correction + sum;
    m = m_new;
    for (int c = 0; c < MAXD / 2; ++c) orow[c] *= correction;
    __syncwarp();
    FragC<T> acc[MAXD / 16];
#pragma unroll
    for (int n = 0; n < MAXD / 16; ++n)
      wmma::load_matrix_sync(acc[n], my_o + n * 16, P, wmma::mem_row_major);
    warp_accumulate<T, MAXD>(acc, my_p, sh.v);
#pragma unroll
    for (int n = 0; n < MAXD / 16; ++n)
      wmma::store_matrix_sync(my_o + n * 16, acc[n], P, wmma::mem_row_major);
    __syncwarp();
  }
  if (i >= d.Tq) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that saw no key outputs zeros
  T* o = out + qoff + i * stride + half * (MAXD / 2);
  for (int c = 0; c < MAXD / 2; ++c)
    if (half * (MAXD / 2) + c < D) o[c] = Mma<T>::output(orow[c] * inv);
  if (half == 0) {
    const std::int64_t stat = (b * d.H + h) * d.Tq + i;
    row_max[stat] = Mma<T>::output(m);
    row_sum[stat] = Mma<T>::output(l);
  }
}

/// A query row's saved statistics, read for the backward.
struct RowStats {
  float max, inv_sum, delta;  // inv_sum 0: the row saw no key and gets no gradient
};
template <typename T>
__device__ __forceinline__ RowStats row_stats(const T* row_max, const T* row_sum,
                                              const float* delta, std::int64_t stat,
                                              bool in_range) {
  const float sum = in_range ? static_cast<float>(row_sum[stat]) : 0.f;
  return sum > 0.f ? RowStats{static_cast<float>(row_max[stat]), 1.f / sum, delta[stat]}
                   : RowStats{0.f, 0.f, 0.f};
}

/// P = exp(scale S - max) / sum, recomputed from a score and its row's statistics.
__device__ __forceinline__ float probability(float s, const RowStats& st, float scale) {
  return expf(scale * s - st.max) * st.inv_sum;
}
/// dS = scale P (dP - delta): the softmax backward of one score.
__device__ __forceinline__ float score_grad(float p, float dp, const RowStats& st, float scale) {
  return scale * p * (dp - st.delta);
}

/// What a dK/dV kernel reads for one tile of query rows [i0, i0 + kCols):
/// the rows and their output gradients as operands, and their statistics
/// in stats[3][kCols] (max, 1 / sum, delta). All threads of the block take part.
template <typename T, int MAXD>
__device__ __forceinline__ void stage_query_tile(Operand<T>* q_tile, Operand<T>* dout_tile,
                                                 float* stats, const T* q, const T* dout,
                                                 const T* row_max, const T* row_sum,
                                                 const float* delta, const Dims& d,
                                                 const BlockPlace& at, std::int64_t i0) {
  stage_rows<T, MAXD>(q_tile, q + at.qoff, at.stride, i0, d.Tq, at.D, kCols);
  stage_rows<T, MAXD>(dout_tile, dout + at.qoff, at.stride, i0, d.Tq, at.D, kCols);
  for (int c = threadIdx.x; c < kCols; c += kThreads) {
    const RowStats st =
        row_stats(row_max, row_sum, delta, (at.b * d.H + at.h) * d.Tq + i0 + c, i0 + c < d.Tq);
    stats[c] = st.max;
    stats[kCols + c] = st.inv_sum;
    stats[2 * kCols + c] = st.delta;
  }
}

template <typename T, int MAXD>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    dq_kernel(const T* q, const T* k, const T* v, const T* dout, const T* row_max, const T* row_sum,
              const float* delta, T* dq, Dims d, Mask mask) {
  constexpr int P = kPitch<MAXD>;
  DTP_DYNAMIC_SHARED(float, smem);
  const DqShared<T, MAXD> sh(smem);
  const int warp = threadIdx.x / 32, r = my_row(), half = my_half();
  const auto [b, h, i0, stride, qoff, koff, D] = block_place(d);
  float* my_s = sh.s + warp * 16 * kScorePitch;
  float* my_dp = sh.dp + warp * 16 * kScorePitch;

  stage_rows<T, MAXD>(sh.q, q + qoff, stride, i0, d.Tq, D, kRows);
  stage_rows<T, MAXD>(sh.dout, dout + qoff, stride, i0, d.Tq, D, kRows);

  const std::int64_t i = i0 + warp * 16 + r;
  const RowStats st = row_stats(row_max, row_sum, delta, (b * d.H + h) * d.Tq + i, i < d.Tq);
  const std::int64_t nk = st.inv_sum > 0.f ? mask.visible(i, d.Tk) : 0;
  const std::int64_t last_row = (i0 + kRows < d.Tq ? i0 + kRows : d.Tq) - 1;
  const std::int64_t block_nk = mask.visible(last_row, d.Tk);
  FragC<T> acc[MAXD / 16];
#pragma unroll
  for (int n = 0; n < MAXD / 16; ++n) wmma::fill_fragment(acc[n], 0.f);
  const float* srow = my_s + r * kScorePitch + half * (kCols / 2);
  const float* dprow = my_dp + r * kScorePitch + half * (kCols / 2);
  Operand<T>* dsrow = sh.ds + (warp * 16 + r) * kScorePitch + half * (kCols / 2);
  for (std::int64_t j0 = 0; j0 < block_nk; j0 += kCols) {
    __syncthreads();
    stage_rows<T, MAXD>(sh.k, k + koff, stride, j0, d.Tk, D, kCols);
    stage_rows<T, MAXD>(sh.v, v + koff, stride, j0, d.Tk, D, kCols);
    __syncthreads();
    warp_scores<T, MAXD>(my_s, sh.q + warp * 16 * P, sh.k);
    warp_scores<T, MAXD>(my_dp, sh.dout + warp * 16 * P, sh.v);
    __syncwarp();
    const std::int64_t j_first = j0 + half * (kCols / 2);
#pragma unroll 4
    for (int c = 0; c < kCols / 2; ++c) {
      const float ds = j_first + c < nk
                           ? score_grad(probability(srow[c], st, d.scale), dprow[c], st, d.scale)
                           : 0.f;
      dsrow[c] = Mma<T>::operand(ds);  // in place over srow for f32
    }
    __syncwarp();
    warp_accumulate<T, MAXD>(acc, sh.ds + warp * 16 * kScorePitch, sh.k);  // dQ += dS K
  }
  write_rows<T, MAXD>(dq + qoff, stride, i0 + warp * 16, d.Tq, D, acc, my_s);
}

/// Which key gradients a dkv_kernel launch computes. Up to MAXD 64 one
/// launch does both; wider heads take two launches (the 2 x MAXD / 16
/// accumulator fragments alone would need 128 of a thread's 255 registers).
enum class KeyGrads { both, values, keys };
template <int MAXD>
constexpr bool kSplitKeyGrads = MAXD > 64;
/// Calls launch(std::integral_constant<KeyGrads, G>{}) for each launch of a
/// dK/dV kernel that the key gradients take: one (both), or two when split.
template <bool Split, typename Launch>
void for_each_key_grads_launch(Launch&& launch) {
  if constexpr (Split) {
    launch(std::integral_constant<KeyGrads, KeyGrads::values>{});
    launch(std::integral_constant<KeyGrads, KeyGrads::keys>{});
  } else {
    launch(std::integral_constant<KeyGrads, KeyGrads::both>{});
  }
}

template <typename T, int MAXD, KeyGrads G>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    dkv_kernel(const T* q, const T* k, const T* v, const T* dout, const T* row_max,
               const T* row_sum, const float* delta, T* dk, T* dv, Dims d, Mask mask) {
  constexpr int P = kPitch<MAXD>;
  DTP_DYNAMIC_SHARED(float, smem);
  const DkvShared<T, MAXD> sh(smem);
  const int warp = threadIdx.x / 32, r = my_row(), half = my_half();
  const BlockPlace at = block_place(d);
  const auto [b, h, j0, stride, qoff, koff, D] = at;
  float* my_st = sh.st + warp * 16 * kScorePitch;
  float* my_dpt = sh.dpt + warp * 16 * kScorePitch;

  stage_rows<T, MAXD>(sh.k, k + koff, stride, j0, d.Tk, D, kRows);
  stage_rows<T, MAXD>(sh.v, v + koff, stride, j0, d.Tk, D, kRows);

  const std::int64_t j = j0 + warp * 16 + r;  // this lane's key row
  FragC<T> gk[G == KeyGrads::values ? 1 : MAXD / 16], gv[G == KeyGrads::keys ? 1 : MAXD / 16];
  for (FragC<T>& f : gk) wmma::fill_fragment(f, 0.f);
  for (FragC<T>& f : gv) wmma::fill_fragment(f, 0.f);
  const float* strow = my_st + r * kScorePitch + half * (kCols / 2);
  const float* dptrow = my_dpt + r * kScorePitch + half * (kCols / 2);
  Operand<T>* prow = sh.pt + (warp * 16 + r) * kScorePitch + half * (kCols / 2);
  Operand<T>* dsrow = sh.dst + (warp * 16 + r) * kScorePitch + half * (kCols / 2);
  for (std::int64_t i0 = mask.first_row_seeing(j0); i0 < d.Tq; i0 += kCols) {
    __syncthreads();  // every warp is done with the previous Q, dO and statistics (and K, V are
                      // staged)
    stage_query_tile<T, MAXD>(sh.q, sh.dout, sh.stats, q, dout, row_max, row_sum, delta, d, at, i0);
    __syncthreads();
    warp_scores<T, MAXD>(my_st, sh.k + warp * 16 * P, sh.q);  // S^T = K Q^T
    if constexpr (G != KeyGrads::values)
      warp_scores<T, MAXD>(my_dpt, sh.v + warp * 16 * P, sh.dout);  // dP^T = V dO^T
    __syncwarp();
#pragma unroll 4
    for (int c = 0; c < kCols / 2; ++c) {
      const int ii = half * (kCols / 2) + c;
      const std::int64_t i = i0 + ii;
      const RowStats st{sh.stats[ii], sh.stats[kCols + ii], sh.stats[2 * kCols + ii]};
      // Rows past Tq have inv_sum 0; hidden keys and keys past Tk fail the mask.
      const bool live = st.inv_sum > 0.f && j < mask.visible(i, d.Tk);
      const float p = live ? probability(strow[c], st, d.scale) : 0.f;
      if constexpr (G != KeyGrads::values)
        dsrow[c] = Mma<T>::operand(live ? score_grad(p, dptrow[c], st, d.scale) : 0.f);
      prow[c] = Mma<T>::operand(p);  // in place over strow for f32
    }
    __syncwarp();
    if constexpr (G != KeyGrads::keys)
      warp_accumulate<T, MAXD>(gv, sh.pt + warp * 16 * kScorePitch, sh.dout);  // dV += P^T dO
    if constexpr (G != KeyGrads::values)
      warp_accumulate<T, MAXD>(gk, sh.dst + warp * 16 * kScorePitch, sh.q);  // dK += dS^T Q
  }
  if constexpr (G != KeyGrads::values)
    write_rows<T, MAXD>(dk + koff, stride, j0 + warp * 16, d.Tk, D, gk, my_st);
  if constexpr (G != KeyGrads::keys)
    write_rows<T, MAXD>(dv + koff, stride, j0 + warp * 16, d.Tk, D, gv, my_st);
}

/// delta[b, h, i] = dO_i . O_i (= rowsum(P * dP)), in f32.
template <typename T>
__global__ void row_dot_kernel(const T* dout, const T* out, float* delta, Dims d) {
  const std::int64_t rows = d.B * d.H * d.Tq;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = r % d.Tq, bh = r / d.Tq, h = bh % d.H, b = bh / d.H;
    const std::int64_t o = ((b * d.Tq + i) * d.H + h) * d.D;
    float s = 0;
    for (std::int64_t c = 0; c < d.D; ++c)
      s += static_cast<float>(dout[o + c]) * static_cast<float>(out[o + c]);
    delta[r] = s;
  }
}

}  // namespace dtp::cuda::flash
