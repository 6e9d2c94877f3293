// Matmul on the CPU: the checks and the shapes. The arithmetic is in gemm.h,
// where the plain three loops define it and a packed, register-blocked,
// multi-threaded kernel computes the same bits faster.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"

namespace dtp::ops {

namespace {

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
  // Counted once: a CPU bf16/f16 call comes back here in f32.
  if (a.device().is_cuda() || !detail::is_half(a.dtype()))
    count_flops(detail::matmul_flops(a, out, transpose_a));
  if (a.device().is_cuda()) return cuda::matmul(a, b, out, transpose_a, transpose_b, alpha, beta);
  if (detail::is_half(a.dtype())) {
    detail::Widened f32("matmul", a.dtype());
    matmul(f32.in("a", a), f32.in("b", b), f32.out("out", out), transpose_a, transpose_b, alpha,
           beta);
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
    if (alpha == 0.0 || K == 0) {  // out = beta * out
      if (beta != 1.0)
        for (std::int64_t i = 0; i < mn; ++i)
          C[i] = beta == 0.0 ? T(0) : static_cast<T>(beta) * C[i];
      return;
    }
    if (beta != 0.0 && beta != 1.0)
      for (std::int64_t i = 0; i < mn; ++i) C[i] *= static_cast<T>(beta);
    // a is [M, K], or [K, M] when transposed; b is [K, N], or [N, K].
    // beta == 0: out's old values are never read (the sums start from zero).
    const cpu::Strides a_strides = transpose_a ? cpu::Strides{1, M} : cpu::Strides{K, 1};
    const cpu::Strides b_strides = transpose_b ? cpu::Strides{1, K} : cpu::Strides{N, 1};
    cpu::gemm(M, N, K, static_cast<T>(alpha), a.data<T>(), a_strides, b.data<T>(), b_strides,
              cpu::Output<T>{C, N, beta != 0.0});
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
