// Internal: the CPU matrix multiply behind ops::matmul.
//
//   C[M, N] += op(A) @ op(B),  op(A)(i, k) = alpha * A[i * a_row + k * a_col],
//                              (or C = ..., see Output)
//                              op(B)(k, j) = B[k * b_row + j * b_col]
//
// Both functions compute every element of C the same way: start from C's
// value (or +0), then add (alpha * a_ik) * b_kj for k = 0, 1, ..., K-1 in that order,
// one rounding for the product and one for the sum, no fused multiply-add.
// So gemm() equals gemm_definition() bitwise, on any machine and at any
// thread count; only the speed differs.
#pragma once

#include <cstdint>

#include "cpu/isa.h"

namespace dtp::cpu {

/// Strides of a matrix operand: element (r, c) is at r * row + c * col.
struct Strides {
  std::int64_t row, col;
};

/// The result: C(i, j) is data[i * ld + j] (ld >= N). With accumulate false,
/// C's old values are never read and the sums start from +0 (bitwise what
/// the definition gives on a zeroed C): C = op(A) @ op(B).
template <typename T>
struct Output {
  T* data;
  std::int64_t ld;
  bool accumulate = true;
};

/// The definition: three plain loops.
template <typename T>
void gemm_definition(std::int64_t M, std::int64_t N, std::int64_t K, T alpha, const T* A, Strides a,
                     const T* B, Strides b, Output<T> C) {
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      T c = C.accumulate ? C.data[i * C.ld + j] : T(0);
      for (std::int64_t k = 0; k < K; ++k) {
        const T a_ik = alpha * A[i * a.row + k * a.col];
        const T product = a_ik * B[k * b.row + j * b.col];
        c = c + product;
      }
      C.data[i * C.ld + j] = c;
    }
}

/// The fast path: packed panels, a register-blocked kernel, rows of C spread
/// over the rank's compute threads (dtp/parallel.h), on the instruction set
/// named (which this CPU must run) or, without one, on the widest this CPU
/// runs whose tile is no wider than N (a 16-column head on a 32-column
/// AVX-512 tile would waste half of it).
void gemm(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, Strides a,
          const float* B, Strides b, Output<float> C, VectorIsa isa);
void gemm(std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A, Strides a,
          const double* B, Strides b, Output<double> C, VectorIsa isa);
void gemm(std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A, Strides a,
          const float* B, Strides b, Output<float> C);
void gemm(std::int64_t M, std::int64_t N, std::int64_t K, double alpha, const double* A, Strides a,
          const double* B, Strides b, Output<double> C);

}  // namespace dtp::cpu
