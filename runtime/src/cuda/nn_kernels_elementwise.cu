// Element-wise nn kernels: add/axpy, sum of squares, finite check, casts,
// bias, GELU, and the optimizer updates on flat buffers. All are memory
// bound: one grid-stride pass, coalesced, nothing kept between elements.
#include <algorithm>
#include <cmath>

#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {
using nn::check_launch;
using nn::check_same;
using nn::grid_for;
using nn::ptr;
using nn::stream;

#define DTP_GRID_STRIDE(i, n)                                                                  \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* out, std::int64_t n) {
  DTP_GRID_STRIDE(i, n) store(out, i, load(a, i) + load(b, i));
}

template <typename T>
__global__ void axpy_kernel(T* y, float alpha, const T* x, std::int64_t n) {
  DTP_GRID_STRIDE(i, n) store(y, i, load(y, i) + alpha * load(x, i));
}

// Each block writes its partial sum (in double, like the CPU) to
// partial[blockIdx.x]; sum_in_order adds them (the same bits on every run).
template <typename T>
__global__ void sum_squares_kernel(const T* x, std::int64_t n, double* partial) {
  __shared__ double shared[32];
  double acc = 0;
  DTP_GRID_STRIDE(i, n) {
    const double v = static_cast<double>(load(x, i));
    acc += v * v;
  }
  acc = nn::block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <typename T>
__device__ __forceinline__ double to_double(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return static_cast<double>(__bfloat162float(v));
  else if constexpr (std::is_same_v<T, __half>) return static_cast<double>(__half2float(v));
  else return static_cast<double>(v);
}

template <typename T>
__global__ void nonfinite_kernel(const T* x, std::int64_t n, int* found) {
  DTP_GRID_STRIDE(i, n) {
    if (!isfinite(to_double(x[i]))) {
      *found = 1;  // benign race: every writer writes 1
      return;
    }
  }
}

template <typename S, typename D>
__global__ void cast_kernel(const S* src, D* dst, std::int64_t n) {
  DTP_GRID_STRIDE(i, n) {
    const double v = to_double(src[i]);
    if constexpr (std::is_same_v<D, std::int32_t>) dst[i] = static_cast<std::int32_t>(v);  // truncates
    else dst[i] = from_double<D>(v);
  }
}

template <typename T>
__global__ void add_bias_kernel(T* x, const T* bias, std::int64_t n, std::int64_t C) {
  DTP_GRID_STRIDE(i, n) store(x, i, load(x, i) + load(bias, i % C));
}

// dbias[c] += sum over rows of dy[r, c], in two passes with a fixed order of
// additions (nn_kernels_common.cuh: row_slices). Enough slices are made to
// fill the GPU: C = 768 with one thread per column gave 6 blocks.
template <typename T>
__global__ void bias_partial_kernel(const T* dy, float* partial, std::int64_t rows, std::int64_t C,
                                    std::int64_t rows_per_slice) {
  __shared__ float tile[nn::kRowThreads][nn::kColumnBlock + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * nn::kColumnBlock + threadIdx.x;
  std::int64_t first, end;
  nn::slice_rows(rows, rows_per_slice, first, end);
  float acc = 0;
  if (c < C)
    for (std::int64_t r = first + threadIdx.y; r < end; r += nn::kRowThreads) acc += load(dy, r * C + c);
  tile[threadIdx.y][threadIdx.x] = acc;
  nn::write_slice_partial(tile, partial, c, C);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

template <typename T>
__global__ void gelu_forward_kernel(const T* x, T* y, std::int64_t n) {
  DTP_GRID_STRIDE(i, n) {
    const float v = load(x, i);
    store(y, i, 0.5f * v * (1.f + tanhf(kGeluScale * (v + kGeluCubic * v * v * v))));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, std::int64_t n) {
  DTP_GRID_STRIDE(i, n) {
    const float v = load(x, i);
    const float t = tanhf(kGeluScale * (v + kGeluCubic * v * v * v));
    const float dt = (1.f - t * t) * kGeluScale * (1.f + 3.f * kGeluCubic * v * v);
    store(dx, i, load(dy, i) * (0.5f * (1.f + t) + 0.5f * v * dt));
  }
}

template <typename T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, std::int64_t n, float b1, float b2,
                             float step_size, float inv_sqrt_bias2, float eps, float decay) {
  DTP_GRID_STRIDE(i, n) {
    const float grad = load(g, i);
    const float mi = b1 * load(m, i) + (1.f - b1) * grad;
    const float vi = b2 * load(v, i) + (1.f - b2) * grad * grad;
    store(m, i, mi);
    store(v, i, vi);
    const float pi = load(p, i);
    const float denom = sqrtf(vi) * inv_sqrt_bias2 + eps;
    store(p, i, pi - (step_size * mi / denom + decay * pi));
  }
}

template <typename T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, std::int64_t n, float lr, float mu, float wd,
                           bool nesterov) {
  DTP_GRID_STRIDE(i, n) {
    const float pi = load(p, i);
    const float grad = load(g, i) + wd * pi;
    if (buf == nullptr) {
      store(p, i, pi - lr * grad);
      continue;
    }
    const float b = mu * load(buf, i) + grad;
    store(buf, i, b);
    store(p, i, pi - lr * (nesterov ? grad + mu * b : b));
  }
}

}  // namespace

void fill_normal(Tensor& x, double mean, double std, Rng& rng) {
  // The draws are sequential (one Rng stream), so they are made on the host
  // and copied: the same seed gives the same values on every device.
  nn::check_gpu("fill_normal", "x", x);
  Tensor host = Tensor::empty(x.shape(), x.dtype(), Device::cpu());
  ops::fill_normal(host, mean, std, rng);
  x.copy_from(host);
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  nn::check_float(op, "a", a, a.device());
  check_same(op, "b", b, a);
  check_same(op, "out", out, a);
  detail::check_shape(op, "b", b, a.shape());
  detail::check_shape(op, "out", out, a.shape());
  const std::int64_t n = a.numel();
  if (n == 0) return;
  nn::use_device(a.device());
  nn::with_float(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    add_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<T>(a), ptr<T>(b), ptr<T>(out), n);
  });
  check_launch();
}

