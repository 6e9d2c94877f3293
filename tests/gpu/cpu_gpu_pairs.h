// Shared by the GPU checkers: a CPU tensor and its GPU twin made from the
// same seed, an element-wise comparison that names the worst element, and
// the small GPT they train.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dtp/nn.h"
#include "dtp/tensor.h"

namespace dtp::testing {

inline const Device kGpu = Device::cuda(0);

inline Tensor rand_on(Device device, const Shape& shape, std::uint64_t seed, double low = -1,
                      double high = 1, DType dtype = DType::f32) {
  return Tensor::random_uniform(shape, seed, low, high, dtype, device);
}

// A CPU tensor and its GPU twin with the same values.
struct Pair {
  Tensor cpu, gpu;
};
inline Pair rand_pair(const Shape& shape, std::uint64_t seed, double low = -1, double high = 1,
                      DType dtype = DType::f32) {
  return {rand_on(Device::cpu(), shape, seed, low, high, dtype),
          rand_on(kGpu, shape, seed, low, high, dtype)};
}
inline Pair zeros_pair(const Shape& shape, DType dtype = DType::f32) {
  return {Tensor::zeros(shape, dtype), Tensor::zeros(shape, dtype, kGpu)};
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Element-wise |gpu - cpu| <= atol + rtol |cpu|; reports the worst element.
inline void expect_close(const Tensor& gpu, const Tensor& cpu, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(gpu.numel(), cpu.numel()) << what;
  ASSERT_TRUE(gpu.device().is_cuda()) << what;
  const std::vector<double> g = gpu.to_vector(), c = cpu.to_vector();
  std::int64_t worst = -1;
  double worst_excess = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double err = std::abs(g[i] - c[i]), allowed = atol + rtol * std::abs(c[i]);
    if (!(err <= allowed) && (worst < 0 || err - allowed > worst_excess)) {
      worst = static_cast<std::int64_t>(i);
      worst_excess = err - allowed;
    }
  }
  EXPECT_LT(worst, 0) << what << ": element " << worst << " is " << (worst >= 0 ? g[worst] : 0)
                      << " on the GPU and " << (worst >= 0 ? c[worst] : 0) << " on the CPU (rtol "
                      << rtol << ", atol " << atol << ")";
}

/// The GPT the GPU checkers train: vocabulary 96, context 48, C = 64 with 4
/// heads, 2 blocks, on the CPU (set .device for its GPU twin).
inline GPTConfig small_gpt(AttentionKind kind, DType dtype = DType::f32) {
  GPTConfig config;
  config.vocab_size = 96;
  config.context = 48;
  config.d_model = 64;
  config.heads = 4;
  config.layers = 2;
  config.attention = kind;
  config.dtype = dtype;
  return config;
}

}  // namespace dtp::testing
