// LayerNorm over the last dim. Statistics are computed in the compute type
// (two passes: mean, then variance) and saved so the backward reuses them.
// Rows are independent, so they are spread over the rank's threads; the
// weight and bias gradients, sums over rows, are spread by columns instead,
// so each still adds its rows in order and the bits do not depend on the
// thread count.
#include <algorithm>
#include <cmath>

#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"
#include "dtp/parallel.h"

namespace dtp::ops {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                       Tensor& mean, Tensor& rstd, double eps) {
  if (x.device().is_cuda()) return cuda::layernorm_forward(x, weight, bias, y, mean, rstd, eps);
  if (detail::is_half(x.dtype())) {
    detail::Widened f32("layernorm_forward", x.dtype());
    layernorm_forward(f32.in("x", x), f32.in("weight", weight), f32.in("bias", bias),
                      f32.out("y", y), f32.out("mean", mean), f32.out("rstd", rstd), eps);
    return f32.store();
  }
  const char* op = "layernorm_forward";
  detail::check_float(op, "x", x);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"weight", &weight},
                         {"bias", &bias},
                         {"y", &y},
                         {"mean", &mean},
                         {"rstd", &rstd}}) {
    detail::check_float(op, name, *t);
    detail::check_dtype_is(op, name, *t, x.dtype());
  }
  const std::int64_t C = detail::last_dim(op, "x", x);
  DTP_CHECK(C >= 1, op, ": x needs a last dim of at least 1, got ", x.describe());
  const std::int64_t rows = x.numel() / C;
  detail::check_shape(op, "weight", weight, Shape{C});
  detail::check_shape(op, "bias", bias, Shape{C});
  detail::check_shape(op, "y", y, x.shape());
  detail::check_numel(op, "mean", mean, rows, "one per row of x");
  detail::check_numel(op, "rstd", rstd, rows, "one per row of x");
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();
    const T* w = weight.data<T>();
    const T* b = bias.data<T>();
    T* py = y.data<T>();
    T* pm = mean.data<T>();
    T* pr = rstd.data<T>();
    parallel_for(rows, rows_per_part(C), [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t n = first; n < last; ++n) {
        const T* row = px + n * C;
        T sum = 0;
        for (std::int64_t c = 0; c < C; ++c) sum += row[c];
        const T m = sum / static_cast<T>(C);
        T var = 0;
        for (std::int64_t c = 0; c < C; ++c) var += (row[c] - m) * (row[c] - m);
        var /= static_cast<T>(C);
        const T r = T(1) / std::sqrt(var + static_cast<T>(eps));
        T* out = py + n * C;
        for (std::int64_t c = 0; c < C; ++c) out[c] = (row[c] - m) * r * w[c] + b[c];
        pm[n] = m;
        pr[n] = r;
      }
    });
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  if (dy.device().is_cuda())
    return cuda::layernorm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias);
  if (detail::is_half(dy.dtype())) {
    detail::Widened f32("layernorm_backward", dy.dtype());
    layernorm_backward(f32.in("dy", dy), f32.in("x", x), f32.in("weight", weight),
                       f32.in("mean", mean), f32.in("rstd", rstd), f32.out("dx", dx),
                       f32.out("dweight", dweight), f32.out("dbias", dbias));
    return f32.store();
  }
  const char* op = "layernorm_backward";
  detail::check_float(op, "x", x);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dy", &dy},
                         {"weight", &weight},
                         {"mean", &mean},
                         {"rstd", &rstd},
                         {"dx", &dx},
                         {"dweight", &dweight},
                         {"dbias", &dbias}}) {
    detail::check_float(op, name, *t);
    detail::check_dtype_is(op, name, *t, x.dtype());
  }
  const std::int64_t C = detail::last_dim(op, "x", x);
  DTP_CHECK(C >= 1, op, ": x needs a last dim of at least 1, got ", x.describe());
  const std::int64_t rows = x.numel() / C;
  detail::check_shape(op, "dy", dy, x.shape());
  detail::check_shape(op, "dx", dx, x.shape());
  detail::check_shape(op, "weight", weight, Shape{C});
  detail::check_shape(op, "dweight", dweight, Shape{C});
  detail::check_shape(op, "dbias", dbias, Shape{C});
  detail::check_numel(op, "mean", mean, rows, "one per row of x");
  detail::check_numel(op, "rstd", rstd, rows, "one per row of x");
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    const T* w = weight.data<T>();
    const T* pm = mean.data<T>();
    const T* pr = rstd.data<T>();
    T* pdx = dx.data<T>();
    T* dw = dweight.data<T>();
    T* db = dbias.data<T>();
    parallel_for(rows, rows_per_part(C), [&](std::int64_t first, std::int64_t last) {
      for (std::int64_t n = first; n < last; ++n) {
        const T* row = px + n * C;
        const T* g = pdy + n * C;
        const T m = pm[n], r = pr[n];
        // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * w.
        T mean_dxhat = 0, mean_dxhat_xhat = 0;
        for (std::int64_t c = 0; c < C; ++c) {
          const T xhat = (row[c] - m) * r;
          const T dxhat = g[c] * w[c];
          mean_dxhat += dxhat;
          mean_dxhat_xhat += dxhat * xhat;
        }
        mean_dxhat /= static_cast<T>(C);
        mean_dxhat_xhat /= static_cast<T>(C);
        T* out = pdx + n * C;
        for (std::int64_t c = 0; c < C; ++c) {
          const T xhat = (row[c] - m) * r;
          out[c] = r * (g[c] * w[c] - mean_dxhat - xhat * mean_dxhat_xhat);
        }
      }
    });
    // dweight and dbias add every row's share, in row order, column by column.
    parallel_for(C, std::max<std::int64_t>(1, kElementsPerPart / std::max<std::int64_t>(1, rows)),
                 [&](std::int64_t c0, std::int64_t c1) {
                   for (std::int64_t n = 0; n < rows; ++n) {
                     const T* row = px + n * C;
                     const T* g = pdy + n * C;
                     const T m = pm[n], r = pr[n];
                     for (std::int64_t c = c0; c < c1; ++c) {
                       dw[c] += g[c] * ((row[c] - m) * r);
                       db[c] += g[c];
                     }
                   }
                 });
  });
}

}  // namespace dtp::ops
