#include "dtp/ops.h"

#include <algorithm>

#include "cpu/element.h"
#include "cuda/device_api.h"
#include "dtp/error.h"

namespace dtp {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

namespace ops {

namespace {
void check_same(const char* what, const Tensor& a, const Tensor& b) {
  DTP_CHECK(a.defined() && b.defined(), what, ": both tensors must be defined");
  DTP_CHECK(a.dtype() == b.dtype() && a.numel() == b.numel() && a.device() == b.device(), what,
            ": tensors must match in dtype, element count and device, got ", a.describe(), " and ",
            b.describe());
}

template <typename T, typename Combine>
void combine_into(T* dst, const T* src, std::int64_t n, Combine combine) {
  using C = detail::compute_t<T>;
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<C, T>) {
      dst[i] = combine(dst[i], src[i]);
    } else {
      dst[i] = detail::from_double<T>(combine(static_cast<C>(detail::to_double(dst[i])),
                                              static_cast<C>(detail::to_double(src[i]))));
    }
  }
}
}  // namespace

void accumulate(Tensor& dst, const Tensor& src, ReduceOp op) {
  check_same("accumulate", dst, src);
  DTP_CHECK(op != ReduceOp::avg,
            "accumulate: avg is not element-wise; accumulate with sum, then scale by 1/N");
  if (dst.device().is_cuda())
    return cuda::accumulate(dst.raw(), src.raw(), dst.dtype(), dst.numel(), op);
  detail::with_element(dst.dtype(), [&](auto zero) {
    using T = decltype(zero);
    using C = detail::compute_t<T>;
    T* d = static_cast<T*>(dst.raw());
    const T* s = static_cast<const T*>(src.raw());
    switch (op) {
      case ReduceOp::sum:
        combine_into(d, s, dst.numel(), [](C a, C b) { return a + b; });
        break;
      case ReduceOp::max:
        combine_into(d, s, dst.numel(), [](C a, C b) { return std::max(a, b); });
        break;
      case ReduceOp::min:
        combine_into(d, s, dst.numel(), [](C a, C b) { return std::min(a, b); });
        break;
      case ReduceOp::avg:
        break;
    }
  });
}

void scale(Tensor& x, double factor) {
  DTP_CHECK(x.defined(), "scale: tensor must be defined");
  DTP_CHECK(is_floating(x.dtype()), "scale: needs a floating dtype, got ", x.describe());
  if (x.device().is_cuda()) return cuda::scale(x.raw(), x.dtype(), x.numel(), factor);
  detail::with_element(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    using C = detail::compute_t<T>;
    T* p = static_cast<T*>(x.raw());
    for (std::int64_t i = 0, n = x.numel(); i < n; ++i)
      p[i] =
          detail::from_double<T>(static_cast<C>(detail::to_double(p[i])) * static_cast<C>(factor));
  });
}

bool equal(const Tensor& a, const Tensor& b) {
  check_same("equal", a, b);
  return a.to_vector() == b.to_vector();
}

}  // namespace ops
}  // namespace dtp
