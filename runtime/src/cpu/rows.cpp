// Per-row weights: scale_rows and its backward row_dot. A mixture of experts
// multiplies each expert's output row by the router's weight for that token;
// the weight's gradient is the dot product of the row's gradient with the
// unscaled output.
#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"

namespace dtp::ops {

void scale_rows(Tensor& x, const Tensor& w) {
  if (x.device().is_cuda()) return cuda::scale_rows(x, w);
  if (detail::is_half(x.dtype())) {
    detail::Widened f32("scale_rows", x.dtype());
    scale_rows(f32.out("x", x), f32.in("w", w));
    return f32.store();
  }
  const char* op = "scale_rows";
  detail::check_float(op, "x", x);
  detail::check_float(op, "w", w);
  detail::check_dtype_is(op, "w", w, x.dtype());
  const std::int64_t C = detail::last_dim(op, "x", x);
  const std::int64_t rows = C == 0 ? 0 : x.numel() / C;
  detail::check_numel(op, "w", w, rows, "one weight per row of x");
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* px = x.data<T>();
    const T* pw = w.data<T>();
    for (std::int64_t n = 0; n < rows; ++n)
      for (std::int64_t c = 0; c < C; ++c) px[n * C + c] *= pw[n];
  });
}

void row_dot(const Tensor& a, const Tensor& b, Tensor& out) {
  if (a.device().is_cuda()) return cuda::row_dot(a, b, out);
  if (detail::is_half(a.dtype())) {
    detail::Widened f32("row_dot", a.dtype());
    row_dot(f32.in("a", a), f32.in("b", b), f32.out("out", out));
    return f32.store();
  }
  const char* op = "row_dot";
  detail::check_float(op, "a", a);
  detail::check_float(op, "b", b);
  detail::check_float(op, "out", out);
  detail::check_dtype_is(op, "b", b, a.dtype());
  detail::check_dtype_is(op, "out", out, a.dtype());
  detail::check_shape(op, "b", b, a.shape());
  const std::int64_t C = detail::last_dim(op, "a", a);
  const std::int64_t rows = C == 0 ? 0 : a.numel() / C;
  detail::check_numel(op, "out", out, rows, "one per row of a");
  detail::with_float(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    for (std::int64_t n = 0; n < rows; ++n) {
      double total = 0;  // in double, like the other reductions
      for (std::int64_t c = 0; c < C; ++c)
        total += static_cast<double>(pa[n * C + c]) * static_cast<double>(pb[n * C + c]);
      po[n] = detail::from_double<T>(total);
    }
  });
}

}  // namespace dtp::ops
