// scale_rows and row_dot on the GPU. scale_rows is one thread per element
// (x is read and written once: bandwidth-bound); row_dot is one block per
// row with a block reduction, so each row's sum has a fixed order and the
// result is deterministic.
#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {
using nn::check_launch;
using nn::grid_for;
using nn::ptr;
using nn::stream;

template <typename T>
__global__ void scale_rows_kernel(T* x, const T* w, std::int64_t n, std::int64_t C) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    store(x, i, load(x, i) * load(w, i / C));
}

template <typename T>
__global__ void row_dot_kernel(const T* a, const T* b, T* out, std::int64_t C) {
  __shared__ float shared[32];
  const std::int64_t row = blockIdx.x;
  float total = 0.f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x)
    total += load(a, row * C + c) * load(b, row * C + c);
  total = nn::block_sum(total, shared);
  if (threadIdx.x == 0) store(out, row, total);
}
}  // namespace

void scale_rows(Tensor& x, const Tensor& w) {
  const char* op = "scale_rows";
  nn::check_float(op, "x", x, x.device());
  nn::check_same(op, "w", w, x);
  const std::int64_t C = detail::last_dim(op, "x", x);
  detail::check_numel(op, "w", w, nn::rows_of(x, C), "one weight per row of x");
  const std::int64_t n = x.numel();
  if (n == 0) return;
  nn::use_device(x.device());
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    scale_rows_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<T>(x), ptr<T>(w), n, C);
  });
  check_launch();
}

void row_dot(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "row_dot";
  nn::check_float(op, "a", a, a.device());
  nn::check_same(op, "b", b, a);
  nn::check_same(op, "out", out, a);
  detail::check_shape(op, "b", b, a.shape());
  const std::int64_t C = detail::last_dim(op, "a", a);
  const std::int64_t rows = nn::rows_of(a, C);
  detail::check_numel(op, "out", out, rows, "one per row of a");
  if (rows == 0) return;
  nn::use_device(a.device());
  nn::with_float(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    row_dot_kernel<<<static_cast<unsigned>(rows), 256, 0, stream()>>>(ptr<T>(a), ptr<T>(b),
                                                                      ptr<T>(out), C);
  });
  check_launch();
}

}  // namespace dtp::cuda
