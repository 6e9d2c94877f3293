// Element-wise nn ops: add/axpy, sum of squares, finite check, casts, bias,
// GELU, and the optimizer updates on flat buffers. The kernels are in
// elementwise_kernels.cuh (16-byte accesses where the pointers allow); this
// file checks arguments and launches them.
#include <cmath>

#include "cuda/elementwise_kernels.cuh"
#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {
using nn::check_launch;
using nn::check_same;
using nn::grid_for;
using nn::ptr;
using nn::stream;
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
    launch_elementwise<T>(
        n,
        [&](auto w, unsigned grid) {
          elementwise::add_kernel<T, decltype(w)::value>
              <<<grid, 256, 0, stream()>>>(ptr<T>(a), ptr<T>(b), ptr<T>(out), n);
        },
        ptr<T>(a), ptr<T>(b), ptr<T>(out));
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
    launch_elementwise<T>(
        n,
        [&](auto w, unsigned grid) {
          elementwise::axpy_kernel<T, decltype(w)::value>
              <<<grid, 256, 0, stream()>>>(ptr<T>(y), static_cast<float>(alpha), ptr<T>(x), n);
        },
        ptr<T>(y), ptr<T>(x));
  });
  check_launch();
}

namespace {

// Each block writes its partial sum (in double, like the CPU) to
// partial[blockIdx.x]; sum_in_order adds them (the same bits on every run).
template <typename T, int W>
__global__ void sum_squares_kernel(const T* x, std::int64_t n, double* partial) {
  __shared__ double shared[32];
  double acc = 0;
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    float v[V];
    vec::load<V>(x + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) acc += static_cast<double>(v[k]) * static_cast<double>(v[k]);
  });
  acc = nn::block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Queues the sum of squares of x into *total (device memory, f64): per-block
// partials (W elements per access), then their sum in a fixed order. Returns
// the partials, which must live until the stream has run both kernels.
Tensor queue_sum_squares(const Tensor& x, double* total) {
  nn::check_float("sum_squares", "x", x, x.device());
  nn::use_device(x.device());
  Tensor partial;
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    with_width<T>(
        [&](auto w) {
          constexpr int W = decltype(w)::value;
          const unsigned blocks = grid_for((x.numel() + W - 1) / W, 512);  // at least 1
          // Every block writes its partial, an empty x included (its one block adds nothing).
          partial = Tensor::empty({blocks}, DType::f64, x.device(), MemoryCategory::other);
          sum_squares_kernel<T, W>
              <<<blocks, 512, 0, stream()>>>(ptr<T>(x), x.numel(), ptr<double>(partial));
          nn::sum_in_order_kernel<256>
              <<<1, 256, 0, stream()>>>(ptr<double>(partial), blocks, total);
        },
        ptr<T>(x));
  });
  check_launch();
  return partial;
}

// Queues the search for an inf or NaN in x: *found becomes 1 if there is one.
void queue_nonfinite(const Tensor& x, int* found) {
  nn::check_gpu("all_finite", "x", x);
  const std::int64_t n = x.numel();
  if (n == 0 || x.dtype() == DType::i32) return;
  nn::use_device(x.device());
  with_device_element(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (!std::is_same_v<T, std::int32_t>)
      launch_elementwise<T>(
          n,
          [&](auto w, unsigned grid) {
            elementwise::nonfinite_kernel<T, decltype(w)::value>
                <<<grid, 256, 0, stream()>>>(ptr<T>(x), n, found);
          },
          ptr<T>(x));
  });
  check_launch();
}

}  // namespace

std::vector<double> sum_squares(const std::vector<Tensor>& xs) {
  if (xs.empty()) return {};
  Tensor totals = Tensor::zeros({static_cast<std::int64_t>(xs.size())}, DType::f64, xs[0].device(),
                                MemoryCategory::other);
  std::vector<Tensor> partials;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    nn::check_same_gpu("sum_squares", "every tensor", xs[i], xs[0].device());
    partials.push_back(queue_sum_squares(xs[i], ptr<double>(totals) + i));
  }
  return totals.to_vector();  // one wait: the copy to the host follows the kernels on the stream
}

double sum_squares(const Tensor& x) { return sum_squares(std::vector<Tensor>{x})[0]; }

bool all_finite(const std::vector<Tensor>& xs) {
  if (xs.empty()) return true;
  Tensor found = Tensor::zeros({1}, DType::i32, xs[0].device());
  for (const Tensor& x : xs) {
    nn::check_same_gpu("all_finite", "every tensor", x, xs[0].device());
    queue_nonfinite(x, ptr<int>(found));
  }
  return found.item(0) == 0;
}

