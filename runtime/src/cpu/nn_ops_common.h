// Internal: argument checks and dtype dispatch shared by the CPU nn ops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "cpu/element.h"
#include "dtp/error.h"
#include "dtp/flops.h"
#include "dtp/tensor.h"

namespace dtp::detail {

/// Fails unless @p t is defined and on the CPU.
inline void check_cpu(const char* op, const char* name, const Tensor& t) {
  DTP_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
  DTP_CHECK(t.device().is_cpu(), op, ": ", name, " is ", t.describe(),
            "; this op has only a CPU kernel so far (its CUDA kernel is not written yet)");
}

/// Fails unless @p t is an f32 or f64 CPU tensor (the nn ops send bf16 and
/// f16 through f32 copies before they get here: cpu/widen.h).
inline void check_float(const char* op, const char* name, const Tensor& t) {
  check_cpu(op, name, t);
  DTP_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, op, ": ", name, " is ",
            t.describe(),
            "; CPU kernels compute in f32 and f64 (the nn ops take bf16 and f16 through f32; "
            "cast other dtypes first)");
}

/// Fails unless @p t has @p dtype (the dtype of the op's first input).
inline void check_dtype_is(const char* op, const char* name, const Tensor& t, DType dtype) {
  DTP_CHECK(t.dtype() == dtype, op, ": ", name, " is ", t.describe(), " but must be ",
            dtype_name(dtype), " like the other inputs");
}

/// Fails unless @p t has exactly @p expected as its shape.
inline void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  DTP_CHECK(t.shape() == expected, op, ": ", name, " must have shape ", expected.str(), ", got ",
            t.describe());
}

/// Fails unless @p t has @p expected elements.
inline void check_numel(const char* op, const char* name, const Tensor& t, std::int64_t expected,
                        const std::string& why) {
  DTP_CHECK(t.numel() == expected, op, ": ", name, " must have ", expected, " elements (", why,
            "), got ", t.describe());
}

/// The last dim of @p t (columns of the matrix view); fails for 0-D tensors.
/// Keys of an attention's k [B, Tk, H, D] (0 for a malformed k: the op's checks name it).
inline std::int64_t key_count(const Tensor& k) { return k.ndim() == 4 ? k.size(1) : 0; }

/// 2 M N K for out [M, N] = op(a) op(b), a [M, K] (or [K, M] transposed)
/// read as a matrix whose columns are its last dim (0 when malformed).
inline std::int64_t matmul_flops(const Tensor& a, const Tensor& out, bool transpose_a) {
  if (a.ndim() == 0 || a.numel() == 0) return 0;
  const std::int64_t columns = a.size(a.ndim() - 1);
  const std::int64_t inner = transpose_a ? a.numel() / columns : columns;
  return 2 * out.numel() * inner;
}

inline std::int64_t last_dim(const char* op, const char* name, const Tensor& t) {
  DTP_CHECK(t.ndim() >= 1, op, ": ", name, " needs at least one dimension, got ", t.describe());
  return t.size(t.ndim() - 1);
}

/// Rows and columns of logits [..., V] (N = numel / V rows) with one i32
/// target per row: the checks every cross-entropy op makes after its device
/// checks, whole vocabulary or a rank's slice of it (@p columns names which).
struct LogitRows {
  std::int64_t N, V;
};
inline LogitRows logit_rows(const char* op, const Tensor& logits, const Tensor& targets,
                            const char* columns = "vocabulary") {
  DTP_CHECK(targets.dtype() == DType::i32, op, ": targets must be i32 token ids, got ",
            targets.describe());
  const std::int64_t V = last_dim(op, "logits", logits);
  DTP_CHECK(V >= 1, op, ": logits need a ", columns, " (last dim) of at least 1, got ",
            logits.describe());
  const std::int64_t N = logits.numel() / V;
  check_numel(op, "targets", targets, N, "one per row of logits");
  return {N, V};
}

/// Calls fn(T{}) with T = float or double for @p dtype (checked by check_float).
template <typename Fn>
void with_float(DType dtype, Fn&& fn) {
  if (dtype == DType::f64)
    fn(double{});
  else
    fn(float{});
}

/// out = softmax(in) over n >= 1 values, the largest subtracted first so
/// exp never overflows; out may alias in.
template <typename T>
void softmax_row(const T* in, T* out, std::int64_t n) {
  T m = -std::numeric_limits<T>::infinity();
  for (std::int64_t c = 0; c < n; ++c) m = std::max(m, in[c]);
  T sum = 0;
  for (std::int64_t c = 0; c < n; ++c) {
    out[c] = std::exp(in[c] - m);
    sum += out[c];
  }
  const T inv = T(1) / sum;
  for (std::int64_t c = 0; c < n; ++c) out[c] *= inv;
}

}  // namespace dtp::detail
