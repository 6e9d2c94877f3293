// Softmax cross-entropy, fused (llm.c style): one block per row computes the
// row's max and sum of exponentials in a single online pass; the forward
// writes only the loss, the backward overwrites the row with its gradient
// (in place when dlogits aliases logits). Probabilities never reach memory.
#include <limits>

#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

void check_token_ids(const char* op, const char* what, const Tensor& ids, std::int64_t V);  // nn_kernels_embedding.cu

namespace {
using nn::check_launch;
using nn::ptr;
using nn::stream;

constexpr int kThreads = 512;

// log(sum(exp(row))) of one row, every thread of the block gets it.
template <typename T>
__device__ float row_logsumexp(const T* row, std::int64_t V, nn::MaxSum* shared) {
  nn::MaxSum ms{-INFINITY, 0.f};
  for (std::int64_t c = threadIdx.x; c < V; c += blockDim.x) ms = nn::merge(ms, {load(row, c), 1.f});
  ms = nn::block_merge(ms, shared);
  return ms.m + logf(ms.s);
}

// Each row's loss goes to row_loss (f32 values in f64: the mean is summed in
// f64 like the CPU's, in a fixed order by sum_in_order) and, rounded, to losses.
template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, const std::int32_t* targets, T* losses,
                                             double* row_loss, std::int64_t V) {
  __shared__ nn::MaxSum shared[32];
  const T* row = logits + blockIdx.x * V;
  const float lse = row_logsumexp(row, V, shared);
  if (threadIdx.x == 0) {
    const float loss = lse - load(row, targets[blockIdx.x]);
    if (losses != nullptr) store(losses, blockIdx.x, loss);
    row_loss[blockIdx.x] = static_cast<double>(loss);
  }
}

template <typename T>
__global__ void cross_entropy_backward_kernel(const T* logits, const std::int32_t* targets, float scale,
                                              T* dlogits, std::int64_t V) {
  __shared__ nn::MaxSum shared[32];
  const T* row = logits + blockIdx.x * V;
  T* grad = dlogits + blockIdx.x * V;  // may be the same memory as row
  const float lse = row_logsumexp(row, V, shared);
  const std::int32_t target = targets[blockIdx.x];
  for (std::int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    float g = expf(load(row, c) - lse) * scale;
    if (c == target) g -= scale;
    store(grad, c, g);
  }
}

detail::LogitRows check_logits(const char* op, const Tensor& logits, const Tensor& targets) {
  nn::check_float(op, "logits", logits, logits.device());
  nn::check_same_gpu(op, "targets", targets, logits.device());
  return detail::logit_rows(op, logits, targets);
}
}  // namespace

double cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses) {
  const char* op = "cross_entropy_forward";
  const detail::LogitRows r = check_logits(op, logits, targets);
  if (losses.defined()) {
    nn::check_float(op, "losses", losses, logits.device());
    detail::check_dtype_is(op, "losses", losses, logits.dtype());
    detail::check_numel(op, "losses", losses, r.N, "one per row of logits");
  }
  if (r.N == 0) return 0.0;
  nn::use_device(logits.device());
  check_token_ids(op, "target", targets, r.V);
  Tensor row_loss = Tensor::empty({r.N}, DType::f64, logits.device(), MemoryCategory::other);
  nn::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cross_entropy_forward_kernel<<<static_cast<unsigned>(r.N), kThreads, 0, stream()>>>(
        ptr<T>(logits), ptr<std::int32_t>(targets), losses.defined() ? ptr<T>(losses) : nullptr,
        ptr<double>(row_loss), r.V);
  });
  check_launch();
  return nn::sum_in_order(row_loss) / static_cast<double>(r.N);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, double loss_scale,
                            Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  const detail::LogitRows r = check_logits(op, logits, targets);
  nn::check_float(op, "dlogits", dlogits, logits.device());
  detail::check_dtype_is(op, "dlogits", dlogits, logits.dtype());
  detail::check_shape(op, "dlogits", dlogits, logits.shape());
  if (r.N == 0) return;
  nn::use_device(logits.device());
  // Targets were validated by the forward; the kernel reads them as given.
  nn::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cross_entropy_backward_kernel<<<static_cast<unsigned>(r.N), kThreads, 0, stream()>>>(
        ptr<T>(logits), ptr<std::int32_t>(targets), static_cast<float>(loss_scale), ptr<T>(dlogits), r.V);
  });
  check_launch();
}

}  // namespace dtp::cuda
