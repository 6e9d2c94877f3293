// FlashAttention-2 for bf16 and f16 with the scores in registers (mma.sync).
//
// The same blocks, tiles and passes as flash_attention_tc.cuh (4 warps of
// 16 rows; the other side 64 rows at a time; forward, dQ, dK/dV without
// atomics), but each warp multiplies with the PTX instruction
// mma.sync.m16n8k16, whose fragment layout the PTX ISA documents: lane L
// holds rows g = L / 4 and g + 8 of a tile, columns 2t and 2t + 1
// (t = L % 4). So the online softmax, the mask and the rescaling of O run
// on the accumulators in registers. The scores never go through shared
// memory, and a probability tile becomes the next product's A operand
// without leaving its lane. That is the register reuse of FlashAttention-2,
// which WMMA cannot express because it hides that layout.
//
// The A operand of a 16 x 16 step is 4 registers of two 16-bit values each:
//   a[0] = (g, 2t..2t+1), a[1] = (g + 8, 2t..), a[2] = (g, 8 + 2t..), a[3] = (g + 8, 8 + 2t..)
// the B operand (16 x 8) is b[0] = rows 2t..2t+1 of column g, b[1] = rows 8 + 2t..;
// the f32 accumulator (16 x 8) is c[0..1] = (g, 2t..2t+1), c[2..3] = (g + 8, 2t..).
// Low 16 bits hold the lower column (or row), as a 32-bit load of two
// neighbouring 16-bit values gives.
//
// The same source runs on the CPU under tests/emulated/cuda_emulator.h,
// whose mma rebuilds the whole matrices from every lane's registers by this
// layout.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda/flash_attention_tc.cuh"

