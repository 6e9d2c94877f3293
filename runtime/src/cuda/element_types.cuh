// Internal: the device-side element type of each DType and a dispatcher.
// bf16 and f16 compute in float. Device helpers here also compile under
// tests/emulated/cuda_emulator.h, which provides its own 16-bit types.
#pragma once

#ifndef DTP_CUDA_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstdint>
#include <type_traits>

#include "dtp/dtype.h"

namespace dtp::cuda {

template <typename T>
struct Compute {
  using type = T;
};
template <>
struct Compute<__nv_bfloat16> {
  using type = float;
};
template <>
struct Compute<__half> {
  using type = float;
};

template <typename T>
__device__ __forceinline__ typename Compute<T>::type load(const T* p, std::int64_t i) {
  return static_cast<typename Compute<T>::type>(p[i]);
}
/// @p v rounded to the storage type T (to nearest even for bf16 and f16).
template <typename T>
__device__ __forceinline__ T to_storage(typename Compute<T>::type v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else
    return v;
}
template <typename T>
__device__ __forceinline__ void store(T* p, std::int64_t i, typename Compute<T>::type v) {
  p[i] = to_storage<T>(v);
}
template <typename T>
__device__ __forceinline__ T from_double(double v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

/// Calls fn(T{}) with T the device storage type of @p dtype.
template <typename Fn>
void with_device_element(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f64:
      fn(double{});
      break;
    case DType::f32:
      fn(float{});
      break;
    case DType::bf16:
      fn(__nv_bfloat16{});
      break;
    case DType::f16:
      fn(__half{});
      break;
    case DType::i32:
      fn(std::int32_t{});
      break;
  }
}

/// A grid that covers @p count elements with grid-stride loops and does not
/// launch more blocks than the GPU can keep busy.
inline unsigned blocks_for(std::int64_t count, int threads = 256) {
  std::int64_t blocks = (count + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 4096) blocks = 4096;
  return static_cast<unsigned>(blocks);
}

}  // namespace dtp::cuda