void axpy(Tensor& y, double alpha, const Tensor& x) {
  const char* op = "axpy";
  nn::check_float(op, "y", y, y.device());
  check_same(op, "x", x, y);
  detail::check_numel(op, "x", x, y.numel(), "as many as y");
  const std::int64_t n = y.numel();
  if (n == 0) return;
  nn::use_device(y.device());
  nn::with_float(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    axpy_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<T>(y), static_cast<float>(alpha), ptr<T>(x), n);
  });
  check_launch();
}

double sum_squares(const Tensor& x) {
  nn::check_float("sum_squares", "x", x, x.device());
  const std::int64_t n = x.numel();
  if (n == 0) return 0;
  nn::use_device(x.device());
  const unsigned blocks = grid_for(n, 512);
  Tensor partial = Tensor::empty({blocks}, DType::f64, x.device(), MemoryCategory::other);
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    sum_squares_kernel<<<blocks, 512, 0, stream()>>>(ptr<T>(x), n, ptr<double>(partial));
  });
  check_launch();
  return nn::sum_in_order(partial);  // copies to the host after the kernels (stream-ordered)
}

bool all_finite(const Tensor& x) {
  nn::check_gpu("all_finite", "x", x);
  const std::int64_t n = x.numel();
  if (n == 0 || x.dtype() == DType::i32) return true;
  nn::use_device(x.device());
  Tensor found = Tensor::zeros({1}, DType::i32, x.device());
  with_device_element(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (!std::is_same_v<T, std::int32_t>)
      nonfinite_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<T>(x), n, ptr<int>(found));
  });
  check_launch();
  return found.item(0) == 0;
}

void cast(const Tensor& src, Tensor& dst) {
  nn::check_gpu("cast", "src", src);
  nn::check_same_gpu("cast", "dst", dst, src.device());
  detail::check_numel("cast", "dst", dst, src.numel(), "as many as src");
  if (src.dtype() == dst.dtype()) {
    dst.copy_from(src);
    return;
  }
  const std::int64_t n = src.numel();
  if (n == 0) return;
  nn::use_device(src.device());
  with_device_element(src.dtype(), [&](auto src_zero) {
    using S = decltype(src_zero);
    with_device_element(dst.dtype(), [&](auto dst_zero) {
      using D = decltype(dst_zero);
      cast_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<S>(src), ptr<D>(dst), n);
    });
  });
  check_launch();
}

void add_bias(Tensor& x, const Tensor& bias) {
  const char* op = "add_bias";
  nn::check_float(op, "x", x, x.device());
  check_same(op, "bias", bias, x);
  const std::int64_t C = detail::last_dim(op, "x", x);
  detail::check_shape(op, "bias", bias, Shape{C});
  const std::int64_t n = x.numel();
  if (n == 0) return;
  nn::use_device(x.device());
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    add_bias_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<T>(x), ptr<T>(bias), n, C);
  });
  check_launch();
}

