// The inputs and expected results of the mma.sync layout check
// (mma_layout_kernel.cuh), shared by its GPU and emulated runs. The inputs
// are integers in [-2, 2], so every score is an integer of magnitude at most
// 256, exact in bf16 and f16, and every output is exact in f32: the kernel's
// results must equal these bit for bit, and a layout error shows as a wrong
// integer at a named place.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/mma_layout_shape.h"

namespace dtp::testing {

struct MmaLayoutCase {
  std::vector<float> a, keys,
      values;  // kLayoutRows x kLayoutWidth, then two kLayoutWidth squares; row-major
  std::vector<float> scores,
      out;  // expected: A K^T, then (A K^T) V, kLayoutRows x kLayoutWidth each
};

/// Integers in [-2, 2] with no symmetry a transposed or shifted load could hide behind.
inline float layout_value(int which, int row, int col) {
  return static_cast<float>((row * 131 + col * 71 + which * 37 + row * col) % 5 - 2);
}

inline MmaLayoutCase mma_layout_case() {
  constexpr int R = kLayoutRows, W = kLayoutWidth;
  MmaLayoutCase c;
  c.a.resize(R * W);
  c.keys.resize(W * W);
  c.values.resize(W * W);
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < W; ++k) c.a[r * W + k] = layout_value(0, r, k);
  for (int r = 0; r < W; ++r)
    for (int k = 0; k < W; ++k) {
      c.keys[r * W + k] = layout_value(1, r, k);
      c.values[r * W + k] = layout_value(2, r, k);
    }
  c.scores.assign(R * W, 0.f);
  c.out.assign(R * W, 0.f);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < W; ++j)
      for (int k = 0; k < W; ++k) c.scores[r * W + j] += c.a[r * W + k] * c.keys[j * W + k];
  for (int r = 0; r < R; ++r)
    for (int d = 0; d < W; ++d)
      for (int j = 0; j < W; ++j) c.out[r * W + d] += c.scores[r * W + j] * c.values[j * W + d];
  return c;
}

/// Fails at the first element that differs, naming its row and column.
inline void expect_layout_result(const std::vector<float>& got, const std::vector<float>& want,
                                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      ADD_FAILURE()
          << what << ": row " << i / kLayoutWidth << ", column " << i % kLayoutWidth << " is "
          << got[i] << ", expected " << want[i]
          << " (exact: the inputs are small integers). Rows 8 apart or columns 8 apart "
          << "swapped point at the g / g + 8 halves or the second register of a fragment.";
      return;
    }
}

}  // namespace dtp::testing
