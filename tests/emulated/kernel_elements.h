// What the emulated tests share: a tensor's elements as a kernel sees them.
// Include after emulated/cuda_emulator.h (its 16-bit types).
#pragma once

#include "dtp/tensor.h"

namespace dtp::emulated {

/// Calls fn(T{}) with the kernels' element type for @p dtype: float, or the
/// emulator's bf16 and f16 structs.
template <typename Fn>
void with_element(DType dtype, Fn&& fn) {
  if (dtype == DType::bf16)
    fn(__nv_bfloat16{});
  else if (dtype == DType::f16)
    fn(__half{});
  else
    fn(float{});
}

/// A CPU tensor's storage as the kernel's pointer type.
template <typename T>
T* ptr(Tensor& t) {
  return static_cast<T*>(t.raw());
}
template <typename T>
const T* ptr(const Tensor& t) {
  return static_cast<const T*>(t.raw());
}

}  // namespace dtp::emulated
