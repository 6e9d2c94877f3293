// The CPU matmul's fast path (the contract is in gemm.h).
//
// Blocking as in GotoBLAS / BLIS, kept small:
//  - B is packed once per call into panels of NR columns (zero-padded), in
//    K tiles of KC rows: a panel tile (KC x NR) is read from L1 by the kernel.
//  - Rows of C go MR at a time; their slice of op(A) is packed, pre-scaled by
//    alpha, into a KC x MR strip that stays in L1 across all panels.
//  - The micro-kernel keeps an MR x NR tile of C in vector registers for a
//    whole K tile: 12 accumulators of 8 floats, so per k it loads 2 vectors
//    of B, broadcasts 6 values of A and does 12 multiplies and 12 adds,
//    where the plain loop did a load and a store of C for every multiply.
//  - The MR-row blocks are split over the rank's compute threads; a block's
//    arithmetic never depends on which thread runs it.
// Each element still gets its products added one at a time in k order, as
// the definition does, so the two agree bitwise.
#include "cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "dtp/parallel.h"

namespace dtp::cpu {

namespace {

constexpr int kMR = 6;               // rows of C per micro-tile
constexpr std::int64_t kKC = 256;    // k per tile: a panel tile is 256 x 16 floats = 16 KiB
constexpr int kVectorBytes = 32;     // one AVX2 register (two SSE registers in the baseline clone)

template <typename T>
struct Lanes {
  typedef T Vector __attribute__((vector_size(kVectorBytes)));
  static constexpr int kWidth = kVectorBytes / static_cast<int>(sizeof(T));
  static constexpr int kNR = 2 * kWidth;  // columns of C per micro-tile
};

// The products must not be fused into the sums (gemm.h): this file is built
// with -ffp-contract=off, and no clone targets FMA.
template <typename T, int MR>
[[gnu::always_inline]] inline void micro_tile(std::int64_t kc, const T* __restrict a_strip,
                                              const T* __restrict b_panel, T* C, std::int64_t ldc,
                                              int columns) {
  using V = typename Lanes<T>::Vector;
  constexpr int W = Lanes<T>::kWidth, NR = Lanes<T>::kNR;
  // A tile on the right edge goes through a full-width copy.
  alignas(64) T edge[MR * NR];
  T* tile = C;
  std::int64_t ld = ldc;
  if (columns < NR) {
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) edge[r * NR + j] = j < columns ? C[r * ldc + j] : T(0);
    tile = edge;
    ld = NR;
  }
  V acc0[MR], acc1[MR];
  for (int r = 0; r < MR; ++r) {
    std::memcpy(&acc0[r], tile + r * ld, sizeof(V));
    std::memcpy(&acc1[r], tile + r * ld + W, sizeof(V));
  }
  for (std::int64_t k = 0; k < kc; ++k) {
    V b0, b1;
    std::memcpy(&b0, b_panel + k * NR, sizeof(V));
    std::memcpy(&b1, b_panel + k * NR + W, sizeof(V));
    for (int r = 0; r < MR; ++r) {
      const T a = a_strip[k * kMR + r];  // the strip is kMR wide for every block
      const V p0 = a * b0, p1 = a * b1;
      acc0[r] = acc0[r] + p0;
      acc1[r] = acc1[r] + p1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    std::memcpy(tile + r * ld, &acc0[r], sizeof(V));
    std::memcpy(tile + r * ld + W, &acc1[r], sizeof(V));
  }
  if (columns < NR)
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < columns; ++j) C[r * ldc + j] = edge[r * NR + j];
}

// One MR-row block of C over one K tile: every panel of packed B.
template <typename T, int MR>
[[gnu::always_inline]] inline void row_block(std::int64_t N, std::int64_t kc, const T* a_strip,
                                             const T* b_tile, T* C) {
  constexpr int NR = Lanes<T>::kNR;
  for (std::int64_t j0 = 0, p = 0; j0 < N; j0 += NR, ++p)
    micro_tile<T, MR>(kc, a_strip, b_tile + p * kc * NR, C + j0, N,
                      static_cast<int>(std::min<std::int64_t>(NR, N - j0)));
}

// Rows [i_begin, i_end) of C, all of K.
template <typename T>
[[gnu::always_inline]] inline void rows_of_c(std::int64_t i_begin, std::int64_t i_end, std::int64_t N,
                                             std::int64_t K, T alpha, const T* A, Strides a,
                                             const T* b_packed, T* C) {
  constexpr int NR = Lanes<T>::kNR;
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
      T* c = C + i0 * N;
      // A block of fewer than kMR rows (the last) reads its first rows of the strip.
      switch (rows) {
        case 6: row_block<T, 6>(N, kc, a_strip, b_tile, c); break;
        case 5: row_block<T, 5>(N, kc, a_strip, b_tile, c); break;
        case 4: row_block<T, 4>(N, kc, a_strip, b_tile, c); break;
        case 3: row_block<T, 3>(N, kc, a_strip, b_tile, c); break;
        case 2: row_block<T, 2>(N, kc, a_strip, b_tile, c); break;
        default: row_block<T, 1>(N, kc, a_strip, b_tile, c); break;
      }
    }
  }
}

