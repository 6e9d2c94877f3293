#include "cpu/widen.h"

#include "cpu/nn_ops_common.h"
#include "dtp/nn_ops.h"

namespace dtp::detail {

Tensor& Widened::widen(const char* name, const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::i32) return const_cast<Tensor&>(t);
  check_dtype_is(op_, name, t, dtype_);
  Tensor& copy = copies_.emplace_back(Tensor::empty(t.shape(), DType::f32, t.device()));
  ops::cast(t, copy);  // exact
  return copy;
}

void Widened::store() {
  for (auto& [half, copy] : outputs_) ops::cast(*copy, *half);  // rounds to nearest even
  outputs_.clear();
}

}  // namespace dtp::detail
