#include "cpu/widen.h"

#include "cpu/nn_ops_common.h"

namespace dtp::detail {

namespace {
void widen_into(DType dtype, const Tensor& half, Tensor& f32) {
  float* dst = f32.data<float>();
  const std::int64_t n = half.numel();
  if (dtype == DType::bf16) {
    const bf16* src = static_cast<const bf16*>(half.raw());
    for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  } else {
    const f16* src = static_cast<const f16*>(half.raw());
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(src[i]);
  }
}

void round_into(DType dtype, const Tensor& f32, Tensor& half) {
  const float* src = f32.data<float>();
  const std::int64_t n = half.numel();
  if (dtype == DType::bf16) {
    bf16* dst = static_cast<bf16*>(half.raw());
    for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
  } else {
    f16* dst = static_cast<f16*>(half.raw());
    for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_f16(src[i]);
  }
}
}  // namespace

Tensor& Widened::widen(const char* name, const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::i32) return const_cast<Tensor&>(t);
  check_cpu(op_, name, t);
  check_dtype_is(op_, name, t, dtype_);
  Tensor& copy = copies_.emplace_back(Tensor::empty(t.shape(), DType::f32));
  widen_into(dtype_, t, copy);
  return copy;
}

void Widened::store() {
  for (auto& [half, copy] : outputs_) round_into(dtype_, *copy, *half);
  outputs_.clear();
}

}  // namespace dtp::detail