// B's K tiles, each as panels of NR columns, zero-padded on the right.
template <typename T>
void pack_b(std::int64_t N, std::int64_t K, const T* B, Strides b, std::vector<T>& packed) {
  constexpr int NR = Lanes<T>::kNR;
  const std::int64_t panels = (N + NR - 1) / NR;
  packed.resize(static_cast<std::size_t>(K * panels * NR));
  T* out = packed.data();
  for (std::int64_t k0 = 0; k0 < K; k0 += kKC) {
    const std::int64_t kc = std::min(kKC, K - k0);
    for (std::int64_t p = 0; p < panels; ++p)
      for (std::int64_t k = 0; k < kc; ++k)
        for (int j = 0; j < NR; ++j, ++out) {
          const std::int64_t col = p * NR + j;
          *out = col < N ? B[(k0 + k) * b.row + col * b.col] : T(0);
        }
  }
}

// One clone per instruction set, picked when the program loads: AVX2 where
// the CPU has it. No clone enables FMA, so every machine computes the same
// bits. Not under ThreadSanitizer: it instruments the ifunc resolver that
// picks the clone, which runs before TSan is ready, and crashes it.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DTP_MULTIVERSION [[gnu::target_clones("avx2", "default")]]
#else
#define DTP_MULTIVERSION
#endif

DTP_MULTIVERSION void rows_of_c_clone(std::int64_t i_begin, std::int64_t i_end, std::int64_t N, std::int64_t K,
                                      float alpha, const float* A, Strides a, const float* b_packed, float* C) {
  rows_of_c(i_begin, i_end, N, K, alpha, A, a, b_packed, C);
}

DTP_MULTIVERSION void rows_of_c_clone(std::int64_t i_begin, std::int64_t i_end, std::int64_t N, std::int64_t K,
                                      double alpha, const double* A, Strides a, const double* b_packed,
                                      double* C) {
  rows_of_c(i_begin, i_end, N, K, alpha, A, a, b_packed, C);
}

template <typename T>
void gemm_packed(std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, Strides a, const T* B,
                 Strides b, T* C) {
  if (M == 0 || N == 0 || K == 0) return;
  thread_local std::vector<T> b_packed;  // kept: the same shapes come back every step
  pack_b(N, K, B, b, b_packed);
  const T* packed = b_packed.data();
  // Parts of whole kMR-row blocks, each worth at least ~1 M multiply-adds,
  // so a small matmul stays on the calling thread.
  const std::int64_t blocks = (M + kMR - 1) / kMR;
  const std::int64_t min_blocks = std::max<std::int64_t>(1, (std::int64_t{1} << 20) / std::max<std::int64_t>(1, kMR * N * K));
  parallel_for(blocks, min_blocks, [&](std::int64_t first, std::int64_t last) {
    rows_of_c_clone(first * kMR, std::min(M, last * kMR), N, K, alpha, A, a, packed, C);
  });
}

}  // namespace

void gemm(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, Strides a,
          const float* B, Strides b, float* C) {
  gemm_packed(M, N, K, alpha, A, a, B, b, C);
}

void gemm(std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A, Strides a,
          const double* B, Strides b, double* C) {
  gemm_packed(M, N, K, alpha, A, a, B, b, C);
}

}  // namespace dtp::cpu