void bias_backward(const Tensor& dy, Tensor& dbias) {
  const char* op = "bias_backward";
  nn::check_float(op, "dy", dy, dy.device());
  check_same(op, "dbias", dbias, dy);
  const std::int64_t C = detail::last_dim(op, "dy", dy);
  detail::check_shape(op, "dbias", dbias, Shape{C});
  if (C == 0) return;
  nn::use_device(dy.device());
  const std::int64_t rows = nn::rows_of(dy, C);
  const nn::RowSlices s = nn::row_slices(rows, C);
  Tensor partial = Tensor::empty({s.slices * C}, DType::f32, dy.device(), MemoryCategory::activations);
  nn::with_float(dy.dtype(), [&](auto zero) {
    using T = decltype(zero);
    bias_partial_kernel<<<s.grid(), s.block(), 0, stream()>>>(ptr<T>(dy), ptr<float>(partial), rows, C,
                                                              s.rows_per_slice);
    nn::add_column_partials_kernel<<<grid_for(C), 256, 0, stream()>>>(ptr<float>(partial), ptr<T>(dbias), s.slices,
                                                                      C);
  });
  check_launch();
}

void gelu_forward(const Tensor& x, Tensor& y) {
  const char* op = "gelu_forward";
  nn::check_float(op, "x", x, x.device());
  check_same(op, "y", y, x);
  detail::check_shape(op, "y", y, x.shape());
  const std::int64_t n = x.numel();
  if (n == 0) return;
  nn::use_device(x.device());
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    gelu_forward_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<T>(x), ptr<T>(y), n);
  });
  check_launch();
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const char* op = "gelu_backward";
  nn::check_float(op, "x", x, x.device());
  check_same(op, "dy", dy, x);
  check_same(op, "dx", dx, x);
  detail::check_shape(op, "dy", dy, x.shape());
  detail::check_shape(op, "dx", dx, x.shape());
  const std::int64_t n = x.numel();
  if (n == 0) return;
  nn::use_device(x.device());
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    gelu_backward_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<T>(x), ptr<T>(dy), ptr<T>(dx), n);
  });
  check_launch();
}

void adamw_update(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, double lr,
                  double beta1, double beta2, double eps, double weight_decay, std::int64_t step) {
  const char* op = "adamw_update";
  nn::check_float(op, "params", params, params.device());
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"grads", &grads}, {"m", &m}, {"v", &v}}) {
    check_same(op, name, *t, params);
    detail::check_numel(op, name, *t, params.numel(), "as many as params");
  }
  DTP_CHECK(step >= 1, op, ": step counts from 1, got ", step);
  const std::int64_t n = params.numel();
  if (n == 0) return;
  // The same scalars as the CPU kernel, computed in double on the host.
  const double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  nn::use_device(params.device());
  nn::with_float(params.dtype(), [&](auto zero) {
    using T = decltype(zero);
    adamw_kernel<<<grid_for(n), 256, 0, stream()>>>(
        ptr<T>(params), ptr<T>(grads), ptr<T>(m), ptr<T>(v), n, static_cast<float>(beta1),
        static_cast<float>(beta2), static_cast<float>(lr / bias1),
        static_cast<float>(1.0 / std::sqrt(bias2)), static_cast<float>(eps),
        static_cast<float>(lr * weight_decay));
  });
  check_launch();
}

void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, double lr,
                double momentum, double weight_decay, bool nesterov) {
  const char* op = "sgd_update";
  nn::check_float(op, "params", params, params.device());
  check_same(op, "grads", grads, params);
  detail::check_numel(op, "grads", grads, params.numel(), "as many as params");
  const bool use_momentum = momentum != 0.0;
  if (use_momentum) {
    check_same(op, "momentum_buffer", momentum_buffer, params);
    detail::check_numel(op, "momentum_buffer", momentum_buffer, params.numel(), "as many as params");
  }
  const std::int64_t n = params.numel();
  if (n == 0) return;
  nn::use_device(params.device());
  nn::with_float(params.dtype(), [&](auto zero) {
    using T = decltype(zero);
    sgd_kernel<<<grid_for(n), 256, 0, stream()>>>(
        ptr<T>(params), ptr<T>(grads), use_momentum ? ptr<T>(momentum_buffer) : nullptr, n,
        static_cast<float>(lr), static_cast<float>(momentum), static_cast<float>(weight_decay),
        nesterov);
  });
  check_launch();
}

}  // namespace dtp::cuda
