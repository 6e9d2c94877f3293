// The CPU matmul's fast path (the contract is in gemm.h).
//
// Blocking as in GotoBLAS / BLIS, kept small:
//  - B is packed once per call into panels of NR columns (zero-padded), in
//    K tiles of KC rows: a panel tile (KC x NR) is read by the kernel.
//  - Rows of C go MR at a time; their slice of op(A) is packed, pre-scaled by
//    alpha, into a KC x MR strip that stays in L1 across all panels.
//  - The micro-kernel keeps an MR x NR tile of C in vector registers for a
//    whole K tile: 12 accumulators, so per k it loads 2 vectors of B,
//    broadcasts 6 values of A and does 12 multiplies and 12 adds, where the
//    plain loop did a load and a store of C for every multiply.
//  - The MR-row blocks are split over the rank's compute threads; a block's
//    arithmetic never depends on which thread runs it.
// Each element still gets its products added one at a time in k order, as
// the definition does, so the two agree bitwise.
//
// One kernel source, compiled for three vector widths: NR is two vectors, so
// 8 floats on the baseline (SSE2 or NEON), 16 with AVX2, 32 with AVX-512.
// The widest the CPU runs is picked once, at the first call. Multiplies and
// adds stay separate instructions: on AMD Zen they issue to separate pipes,
// so a fused multiply-add would not be faster there, and every machine
// computes the same bits (on Intel cores, where the two share ports, this
// costs up to half the peak).
#include "cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "dtp/error.h"
#include "dtp/parallel.h"

namespace dtp::cpu {

namespace {

constexpr int kMR = 6;             // rows of C per micro-tile
constexpr std::int64_t kKC = 256;  // k per tile

// The vector of one instruction set: Bytes wide, NR = two of them.
template <typename T, int Bytes>
struct Lanes {
  typedef T Vector __attribute__((vector_size(Bytes)));
  static constexpr int kWidth = Bytes / static_cast<int>(sizeof(T));
  static constexpr int kNR = 2 * kWidth;  // columns of C per micro-tile
};

// The products must not be fused into the sums (gemm.h): this file is built
// with -ffp-contract=off, and no instruction set below enables FMA.
template <typename T, int Bytes, int MR>
[[gnu::always_inline]] inline void full_tile(std::int64_t kc, const T* __restrict a_strip,
                                             const T* __restrict b_panel, T* __restrict tile,
                                             std::int64_t ld, bool from_zero) {
  using V = typename Lanes<T, Bytes>::Vector;
  constexpr int W = Lanes<T, Bytes>::kWidth, NR = Lanes<T, Bytes>::kNR;
  // One array, unrolled loops: GCC keeps all of it in registers (two arrays
  // of 6 got two of their vectors spilled to the stack with AVX-512).
  V acc[2 * MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (from_zero) {
      acc[2 * r] = V{};
      acc[2 * r + 1] = V{};
    } else {
      std::memcpy(&acc[2 * r], tile + r * ld, sizeof(V));
      std::memcpy(&acc[2 * r + 1], tile + r * ld + W, sizeof(V));
    }
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    V b0, b1;
    std::memcpy(&b0, b_panel + k * NR, sizeof(V));
    std::memcpy(&b1, b_panel + k * NR + W, sizeof(V));
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const T a = a_strip[k * kMR + r];  // the strip is kMR wide for every block
      acc[2 * r] += a * b0;
      acc[2 * r + 1] += a * b1;
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    std::memcpy(tile + r * ld, &acc[2 * r], sizeof(V));
    std::memcpy(tile + r * ld + W, &acc[2 * r + 1], sizeof(V));
  }
}

template <typename T, int Bytes, int MR>
[[gnu::always_inline]] inline void micro_tile(std::int64_t kc, const T* __restrict a_strip,
                                              const T* __restrict b_panel, T* C, std::int64_t ldc,
                                              int columns, bool from_zero) {
  constexpr int NR = Lanes<T, Bytes>::kNR;
  if (columns == NR) return full_tile<T, Bytes, MR>(kc, a_strip, b_panel, C, ldc, from_zero);
  // A tile on the right edge goes through a full-width copy.
  alignas(64) T edge[MR * NR];
  if (!from_zero)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) edge[r * NR + j] = j < columns ? C[r * ldc + j] : T(0);
  full_tile<T, Bytes, MR>(kc, a_strip, b_panel, edge, NR, from_zero);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < columns; ++j) C[r * ldc + j] = edge[r * NR + j];
}

