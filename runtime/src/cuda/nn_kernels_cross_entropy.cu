// Softmax cross-entropy: argument checks and launches (the kernels are in
// cross_entropy_kernels.cuh).
#include <limits>

#include "cuda/cross_entropy_kernels.cuh"
#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

void check_token_ids(const char* op, const char* what, const Tensor& ids,
                     std::int64_t V);  // nn_kernels_embedding.cu

namespace {
using nn::check_launch;
using nn::ptr;
using nn::stream;

using cross_entropy::kThreads;

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
    with_row_width<T>(
        r.V,
        [&](auto w) {
          cross_entropy::forward_kernel<T, decltype(w)::value>
              <<<static_cast<unsigned>(r.N), kThreads, 0, stream()>>>(
                  ptr<T>(logits), ptr<std::int32_t>(targets),
                  losses.defined() ? ptr<T>(losses) : nullptr, ptr<double>(row_loss), r.V);
        },
        ptr<T>(logits));
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
    with_row_width<T>(
        r.V,
        [&](auto w) {
          cross_entropy::backward_kernel<T, decltype(w)::value>
              <<<static_cast<unsigned>(r.N), kThreads, 0, stream()>>>(
                  ptr<T>(logits), ptr<std::int32_t>(targets), static_cast<float>(loss_scale),
                  ptr<T>(dlogits), r.V);
        },
        ptr<T>(logits), static_cast<const T*>(ptr<T>(dlogits)));
  });
  check_launch();
}

}  // namespace dtp::cuda
