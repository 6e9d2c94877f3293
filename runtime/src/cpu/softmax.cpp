// Row softmax over the last dim (max-subtracted), and its backward.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"

namespace dtp::ops {

void softmax_forward(const Tensor& x, Tensor& y) {
  if (x.device().is_cuda()) return cuda::softmax_forward(x, y);
  if (detail::is_half(x.dtype())) {
    detail::Widened f32("softmax_forward", x.dtype());
    softmax_forward(f32.in("x", x), f32.out("y", y));
    return f32.store();
  }
  detail::check_float("softmax_forward", "x", x);
  detail::check_float("softmax_forward", "y", y);
  detail::check_dtype_is("softmax_forward", "y", y, x.dtype());
  detail::check_shape("softmax_forward", "y", y, x.shape());
  const std::int64_t C = detail::last_dim("softmax_forward", "x", x);
  if (C == 0) return;
  const std::int64_t rows = x.numel() / C;
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for (std::int64_t n = 0; n < rows; ++n) detail::softmax_row(px + n * C, py + n * C, C);
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (y.device().is_cuda()) return cuda::softmax_backward(y, dy, dx);
  if (detail::is_half(y.dtype())) {
    detail::Widened f32("softmax_backward", y.dtype());
    softmax_backward(f32.in("y", y), f32.in("dy", dy), f32.out("dx", dx));
    return f32.store();
  }
  detail::check_float("softmax_backward", "y", y);
  detail::check_float("softmax_backward", "dy", dy);
  detail::check_float("softmax_backward", "dx", dx);
  detail::check_dtype_is("softmax_backward", "dy", dy, y.dtype());
  detail::check_dtype_is("softmax_backward", "dx", dx, y.dtype());
  detail::check_shape("softmax_backward", "dy", dy, y.shape());
  detail::check_shape("softmax_backward", "dx", dx, y.shape());
  const std::int64_t C = detail::last_dim("softmax_backward", "y", y);
  if (C == 0) return;
  const std::int64_t rows = y.numel() / C;
  detail::with_float(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    for (std::int64_t n = 0; n < rows; ++n) {
      const T* p = py + n * C;
      const T* g = pdy + n * C;
      T dot = 0;
      for (std::int64_t c = 0; c < C; ++c) dot += p[c] * g[c];
      T* out = pdx + n * C;
      for (std::int64_t c = 0; c < C; ++c) out[c] = p[c] * (g[c] - dot);
    }
  });
}

}  // namespace dtp::ops