// One MR-row block of C over one K tile: every panel of packed B.
template <typename T, int Bytes, int MR>
[[gnu::always_inline]] inline void row_block(std::int64_t N, std::int64_t kc, const T* a_strip,
                                             const T* b_tile, T* C, std::int64_t ldc,
                                             bool from_zero) {
  constexpr int NR = Lanes<T, Bytes>::kNR;
  for (std::int64_t j0 = 0, p = 0; j0 < N; j0 += NR, ++p)
    micro_tile<T, Bytes, MR>(kc, a_strip, b_tile + p * kc * NR, C + j0, ldc,
                             static_cast<int>(std::min<std::int64_t>(NR, N - j0)), from_zero);
}

// Rows [i_begin, i_end) of C, all of K.
template <typename T, int Bytes>
[[gnu::always_inline]] inline void rows_of_c(std::int64_t i_begin, std::int64_t i_end,
                                             std::int64_t N, std::int64_t K, T alpha, const T* A,
                                             Strides a, const T* b_packed, Output<T> C) {
  constexpr int NR = Lanes<T, Bytes>::kNR;
  const std::int64_t panels = (N + NR - 1) / NR;
  alignas(64) T a_strip[kKC * kMR];
  for (std::int64_t i0 = i_begin; i0 < i_end; i0 += kMR) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kMR, i_end - i0));
    for (std::int64_t k0 = 0; k0 < K; k0 += kKC) {
      const std::int64_t kc = std::min(kKC, K - k0);
      for (std::int64_t k = 0; k < kc; ++k)
        for (int r = 0; r < kMR; ++r)
          a_strip[k * kMR + r] = r < rows ? alpha * A[(i0 + r) * a.row + (k0 + k) * a.col] : T(0);
      const T* b_tile = b_packed + k0 * panels * NR;
      T* c = C.data + i0 * C.ld;
      const bool from_zero = !C.accumulate && k0 == 0;  // later K tiles add to the first
      // A block of fewer than kMR rows (the last) reads its first rows of the strip.
      switch (rows) {
        case 6:
          row_block<T, Bytes, 6>(N, kc, a_strip, b_tile, c, C.ld, from_zero);
          break;
        case 5:
          row_block<T, Bytes, 5>(N, kc, a_strip, b_tile, c, C.ld, from_zero);
          break;
        case 4:
          row_block<T, Bytes, 4>(N, kc, a_strip, b_tile, c, C.ld, from_zero);
          break;
        case 3:
          row_block<T, Bytes, 3>(N, kc, a_strip, b_tile, c, C.ld, from_zero);
          break;
        case 2:
          row_block<T, Bytes, 2>(N, kc, a_strip, b_tile, c, C.ld, from_zero);
          break;
        default:
          row_block<T, Bytes, 1>(N, kc, a_strip, b_tile, c, C.ld, from_zero);
          break;
      }
    }
  }
}

// B's K tiles, each as panels of NR columns, zero-padded on the right.
// Whole panels are copied along B's contiguous direction: row by row when B's
// rows are contiguous, column by column when it is transposed (a weight).
template <typename T, int NR>
void pack_b(std::int64_t N, std::int64_t K, const T* B, Strides b, std::vector<T>& packed) {
  const std::int64_t panels = (N + NR - 1) / NR;
  packed.resize(static_cast<std::size_t>(K * panels * NR));
  T* out = packed.data();
  for (std::int64_t k0 = 0; k0 < K; k0 += kKC) {
    const std::int64_t kc = std::min(kKC, K - k0);
    for (std::int64_t p = 0; p < panels; ++p, out += kc * NR) {
      const T* from = B + k0 * b.row + p * NR * b.col;
      const std::int64_t columns = std::min<std::int64_t>(NR, N - p * NR);
      if (columns == NR && b.col == 1) {
        for (std::int64_t k = 0; k < kc; ++k)
          std::memcpy(out + k * NR, from + k * b.row, sizeof(T) * NR);
      } else if (columns == NR && b.row == 1) {
        for (int j = 0; j < NR; ++j)
          for (std::int64_t k = 0; k < kc; ++k) out[k * NR + j] = from[j * b.col + k];
      } else {
        for (std::int64_t k = 0; k < kc; ++k)
          for (int j = 0; j < NR; ++j)
            out[k * NR + j] = j < columns ? from[k * b.row + j * b.col] : T(0);
      }
    }
  }
}

// One entry per instruction set (cpu/isa.h). The kernel templates above have
// no target of their own, so they are compiled inside each entry for its set.
template <typename T>
using RowsOfC = void (*)(std::int64_t, std::int64_t, std::int64_t, std::int64_t, T, const T*,
                         Strides, const T*, Output<T>);