bool all_finite(const Tensor& x) { return all_finite(std::vector<Tensor>{x}); }

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
      // 16 bytes of the wider type per access, when both pointers allow it.
      constexpr int W = vec::kWidth<std::conditional_t<(sizeof(S) > sizeof(D)), S, D>>;
      if (all_aligned(W, ptr<S>(src), ptr<D>(dst)))
        elementwise::cast_kernel<S, D, W>
            <<<grid_for((n + W - 1) / W), 256, 0, stream()>>>(ptr<S>(src), ptr<D>(dst), n);
      else
        elementwise::cast_kernel<S, D, 1>
            <<<grid_for(n), 256, 0, stream()>>>(ptr<S>(src), ptr<D>(dst), n);
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
    with_row_width<T>(
        C,
        [&](auto w) {
          constexpr int W = decltype(w)::value;
          elementwise::add_bias_kernel<T, W>
              <<<grid_for(n / W), 256, 0, stream()>>>(ptr<T>(x), ptr<T>(bias), n, C);
        },
        ptr<T>(x), ptr<T>(bias));
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
  nn::with_float(dy.dtype(), [&](auto zero) {
    using T = decltype(zero);
    with_row_width<T>(
        C,
        [&](auto w) {
          constexpr int W = decltype(w)::value;
          const nn::RowSlices s = nn::row_slices(rows, C, W);
          Tensor partial =
              Tensor::empty({s.slices * C}, DType::f32, dy.device(), MemoryCategory::activations);
          elementwise::bias_partial_kernel<T, W><<<s.grid(), s.block(), 0, stream()>>>(
              ptr<T>(dy), ptr<float>(partial), rows, C, s.rows_per_slice);
          nn::add_column_partials_kernel<<<grid_for(C), 256, 0, stream()>>>(
              ptr<float>(partial), ptr<T>(dbias), s.slices, C);
        },
        ptr<T>(dy));
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
    launch_elementwise<T>(
        n,
        [&](auto w, unsigned grid) {
          elementwise::gelu_forward_kernel<T, decltype(w)::value>
              <<<grid, 256, 0, stream()>>>(ptr<T>(x), ptr<T>(y), n);
        },
        ptr<T>(x), ptr<T>(y));
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
    launch_elementwise<T>(
        n,
        [&](auto w, unsigned grid) {
          elementwise::gelu_backward_kernel<T, decltype(w)::value>
              <<<grid, 256, 0, stream()>>>(ptr<T>(x), ptr<T>(dy), ptr<T>(dx), n);
        },
        ptr<T>(x), ptr<T>(dy), ptr<T>(dx));
  });
  check_launch();
}

void adamw_update(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, double lr,
                  double beta1, double beta2, double eps, double weight_decay, std::int64_t step) {
  const char* op = "adamw_update";
  nn::check_float(op, "params", params, params.device());
  for (auto [name, t] :
       {std::pair<const char*, const Tensor*>{"grads", &grads}, {"m", &m}, {"v", &v}}) {
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
    const elementwise::AdamWScalars scalars{
        static_cast<float>(beta1),      static_cast<float>(beta2),
        static_cast<float>(lr / bias1), static_cast<float>(1.0 / std::sqrt(bias2)),
        static_cast<float>(eps),        static_cast<float>(lr * weight_decay)};
    launch_elementwise<T>(
        n,
        [&](auto w, unsigned grid) {
          elementwise::adamw_kernel<T, decltype(w)::value><<<grid, 256, 0, stream()>>>(
              ptr<T>(params), ptr<T>(grads), ptr<T>(m), ptr<T>(v), n, scalars);
        },
        ptr<T>(params), ptr<T>(grads), ptr<T>(m), ptr<T>(v));
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
    detail::check_numel(op, "momentum_buffer", momentum_buffer, params.numel(),
                        "as many as params");
  }
  const std::int64_t n = params.numel();
  if (n == 0) return;
  nn::use_device(params.device());
  nn::with_float(params.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* buffer = use_momentum ? ptr<T>(momentum_buffer) : nullptr;
    launch_elementwise<T>(
        n,
        [&](auto w, unsigned grid) {
          elementwise::sgd_kernel<T, decltype(w)::value><<<grid, 256, 0, stream()>>>(
              ptr<T>(params), ptr<T>(grads), buffer, n, static_cast<float>(lr),
              static_cast<float>(momentum), static_cast<float>(weight_decay), nesterov);
        },
        ptr<T>(params), ptr<T>(grads), static_cast<const T*>(buffer));
  });
  check_launch();
}

}  // namespace dtp::cuda
