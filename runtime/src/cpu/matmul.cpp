// Matmul on the CPU. The kernel walks C four rows at a time and streams a row
// of B through all four: the inner loop is a contiguous c[j] += a * b[j] that
// the compiler vectorizes without reassociating sums. A is read through
// strides, so a transposed A costs nothing; a transposed B is first packed
// into a row-major [K, N] copy (O(K N) work against O(M N K)).
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"

namespace dtp::ops {

namespace {

constexpr std::int64_t kTileK = 256;  // rows of B kept hot while C rows stream
constexpr std::int64_t kTileN = 512;  // columns: a B tile of 256 x 512 f32 is 512 KiB

template <typename T>
void transpose_into(const T* src, std::int64_t rows, std::int64_t cols, std::vector<T>& dst) {
  dst.resize(static_cast<std::size_t>(rows * cols));
  constexpr std::int64_t kBlock = 32;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kBlock)
    for (std::int64_t c0 = 0; c0 < cols; c0 += kBlock)
      for (std::int64_t r = r0; r < std::min(rows, r0 + kBlock); ++r)
        for (std::int64_t c = c0; c < std::min(cols, c0 + kBlock); ++c)
          dst[static_cast<std::size_t>(c * rows + r)] = src[r * cols + c];
}

// C[M, N] += alpha * A @ B[K, N], with A(i, k) = A[i * row_stride + k * col_stride]
// (row-major A: K, 1; transposed A stored as [K, M]: 1, M).
template <typename T>
[[gnu::always_inline]] inline void gemm_body(std::int64_t M, std::int64_t N, std::int64_t K,
                                             T alpha, const T* A, std::int64_t row_stride,
                                             std::int64_t col_stride, const T* B, T* C) {
  auto a = [&](std::int64_t i, std::int64_t k) {
    return alpha * A[i * row_stride + k * col_stride];
  };
  for (std::int64_t k0 = 0; k0 < K; k0 += kTileK) {
    const std::int64_t k1 = std::min(K, k0 + kTileK);
    for (std::int64_t j0 = 0; j0 < N; j0 += kTileN) {
      const std::int64_t nj = std::min(N, j0 + kTileN) - j0;
      std::int64_t i = 0;
      for (; i + 4 <= M; i += 4) {
        T* __restrict c0 = C + (i + 0) * N + j0;
        T* __restrict c1 = C + (i + 1) * N + j0;
        T* __restrict c2 = C + (i + 2) * N + j0;
        T* __restrict c3 = C + (i + 3) * N + j0;
        for (std::int64_t k = k0; k < k1; ++k) {
          const T a0 = a(i + 0, k), a1 = a(i + 1, k), a2 = a(i + 2, k), a3 = a(i + 3, k);
          const T* __restrict b = B + k * N + j0;
          for (std::int64_t j = 0; j < nj; ++j) {
            const T bj = b[j];
            c0[j] += a0 * bj;
            c1[j] += a1 * bj;
            c2[j] += a2 * bj;
            c3[j] += a3 * bj;
          }
        }
      }
      for (; i < M; ++i) {
        T* __restrict c = C + i * N + j0;
        for (std::int64_t k = k0; k < k1; ++k) {
          const T ai = a(i, k);
          const T* __restrict b = B + k * N + j0;
          for (std::int64_t j = 0; j < nj; ++j) c[j] += ai * b[j];
        }
      }
    }
  }
}

// One clone per instruction set, picked when the program loads: AVX2 where the
// CPU has it (8 floats per instruction instead of 4). No FMA and no
// reassociation, so every element is computed exactly as in the baseline
// clone: results do not depend on the machine. Not under ThreadSanitizer:
// it instruments the ifunc resolver that picks the clone, which runs while
// the program is loaded, before TSan is ready, and crashes it.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DTP_MULTIVERSION [[gnu::target_clones("avx2", "default")]]
#else
#define DTP_MULTIVERSION
#endif

DTP_MULTIVERSION void gemm_accumulate(std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                                      const float* A, std::int64_t row_stride,
                                      std::int64_t col_stride, const float* B, float* C) {
  gemm_body(M, N, K, alpha, A, row_stride, col_stride, B, C);
}

DTP_MULTIVERSION void gemm_accumulate(std::int64_t M, std::int64_t N, std::int64_t K, double alpha,
                                      const double* A, std::int64_t row_stride,
                                      std::int64_t col_stride, const double* B, double* C) {
  gemm_body(M, N, K, alpha, A, row_stride, col_stride, B, C);
}

struct MatrixDims {
  std::int64_t rows;
  std::int64_t cols;
};

MatrixDims matrix_dims(const char* name, const Tensor& t) {
  const std::int64_t cols = detail::last_dim("matmul", name, t);
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < t.ndim(); ++d) rows *= t.size(d);
  return {rows, cols};
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a, bool transpose_b,
            double alpha, double beta) {
  if (a.device().is_cuda()) return cuda::matmul(a, b, out, transpose_a, transpose_b, alpha, beta);
  if (detail::is_half(a.dtype())) {
    detail::Widened f32("matmul", a.dtype());
    matmul(f32.in("a", a), f32.in("b", b), f32.out("out", out), transpose_a, transpose_b, alpha, beta);
    return f32.store();
  }
  detail::check_float("matmul", "a", a);
  detail::check_float("matmul", "b", b);
  detail::check_float("matmul", "out", out);
  detail::check_dtype_is("matmul", "b", b, a.dtype());
  detail::check_dtype_is("matmul", "out", out, a.dtype());
  const MatrixDims ad = matrix_dims("a", a), bd = matrix_dims("b", b), od = matrix_dims("out", out);
  const std::int64_t M = transpose_a ? ad.cols : ad.rows;
  const std::int64_t K = transpose_a ? ad.rows : ad.cols;
  const std::int64_t Kb = transpose_b ? bd.cols : bd.rows;
  const std::int64_t N = transpose_b ? bd.rows : bd.cols;
  DTP_CHECK(K == Kb, "matmul: inner dimensions differ: op(a) is [", M, ", ", K, "] (a is ",
            a.describe(), transpose_a ? ", transposed" : "", ") but op(b) is [", Kb, ", ", N,
            "] (b is ", b.describe(), transpose_b ? ", transposed" : "", ")");
  DTP_CHECK(od.rows == M && od.cols == N, "matmul: out must be a [", M, ", ", N,
            "] matrix (rows = all leading dims, columns = last dim), got ", out.describe());
  DTP_CHECK(!out.shares_storage_with(a) && !out.shares_storage_with(b),
            "matmul: out must not share storage with a or b");

  detail::with_float(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* C = out.data<T>();
    const std::int64_t mn = M * N;
    if (beta == 0.0) {
      std::fill(C, C + mn, T(0));
    } else if (beta != 1.0) {
      for (std::int64_t i = 0; i < mn; ++i) C[i] *= static_cast<T>(beta);
    }
    if (M == 0 || N == 0 || K == 0 || alpha == 0.0) return;
    thread_local std::vector<T> packed_b;
    const T* B = b.data<T>();
    if (transpose_b) {
      transpose_into(B, N, K, packed_b);  // b is [N, K]
      B = packed_b.data();
    }
    // a is [M, K], or [K, M] when transposed.
    gemm_accumulate(M, N, K, static_cast<T>(alpha), a.data<T>(), transpose_a ? 1 : K,
                    transpose_a ? M : 1, B, C);
  });
}