template <typename T>
void rows_baseline(std::int64_t i_begin, std::int64_t i_end, std::int64_t N, std::int64_t K,
                   T alpha, const T* A, Strides a, const T* b_packed, Output<T> C) {
  rows_of_c<T, 16>(i_begin, i_end, N, K, alpha, A, a, b_packed, C);
}

#ifdef DTP_CPU_DISPATCH
template <typename T>
[[gnu::target("avx2")]] void rows_avx2(std::int64_t i_begin, std::int64_t i_end, std::int64_t N,
                                       std::int64_t K, T alpha, const T* A, Strides a,
                                       const T* b_packed, Output<T> C) {
  rows_of_c<T, 32>(i_begin, i_end, N, K, alpha, A, a, b_packed, C);
}

template <typename T>
[[gnu::target("avx512f")]] void rows_avx512(std::int64_t i_begin, std::int64_t i_end,
                                            std::int64_t N, std::int64_t K, T alpha, const T* A,
                                            Strides a, const T* b_packed, Output<T> C) {
  rows_of_c<T, 64>(i_begin, i_end, N, K, alpha, A, a, b_packed, C);
}
#endif

template <typename T, int Bytes>
void gemm_packed(std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, Strides a,
                 const T* B, Strides b, Output<T> C, RowsOfC<T> rows) {
  constexpr int NR = Lanes<T, Bytes>::kNR;
  thread_local std::vector<T> b_packed;  // kept: the same shapes come back every step
  pack_b<T, NR>(N, K, B, b, b_packed);
  const T* packed = b_packed.data();
  // Parts of whole kMR-row blocks, each worth at least ~1 M multiply-adds,
  // so a small matmul stays on the calling thread.
  const std::int64_t blocks = (M + kMR - 1) / kMR;
  const std::int64_t min_blocks =
      std::max<std::int64_t>(1, (std::int64_t{1} << 20) / std::max<std::int64_t>(1, kMR * N * K));
  parallel_for(blocks, min_blocks, [&](std::int64_t first, std::int64_t last) {
    rows(first * kMR, std::min(M, last * kMR), N, K, alpha, A, a, packed, C);
  });
}

template <typename T>
void gemm_on(VectorIsa isa, std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A,
             Strides a, const T* B, Strides b, Output<T> C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // no products: C stays, or becomes zero
    if (!C.accumulate)
      for (std::int64_t i = 0; i < M; ++i)
        std::fill(C.data + i * C.ld, C.data + i * C.ld + N, T(0));
    return;
  }
  DTP_CHECK(C.ld >= N, "cpu::gemm: C's rows are ", C.ld, " elements apart but hold ", N);
  DTP_CHECK(isa == fastest_isa() || cpu_runs(isa), "cpu::gemm: this CPU does not run the ",
            to_string(isa), " instruction set");
  switch (isa) {
#ifdef DTP_CPU_DISPATCH
    case VectorIsa::avx512:
      return gemm_packed<T, 64>(M, N, K, alpha, A, a, B, b, C, rows_avx512<T>);
    case VectorIsa::avx2:
      return gemm_packed<T, 32>(M, N, K, alpha, A, a, B, b, C, rows_avx2<T>);
#endif
    default:
      return gemm_packed<T, 16>(M, N, K, alpha, A, a, B, b, C, rows_baseline<T>);
  }
}

// The widest set this CPU runs whose tile (two vectors) fits in N columns.
template <typename T>
VectorIsa isa_for(std::int64_t N) {
  const VectorIsa widest = fastest_isa();
  if (widest == VectorIsa::avx512 && N >= Lanes<T, 64>::kNR) return VectorIsa::avx512;
  if (widest != VectorIsa::baseline && N >= Lanes<T, 32>::kNR) return VectorIsa::avx2;
  return VectorIsa::baseline;
}

}  // namespace

void gemm(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, Strides a,
          const float* B, Strides b, Output<float> C, VectorIsa isa) {
  gemm_on(isa, M, N, K, alpha, A, a, B, b, C);
}

void gemm(std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A, Strides a,
          const double* B, Strides b, Output<double> C, VectorIsa isa) {
  gemm_on(isa, M, N, K, alpha, A, a, B, b, C);
}

void gemm(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, Strides a,
          const float* B, Strides b, Output<float> C) {
  gemm_on(isa_for<float>(N), M, N, K, alpha, A, a, B, b, C);
}

void gemm(std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A, Strides a,
          const double* B, Strides b, Output<double> C) {
  gemm_on(isa_for<double>(N), M, N, K, alpha, A, a, B, b, C);
}

}  // namespace dtp::cpu
