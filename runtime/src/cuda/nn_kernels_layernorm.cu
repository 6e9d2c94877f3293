// LayerNorm forward/backward and row softmax. One warp owns one row of
// LayerNorm (the GPT's rows are a few hundred to a few thousand wide): the
// statistics are warp shuffles, no shared memory, no block barrier. The
// weight/bias gradients are sums over rows, made column by column in a fixed
// order (like bias_backward's), in f32 and rounded once when stored: the same
// bits on every run.
#include <cmath>
#include <limits>

#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {
using nn::check_launch;
using nn::ptr;
using nn::stream;

constexpr int kWarpsPerBlock = 8;

template <typename T>
__global__ void layernorm_forward_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd,
                                         std::int64_t rows, int C, float eps) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* in = x + row * C;
  float sum = 0;
  for (int c = lane; c < C; c += 32) sum += load(in, c);
  const float m = nn::warp_sum(sum) / C;
  float var = 0;  // second pass over the row (L1/L2 hits): as stable as the CPU's
  for (int c = lane; c < C; c += 32) {
    const float d = load(in, c) - m;
    var += d * d;
  }
  const float r = rsqrtf(nn::warp_sum(var) / C + eps);
  T* out = y + row * C;
  for (int c = lane; c < C; c += 32) store(out, c, (load(in, c) - m) * r * load(w, c) + load(b, c));
  if (lane == 0) {
    store(mean, row, m);
    store(rstd, row, r);
  }
}

// dx = rstd * (dy w - mean(dy w) - xhat * mean(dy w xhat)): one warp per row.
template <typename T>
__global__ void layernorm_backward_kernel(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                                          T* dx, std::int64_t rows, int C) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* in = x + row * C;
  const T* g = dy + row * C;
  const float m = load(mean, row), r = load(rstd, row);
  float mean_dxhat = 0, mean_dxhat_xhat = 0;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (load(in, c) - m) * r;
    const float dxhat = load(g, c) * load(w, c);
    mean_dxhat += dxhat;
    mean_dxhat_xhat += dxhat * xhat;
  }
  mean_dxhat = nn::warp_sum(mean_dxhat) / C;
  mean_dxhat_xhat = nn::warp_sum(mean_dxhat_xhat) / C;
  T* out = dx + row * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (load(in, c) - m) * r;
    store(out, c, r * (load(g, c) * load(w, c) - mean_dxhat - xhat * mean_dxhat_xhat));
  }
}

// dw += sum over rows of dy xhat, db += sum over rows of dy: pass 1 of the
// fixed-order column sums (nn_kernels_common.cuh: row_slices), both at once.
template <typename T>
__global__ void layernorm_param_partial_kernel(const T* dy, const T* x, const T* mean, const T* rstd,
                                               float* partial_dw, float* partial_db, std::int64_t rows,
                                               std::int64_t C, std::int64_t rows_per_slice) {
  __shared__ float tile_dw[nn::kRowThreads][nn::kColumnBlock + 1];
  __shared__ float tile_db[nn::kRowThreads][nn::kColumnBlock + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * nn::kColumnBlock + threadIdx.x;
  std::int64_t first, end;
  nn::slice_rows(rows, rows_per_slice, first, end);
  float acc_dw = 0, acc_db = 0;
  if (c < C)
    for (std::int64_t r = first + threadIdx.y; r < end; r += nn::kRowThreads) {
      const float g = load(dy, r * C + c);
      acc_dw += g * (load(x, r * C + c) - load(mean, r)) * load(rstd, r);
      acc_db += g;
    }
  tile_dw[threadIdx.y][threadIdx.x] = acc_dw;
  tile_db[threadIdx.y][threadIdx.x] = acc_db;
  nn::write_slice_partial(tile_dw, partial_dw, c, C);
  nn::write_slice_partial(tile_db, partial_db, c, C);
}

template <typename T>
__global__ void softmax_forward_kernel(const T* x, T* y, std::int64_t C) {
  __shared__ nn::MaxSum shared[32];
  const T* in = x + blockIdx.x * C;
  T* out = y + blockIdx.x * C;
  nn::MaxSum ms{-INFINITY, 0.f};
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) ms = nn::merge(ms, {load(in, c), 1.f});
  ms = nn::block_merge(ms, shared);
  const float inv = 1.f / ms.s;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) store(out, c, expf(load(in, c) - ms.m) * inv);
}

template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, std::int64_t C) {
  __shared__ float shared[32];
  const std::int64_t base = blockIdx.x * C;
  float dot = 0;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += load(y, base + c) * load(dy, base + c);
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
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"weight", &weight}, {"bias", &bias},
                         {"y", &y}, {"mean", &mean}, {"rstd", &rstd}})
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
    layernorm_forward_kernel<<<blocks, 32 * kWarpsPerBlock, 0, stream()>>>(
        ptr<T>(x), ptr<T>(weight), ptr<T>(bias), ptr<T>(y), ptr<T>(mean), ptr<T>(rstd), rows,
        static_cast<int>(C), static_cast<float>(eps));
  });
  check_launch();
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  const char* op = "layernorm_backward";
  nn::check_float(op, "x", x, x.device());
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dy", &dy}, {"weight", &weight},
                         {"mean", &mean}, {"rstd", &rstd}, {"dx", &dx}, {"dweight", &dweight},
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
  const nn::RowSlices s = nn::row_slices(rows, C);
  Tensor partial_dw = Tensor::empty({s.slices * C}, DType::f32, x.device(), MemoryCategory::activations);
  Tensor partial_db = Tensor::empty({s.slices * C}, DType::f32, x.device(), MemoryCategory::activations);
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    layernorm_backward_kernel<<<blocks, 32 * kWarpsPerBlock, 0, stream()>>>(
        ptr<T>(dy), ptr<T>(x), ptr<T>(weight), ptr<T>(mean), ptr<T>(rstd), ptr<T>(dx), rows, static_cast<int>(C));
    layernorm_param_partial_kernel<<<s.grid(), s.block(), 0, stream()>>>(
        ptr<T>(dy), ptr<T>(x), ptr<T>(mean), ptr<T>(rstd), ptr<float>(partial_dw), ptr<float>(partial_db), rows, C,
        s.rows_per_slice);
    nn::add_column_partials_kernel<<<nn::grid_for(C), 256, 0, stream()>>>(ptr<float>(partial_dw),
                                                                          ptr<T>(dweight), s.slices, C);
    nn::add_column_partials_kernel<<<nn::grid_for(C), 256, 0, stream()>>>(ptr<float>(partial_db), ptr<T>(dbias),
                                                                          s.slices, C);
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
    softmax_forward_kernel<<<static_cast<unsigned>(rows), 256, 0, stream()>>>(ptr<T>(x), ptr<T>(y), C);
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
    softmax_backward_kernel<<<static_cast<unsigned>(rows), 256, 0, stream()>>>(ptr<T>(y), ptr<T>(dy),
                                                                               ptr<T>(dx), C);
  });
  check_launch();
}

}  // namespace dtp::cuda
