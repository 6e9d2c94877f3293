// LayerNorm forward/backward (the kernels are in layernorm_kernels.cuh) and
// row softmax.
#include <cmath>
#include <limits>

#include "cuda/layernorm_kernels.cuh"
#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {
using nn::check_launch;
using nn::ptr;
using nn::stream;

using layernorm::kWarpsPerBlock;

template <typename T>
__global__ void softmax_forward_kernel(const T* x, T* y, std::int64_t C) {
  __shared__ nn::MaxSum shared[32];
  const T* in = x + blockIdx.x * C;
  T* out = y + blockIdx.x * C;
  nn::MaxSum ms{-INFINITY, 0.f};
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) ms = nn::merge(ms, {load(in, c), 1.f});
  ms = nn::block_merge(ms, shared);
  const float inv = 1.f / ms.s;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x)
    store(out, c, expf(load(in, c) - ms.m) * inv);
}

template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, std::int64_t C) {
  __shared__ float shared[32];
  const std::int64_t base = blockIdx.x * C;
  float dot = 0;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dot += load(y, base + c) * load(dy, base + c);
  dot = nn::block_sum(dot, shared);
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x)
    store(dx, base + c, load(y, base + c) * (load(dy, base + c) - dot));
}

void check_like(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  nn::check_float(op, name, t, x.device());
  detail::check_dtype_is(op, name, t, x.dtype());
}
}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                       Tensor& mean, Tensor& rstd, double eps) {
  const char* op = "layernorm_forward";
  nn::check_float(op, "x", x, x.device());
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"weight", &weight},
                         {"bias", &bias},
                         {"y", &y},
                         {"mean", &mean},
                         {"rstd", &rstd}})
    check_like(op, name, *t, x);
  const std::int64_t C = detail::last_dim(op, "x", x);
  DTP_CHECK(C >= 1 && C <= INT32_MAX, op, ": x needs a last dim of at least 1, got ", x.describe());
  const std::int64_t rows = x.numel() / C;
  detail::check_shape(op, "weight", weight, Shape{C});
  detail::check_shape(op, "bias", bias, Shape{C});
  detail::check_shape(op, "y", y, x.shape());
  detail::check_numel(op, "mean", mean, rows, "one per row of x");
  detail::check_numel(op, "rstd", rstd, rows, "one per row of x");
  if (rows == 0) return;
  nn::use_device(x.device());
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    with_row_width<T>(
        C,
        [&](auto w) {
          layernorm::forward_kernel<T, decltype(w)::value>
              <<<blocks, 32 * kWarpsPerBlock, 0, stream()>>>(
                  ptr<T>(x), ptr<T>(weight), ptr<T>(bias), ptr<T>(y), ptr<T>(mean), ptr<T>(rstd),
                  rows, static_cast<int>(C), static_cast<float>(eps));
        },
        ptr<T>(x), ptr<T>(weight), ptr<T>(bias), static_cast<const T*>(ptr<T>(y)));
  });
  check_launch();
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const char* op = "layernorm_backward";
  nn::check_float(op, "x", x, x.device());
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dy", &dy},
                         {"weight", &weight},
                         {"mean", &mean},
                         {"rstd", &rstd},
                         {"dx", &dx},
                         {"dweight", &dweight},
                         {"dbias", &dbias}})
    check_like(op, name, *t, x);
  const std::int64_t C = detail::last_dim(op, "x", x);
  DTP_CHECK(C >= 1 && C <= INT32_MAX, op, ": x needs a last dim of at least 1, got ", x.describe());
  const std::int64_t rows = x.numel() / C;
  detail::check_shape(op, "dy", dy, x.shape());
  detail::check_shape(op, "dx", dx, x.shape());
  detail::check_shape(op, "weight", weight, Shape{C});
  detail::check_shape(op, "dweight", dweight, Shape{C});
  detail::check_shape(op, "dbias", dbias, Shape{C});
  detail::check_numel(op, "mean", mean, rows, "one per row of x");
  detail::check_numel(op, "rstd", rstd, rows, "one per row of x");
  if (rows == 0) return;
  nn::use_device(x.device());
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    with_row_width<T>(
        C,
        [&](auto w) {
          constexpr int W = decltype(w)::value;
          layernorm::backward_kernel<T, W><<<blocks, 32 * kWarpsPerBlock, 0, stream()>>>(
              ptr<T>(dy), ptr<T>(x), ptr<T>(weight), ptr<T>(mean), ptr<T>(rstd), ptr<T>(dx), rows,
              static_cast<int>(C));
          const nn::RowSlices s = nn::row_slices(rows, C, W);
          Tensor partial_dw =
              Tensor::empty({s.slices * C}, DType::f32, x.device(), MemoryCategory::activations);
          Tensor partial_db =
              Tensor::empty({s.slices * C}, DType::f32, x.device(), MemoryCategory::activations);
          layernorm::param_partial_kernel<T, W><<<s.grid(), s.block(), 0, stream()>>>(
              ptr<T>(dy), ptr<T>(x), ptr<T>(mean), ptr<T>(rstd), ptr<float>(partial_dw),
              ptr<float>(partial_db), rows, C, s.rows_per_slice);
          nn::add_column_partials_kernel<<<nn::grid_for(C), 256, 0, stream()>>>(
              ptr<float>(partial_dw), ptr<T>(dweight), s.slices, C);
          nn::add_column_partials_kernel<<<nn::grid_for(C), 256, 0, stream()>>>(
              ptr<float>(partial_db), ptr<T>(dbias), s.slices, C);
        },
        ptr<T>(dy), ptr<T>(x), ptr<T>(weight), static_cast<const T*>(ptr<T>(dx)));
  });
  check_launch();
}

void softmax_forward(const Tensor& x, Tensor& y) {
  const char* op = "softmax_forward";
  nn::check_float(op, "x", x, x.device());
  check_like(op, "y", y, x);
  detail::check_shape(op, "y", y, x.shape());
  const std::int64_t C = detail::last_dim(op, "x", x);
  const std::int64_t rows = nn::rows_of(x, C);
  if (rows == 0) return;
  nn::use_device(x.device());
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    softmax_forward_kernel<<<static_cast<unsigned>(rows), 256, 0, stream()>>>(ptr<T>(x), ptr<T>(y),
                                                                              C);
  });
  check_launch();
}

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const char* op = "softmax_backward";
  nn::check_float(op, "y", y, y.device());
  check_like(op, "dy", dy, y);
  check_like(op, "dx", dx, y);
  detail::check_shape(op, "dy", dy, y.shape());
  detail::check_shape(op, "dx", dx, y.shape());
  const std::int64_t C = detail::last_dim(op, "y", y);
  const std::int64_t rows = nn::rows_of(y, C);
  if (rows == 0) return;
  nn::use_device(y.device());
  nn::with_float(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    softmax_backward_kernel<<<static_cast<unsigned>(rows), 256, 0, stream()>>>(
        ptr<T>(y), ptr<T>(dy), ptr<T>(dx), C);
  });
  check_launch();
}

}  // namespace dtp::cuda