void add_bias(Tensor& x, const Tensor& bias) {
  if (x.device().is_cuda()) return cuda::add_bias(x, bias);
  if (detail::is_half(x.dtype())) {
    detail::Widened f32("add_bias", x.dtype());
    add_bias(f32.out("x", x), f32.in("bias", bias));
    return f32.store();
  }
  detail::check_float("add_bias", "x", x);
  detail::check_float("add_bias", "bias", bias);
  detail::check_dtype_is("add_bias", "bias", bias, x.dtype());
  const std::int64_t C = detail::last_dim("add_bias", "x", x);
  detail::check_shape("add_bias", "bias", bias, Shape{C});
  const std::int64_t rows = C == 0 ? 0 : x.numel() / C;
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = x.data<T>();
    const T* __restrict bb = bias.data<T>();
    for (std::int64_t n = 0; n < rows; ++n) {
      T* __restrict row = p + n * C;
      for (std::int64_t c = 0; c < C; ++c) row[c] += bb[c];
    }
  });
}

void bias_backward(const Tensor& dy, Tensor& dbias) {
  if (dy.device().is_cuda()) return cuda::bias_backward(dy, dbias);
  if (detail::is_half(dy.dtype())) {
    detail::Widened f32("bias_backward", dy.dtype());
    bias_backward(f32.in("dy", dy), f32.out("dbias", dbias));
    return f32.store();
  }
  detail::check_float("bias_backward", "dy", dy);
  detail::check_float("bias_backward", "dbias", dbias);
  detail::check_dtype_is("bias_backward", "dbias", dbias, dy.dtype());
  const std::int64_t C = detail::last_dim("bias_backward", "dy", dy);
  detail::check_shape("bias_backward", "dbias", dbias, Shape{C});
  const std::int64_t rows = C == 0 ? 0 : dy.numel() / C;
  detail::with_float(dy.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* g = dy.data<T>();
    T* __restrict db = dbias.data<T>();
    for (std::int64_t n = 0; n < rows; ++n) {
      const T* __restrict row = g + n * C;
      for (std::int64_t c = 0; c < C; ++c) db[c] += row[c];
    }
  });
}

}  // namespace dtp::ops