namespace dtp::cuda::flash {

// --- one mma.sync.m16n8k16 and its operands ---------------------------------------

/// d += a b for one 16 x 8 x 16 tile, f32 accumulation.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                          const std::uint32_t (&b)[2]) {
#ifdef DTP_CUDA_EMULATION
  ::dtp::emu::mma_m16n8k16<T>(d, a, b);
#else
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

__device__ __forceinline__ std::uint16_t bits_of(__nv_bfloat16 x) {
  return __bfloat16_as_ushort(x);
}
__device__ __forceinline__ std::uint16_t bits_of(__half x) { return __half_as_ushort(x); }

/// Two 16-bit values in one register, `low` in the low half.
template <typename T>
__device__ __forceinline__ std::uint32_t pack(T low, T high) {
  return static_cast<std::uint32_t>(bits_of(low)) |
         (static_cast<std::uint32_t>(bits_of(high)) << 16);
}
/// Two neighbouring 16-bit values of a shared row (p 4-byte aligned) as one register.
template <typename T>
__device__ __forceinline__ std::uint32_t load_pair(const T* p) {
#ifdef DTP_CUDA_EMULATION
  std::uint32_t v;  // no type punning on the host compiler
  std::memcpy(&v, p, sizeof v);
  return v;
#else
  return *reinterpret_cast<const std::uint32_t*>(p);
#endif
}

struct Lane {
  int g, t;  // the lane's row in a tile (and g + 8), and its pair of columns 2t, 2t + 1
};
__device__ __forceinline__ Lane this_lane() {
  const int lane = static_cast<int>(threadIdx.x % 32);
  return {lane / 4, lane % 4};
}

/// A operand: rows [0, 16) and columns [k0, k0 + 16) of shared rows `pitch` apart.
template <typename T>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const T* rows, int pitch, int k0,
                                       Lane l) {
  a[0] = load_pair(rows + l.g * pitch + k0 + 2 * l.t);
  a[1] = load_pair(rows + (l.g + 8) * pitch + k0 + 2 * l.t);
  a[2] = load_pair(rows + l.g * pitch + k0 + 8 + 2 * l.t);
  a[3] = load_pair(rows + (l.g + 8) * pitch + k0 + 8 + 2 * l.t);
}
/// B operand = X^T for shared rows X (B's column n is X's row n0 + n): rows
/// n0..n0+7 of X, columns k0..k0+15.
template <typename T>
__device__ __forceinline__ void load_b_transposed(std::uint32_t (&b)[2], const T* x, int pitch,
                                                  int n0, int k0, Lane l) {
  b[0] = load_pair(x + (n0 + l.g) * pitch + k0 + 2 * l.t);
  b[1] = load_pair(x + (n0 + l.g) * pitch + k0 + 8 + 2 * l.t);
}
/// B operand = X for shared rows X (B's row k is X's row k0 + k): rows
/// k0..k0+15 of X, columns n0..n0+7.
template <typename T>
__device__ __forceinline__ void load_b(std::uint32_t (&b)[2], const T* x, int pitch, int k0, int n0,
                                       Lane l) {
  const T* column = x + n0 + l.g;
  b[0] = pack(column[(k0 + 2 * l.t) * pitch], column[(k0 + 2 * l.t + 1) * pitch]);
  b[1] = pack(column[(k0 + 8 + 2 * l.t) * pitch], column[(k0 + 9 + 2 * l.t) * pitch]);
}
/// The A operand of keys [16 kk, 16 kk + 16) from the f32 accumulators of a
/// 16 x kCols tile (8 columns per accumulator), rounded to T: the tile stays
/// in its lanes, since an accumulator's (row, column) pairs are the A layout's.
template <typename T>
__device__ __forceinline__ void accumulators_as_a(std::uint32_t (&a)[4],
                                                  const float (&acc)[kCols / 8][4], int kk) {
  const float(&lo)[4] = acc[2 * kk];
  const float(&hi)[4] = acc[2 * kk + 1];
  a[0] = pack(Mma<T>::operand(lo[0]), Mma<T>::operand(lo[1]));
  a[1] = pack(Mma<T>::operand(lo[2]), Mma<T>::operand(lo[3]));
  a[2] = pack(Mma<T>::operand(hi[0]), Mma<T>::operand(hi[1]));
  a[3] = pack(Mma<T>::operand(hi[2]), Mma<T>::operand(hi[3]));
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

/// acc[n] (columns [8 n, 8 n + 8) of a 16 x kCols tile) = A B^T, where A is the
/// warp's 16 shared rows and B the kCols shared rows at `other`, MAXD wide.
template <typename T, int MAXD>
__device__ __forceinline__ void warp_scores(float (&acc)[kCols / 8][4], const T* a_rows,
                                            const T* other, Lane l) {
  zero(acc);
  // The k steps one at a time: the tile's 8 accumulators and the other
  // kernels' registers leave no room for operands of several steps in flight.
#pragma unroll 1
  for (int kk = 0; kk < MAXD / 16; ++kk) {
    std::uint32_t a[4];
    load_a(a, a_rows, kPitch<MAXD>, kk * 16, l);
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
      std::uint32_t b[2];
      load_b_transposed(b, other, kPitch<MAXD>, n * 8, kk * 16, l);
      mma_16816<T>(acc[n], a, b);
    }
  }
}

/// out[d] += W X: W a 16 x kCols tile held in accumulators, X the kCols shared
/// rows at `x`; out[d] holds columns [8 d, 8 d + 8).
template <typename T, int MAXD>
__device__ __forceinline__ void warp_accumulate(float (&out)[MAXD / 8][4],
                                                const float (&w)[kCols / 8][4], const T* x,
                                                Lane l) {
#pragma unroll  // w's tiles are registers: kk must be known at compile time
  for (int kk = 0; kk < kCols / 16; ++kk) {
    std::uint32_t a[4];
    accumulators_as_a<T>(a, w, kk);
#pragma unroll
    for (int d = 0; d < MAXD / 8; ++d) {
      std::uint32_t b[2];
      load_b(b, x, kPitch<MAXD>, kk * 16, d * 8, l);
      mma_16816<T>(out[d], a, b);
    }
  }
}

/// Writes the accumulators of the warp's rows row0 + g and row0 + g + 8 to
/// global rows `stride` apart (those below `rows`, columns below D), times
/// scale[0] and scale[1].
template <typename T, int MAXD>
__device__ __forceinline__ void write_accumulators(T* dst, std::int64_t stride, std::int64_t row0,
                                                   std::int64_t rows, int D,
                                                   const float (&acc)[MAXD / 8][4],
                                                   const float (&scale)[2], Lane l) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::int64_t row = row0 + l.g + 8 * h;
    if (row >= rows) continue;
