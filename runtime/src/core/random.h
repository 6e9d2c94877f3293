// Internal: seeded, counter-based random numbers that the CPU and the GPU
// compute identically, so a tensor filled on either device holds the same
// values (CPU/CUDA agreement tests rely on it). splitmix64 of (seed, index).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DTP_HOST_DEVICE __host__ __device__
#else
#define DTP_HOST_DEVICE
#endif

namespace dtp::detail {

DTP_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Uniform in [low, high) for element @p index of the stream @p seed.
DTP_HOST_DEVICE inline double random_uniform_value(std::uint64_t seed, std::int64_t index,
                                                   double low, double high) {
  std::uint64_t bits = mix64(mix64(seed) ^ static_cast<std::uint64_t>(index));
  double unit = static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // 53 bits (exact)
#ifdef __CUDA_ARCH__
  // nvcc contracts low + span * unit into one fused multiply-add, rounded
  // once where the host rounds the product and the sum separately: values an
  // ulp apart. The _rn intrinsics round each step and are never fused.
  return __dadd_rn(low, __dmul_rn(high - low, unit));
#else
  // Two statements: Clang's default contraction works within one expression
  // only, and GCC contracts none in ISO C++ (CMAKE_CXX_EXTENSIONS is OFF).
  const double offset = (high - low) * unit;
  return low + offset;
#endif
}

}  // namespace dtp::detail
