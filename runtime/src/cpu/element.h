// Internal: run typed code for a runtime DType, and convert elements to and
// from double. bf16/f16 go through float.
#pragma once

#include <cstdint>
#include <type_traits>

#include "dtp/dtype.h"

namespace dtp::detail {

/// Calls fn(T{}) with T the storage type of @p dtype.
template <typename Fn>
void with_element(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f64:
      fn(double{});
      break;
    case DType::f32:
      fn(float{});
      break;
    case DType::bf16:
      fn(bf16{});
      break;
    case DType::f16:
      fn(f16{});
      break;
    case DType::i32:
      fn(std::int32_t{});
      break;
  }
}

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return float_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, f16>)
    return float_to_f16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16_to_float(v);
  else if constexpr (std::is_same_v<T, f16>)
    return f16_to_float(v);
  else
    return static_cast<double>(v);
}

/// True for the 16-bit storage types, bf16 and f16.
template <typename T>
inline constexpr bool is_half_type = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

/// The type arithmetic happens in: float for the 16-bit storage types.
template <typename T>
using compute_t = std::conditional_t<is_half_type<T>, float, T>;

}  // namespace dtp::detail