#pragma unroll
    for (int d = 0; d < MAXD / 8; ++d)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = d * 8 + 2 * l.t + j;
        if (c < D) dst[row * stride + c] = Mma<T>::output(acc[d][2 * h + j] * scale[h]);
      }
  }
}

/// Combines a value over the 4 lanes that share a row (lanes 4g .. 4g + 3).
template <typename Op>
__device__ __forceinline__ float across_row(float v, Op op) {
  v = op(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return op(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// --- the kernels -----------------------------------------------------------------

/// The head dims these kernels take (wider heads run the WMMA ones: their 16
/// accumulator tiles per row set leave no registers for the rest), and when
/// their key gradients take two launches (each pass holds S^T and one
/// gradient's 8 tiles; both at once spill at MAXD 64).
template <int MAXD>
constexpr bool kMmaHeadDim = MAXD <= 64;
template <int MAXD>
constexpr bool kSplitKeyGradsMma = MAXD >= 64;

/// Shared memory of the mma kernels: two tiles of the other side and two
/// sets of the block's own rows, all in the 16-bit type.
template <typename T, int MAXD>
struct MmaShared {
  __host__ __device__ explicit MmaShared(void* base) : arena(base) {
    other0 = arena.take<T>(kCols * kPitch<MAXD>);
    other1 = arena.take<T>(kCols * kPitch<MAXD>);
    own0 = arena.take<T>(kRows * kPitch<MAXD>);
    own1 = arena.take<T>(kRows * kPitch<MAXD>);
    stats = arena.take<float>(3 * kCols);
  }
  SharedArena arena;
  T *other0, *other1;  // forward and dQ: K and V tiles; dK/dV: Q and dO tiles
  T *own0, *own1;      // forward and dQ: Q and dO rows (forward: Q only); dK/dV: K and V rows
  float* stats;        // dK/dV: the query tile's max, 1 / sum, delta
};

template <typename T, int MAXD>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    forward_kernel_mma(const T* q, const T* k, const T* v, T* out, T* row_max, T* row_sum, Dims d,
                       Mask mask) {
  DTP_DYNAMIC_SHARED(float, smem);
  const MmaShared<T, MAXD> sh(smem);
  const Lane l = this_lane();
  const int warp = static_cast<int>(threadIdx.x / 32);
  const auto [b, h, i0, stride, qoff, koff, D] = block_place(d);
  const T* my_q = sh.own0 + warp * 16 * kPitch<MAXD>;
  stage_rows<T, MAXD>(sh.own0, q + qoff, stride, i0, d.Tq, D, kRows);

  // This lane's two query rows: g and g + 8 of its warp's 16.
  const std::int64_t row[2] = {i0 + warp * 16 + l.g, i0 + warp * 16 + l.g + 8};
  const std::int64_t nk[2] = {mask.visible(row[0], d.Tk), mask.visible(row[1], d.Tk)};
  const std::int64_t last_row = (i0 + kRows < d.Tq ? i0 + kRows : d.Tq) - 1;
  const std::int64_t block_nk = mask.visible(last_row, d.Tk);
  float o[MAXD / 8][4];
  zero(o);
  float m[2] = {kNegInf, kNegInf}, sum[2] = {0.f, 0.f};
  for (std::int64_t j0 = 0; j0 < block_nk; j0 += kCols) {
    __syncthreads();  // every warp is done with the previous K and V tiles (and Q is staged)
    stage_rows<T, MAXD>(sh.other0, k + koff, stride, j0, d.Tk, D, kCols);
    stage_rows<T, MAXD>(sh.other1, v + koff, stride, j0, d.Tk, D, kCols);
    __syncthreads();
    float s[kCols / 8][4];
    warp_scores<T, MAXD>(s, my_q, sh.other0, l);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {  // row g, then row g + 8
      float tile_max = kNegInf;
#pragma unroll
      for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float& x = s[n][2 * hh + j];
          x = j0 + n * 8 + 2 * l.t + j < nk[hh] ? d.scale * x : kNegInf;
          tile_max = fmaxf(tile_max, x);
        }
      tile_max = across_row(tile_max, Max{});
      const float m_new = fmaxf(m[hh], tile_max);
      const bool seen = m_new != kNegInf;                         // has this row seen any key yet?
      const float correction = seen ? expf(m[hh] - m_new) : 1.f;  // 0 on the first key seen
      float tile_sum = 0.f;
#pragma unroll
      for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float& x = s[n][2 * hh + j];
          x = seen ? expf(x - m_new) : 0.f;  // 0 for hidden keys (x = -inf)
          tile_sum += x;
        }
      sum[hh] = sum[hh] * correction + across_row(tile_sum, Sum{});
      m[hh] = m_new;
#pragma unroll
      for (int dd = 0; dd < MAXD / 8; ++dd) {
        o[dd][2 * hh] *= correction;
        o[dd][2 * hh + 1] *= correction;
      }
    }
    warp_accumulate<T, MAXD>(o, s, sh.other1, l);  // O += P V, P straight from the score registers
  }
  const float inv[2] = {sum[0] > 0.f ? 1.f / sum[0] : 0.f, sum[1] > 0.f ? 1.f / sum[1] : 0.f};
  write_accumulators<T, MAXD>(out + qoff, stride, i0 + warp * 16, d.Tq, D, o, inv, l);
  if (l.t == 0)
    for (int hh = 0; hh < 2; ++hh)
      if (row[hh] < d.Tq) {
        const std::int64_t stat = (b * d.H + h) * d.Tq + row[hh];
        row_max[stat] = Mma<T>::output(m[hh]);
        row_sum[stat] = Mma<T>::output(sum[hh]);
      }
}

template <typename T, int MAXD>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    dq_kernel_mma(const T* q, const T* k, const T* v, const T* dout, const T* row_max,
                  const T* row_sum, const float* delta, T* dq, Dims d, Mask mask) {
  DTP_DYNAMIC_SHARED(float, smem);
  const MmaShared<T, MAXD> sh(smem);
  const Lane l = this_lane();
  const int warp = static_cast<int>(threadIdx.x / 32);
  const auto [b, h, i0, stride, qoff, koff, D] = block_place(d);
  const T* my_q = sh.own0 + warp * 16 * kPitch<MAXD>;
  const T* my_dout = sh.own1 + warp * 16 * kPitch<MAXD>;
  stage_rows<T, MAXD>(sh.own0, q + qoff, stride, i0, d.Tq, D, kRows);
  stage_rows<T, MAXD>(sh.own1, dout + qoff, stride, i0, d.Tq, D, kRows);

  const std::int64_t row[2] = {i0 + warp * 16 + l.g, i0 + warp * 16 + l.g + 8};
  RowStats st[2];
  std::int64_t nk[2];
  for (int hh = 0; hh < 2; ++hh) {
    st[hh] = row_stats(row_max, row_sum, delta, (b * d.H + h) * d.Tq + row[hh], row[hh] < d.Tq);
    nk[hh] = st[hh].inv_sum > 0.f ? mask.visible(row[hh], d.Tk) : 0;
  }
  const std::int64_t last_row = (i0 + kRows < d.Tq ? i0 + kRows : d.Tq) - 1;
  const std::int64_t block_nk = mask.visible(last_row, d.Tk);
  float acc[MAXD / 8][4];
  zero(acc);
  for (std::int64_t j0 = 0; j0 < block_nk; j0 += kCols) {
    __syncthreads();
    stage_rows<T, MAXD>(sh.other0, k + koff, stride, j0, d.Tk, D, kCols);
    stage_rows<T, MAXD>(sh.other1, v + koff, stride, j0, d.Tk, D, kCols);
    __syncthreads();
    float s[kCols / 8][4], dp[kCols / 8][4];
    warp_scores<T, MAXD>(s, my_q, sh.other0, l);
    warp_scores<T, MAXD>(dp, my_dout, sh.other1, l);
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hh = e / 2;
        const bool live = j0 + n * 8 + 2 * l.t + e % 2 < nk[hh];
        s[n][e] = live
                      ? score_grad(probability(s[n][e], st[hh], d.scale), dp[n][e], st[hh], d.scale)
                      : 0.f;
      }
    warp_accumulate<T, MAXD>(acc, s, sh.other0, l);  // dQ += dS K
  }
  const float one[2] = {1.f, 1.f};
  write_accumulators<T, MAXD>(dq + qoff, stride, i0 + warp * 16, d.Tq, D, acc, one, l);
}

template <typename T, int MAXD, KeyGrads G>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    dkv_kernel_mma(const T* q, const T* k, const T* v, const T* dout, const T* row_max,
                   const T* row_sum, const float* delta, T* dk, T* dv, Dims d, Mask mask) {
  DTP_DYNAMIC_SHARED(float, smem);
  const MmaShared<T, MAXD> sh(smem);
  const Lane l = this_lane();
  const int warp = static_cast<int>(threadIdx.x / 32);
  const BlockPlace at = block_place(d);
  const auto [b, h, j0, stride, qoff, koff, D] = at;
  const T* my_k = sh.own0 + warp * 16 * kPitch<MAXD>;
  const T* my_v = sh.own1 + warp * 16 * kPitch<MAXD>;
  stage_rows<T, MAXD>(sh.own0, k + koff, stride, j0, d.Tk, D, kRows);
  stage_rows<T, MAXD>(sh.own1, v + koff, stride, j0, d.Tk, D, kRows);

  const std::int64_t key[2] = {j0 + warp * 16 + l.g,
                               j0 + warp * 16 + l.g + 8};  // this lane's key rows
  float gk[G == KeyGrads::values ? 1 : MAXD / 8][4], gv[G == KeyGrads::keys ? 1 : MAXD / 8][4];
  zero(gk);
  zero(gv);
  for (std::int64_t i0 = mask.first_row_seeing(j0); i0 < d.Tq; i0 += kCols) {
    __syncthreads();  // every warp is done with the previous Q, dO and statistics (and K, V are
                      // staged)
    stage_query_tile<T, MAXD>(sh.other0, sh.other1, sh.stats, q, dout, row_max, row_sum, delta, d,
                              at, i0);
    __syncthreads();
    float pt[kCols / 8][4],
        dst[kCols / 8][4];  // S^T then P^T; dP^T then dS^T (rows: keys, columns: queries)
    warp_scores<T, MAXD>(pt, my_k, sh.other0, l);
    if constexpr (G != KeyGrads::values) warp_scores<T, MAXD>(dst, my_v, sh.other1, l);
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * l.t + e % 2;  // the query column
        const RowStats st{sh.stats[c], sh.stats[kCols + c], sh.stats[2 * kCols + c]};
        // Rows past Tq have inv_sum 0; hidden keys and keys past Tk fail the mask.
        const bool live = st.inv_sum > 0.f && key[e / 2] < mask.visible(i0 + c, d.Tk);
        const float p = live ? probability(pt[n][e], st, d.scale) : 0.f;
        if constexpr (G != KeyGrads::values)
          dst[n][e] = live ? score_grad(p, dst[n][e], st, d.scale) : 0.f;
        pt[n][e] = p;
      }
    if constexpr (G != KeyGrads::keys)
      warp_accumulate<T, MAXD>(gv, pt, sh.other1, l);  // dV += P^T dO
    if constexpr (G != KeyGrads::values)
      warp_accumulate<T, MAXD>(gk, dst, sh.other0, l);  // dK += dS^T Q
  }
  const float one[2] = {1.f, 1.f};
  if constexpr (G != KeyGrads::values)
    write_accumulators<T, MAXD>(dk + koff, stride, j0 + warp * 16, d.Tk, D, gk, one, l);
  if constexpr (G != KeyGrads::keys)
    write_accumulators<T, MAXD>(dv + koff, stride, j0 + warp * 16, d.Tk, D, gv, one, l);
}

}  // namespace dtp::cuda::flash
