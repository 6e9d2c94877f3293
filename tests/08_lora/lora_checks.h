// The chapter 08 checkers' own pieces: seeded tensors, the checker's own
// full-rank LoRA arithmetic (written out with loops in f64, not with the code
// under test), and comparisons that say what a wrong value looks like.
//
// Where they run: the checker's device (DTP_DEVICE; the GPU in the gpu
// flavour). On the CPU the tensors are f64 and each check keeps the tolerance
// it names (1e-13 of the largest value, say). A GPU has no f64 kernels: there
// the tensors are f32 and the matrix products use TF32 tensor cores, which
// round their inputs to 10 mantissa bits (2^-11 relative, about 5e-4), so a
// product of a few terms agrees with the checker's f64 loops to about 1e-3 of
// its largest value. The GPU tolerances below say so; every mistake the
// messages decode (a missing part, a flipped sign, s applied twice) is off by
// far more. Comparisons that hold bit for bit hold on both.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "08_lora/lora.h"
#include "support/training.h"

namespace dtp::testing::ch08 {

/// The checkers' device and dtype: f64 on the CPU, f32 on a GPU.
inline Device device() { return checker_device(); }
inline DType dtype() { return device().is_cuda() ? DType::f32 : DType::f64; }
inline bool on_gpu() { return device().is_cuda(); }

/// A check's tolerance: @p f64 on the CPU; on a GPU, @p gpu (TF32 products
/// agree with f64 loops to about 1e-3 of the largest value; longer chains,
/// a whole model's backward, need more).
inline double tolerance(double f64, double gpu = 5e-3) { return on_gpu() ? gpu : f64; }

/// The relative rounding of one stored value of dtype(): 2^-53 or 2^-24.
inline double unit_roundoff() { return on_gpu() ? 0x1p-24 : 0x1p-53; }

/// The tiny training config of every training chapter (f64 on the CPU), in
/// dtype() on device(), or on @p on when given (a rank's comm.device()).
inline TrainConfig lora_tiny_config(std::int64_t global_batch = 12, std::int64_t steps = 3,
                                    Device on = checker_device()) {
  TrainConfig config = tiny_config(global_batch, steps);
  config.model.device = on;
  config.model.dtype = on.is_cuda() ? DType::f32 : DType::f64;
  return config;
}

/// @p values as a tensor of @p shape in dtype() on device().
inline Tensor on_device(const std::vector<double>& values, const Shape& shape) {
  return Tensor::from_values(values, dtype()).view(shape).to(device());
}

/// A tensor of @p shape with values from normal-ish draws of @p seed, in
/// dtype() on device(): on a GPU, the f64 draws rounded to f32.
inline Tensor seeded(Shape shape, std::uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<double> values(static_cast<std::size_t>(shape.numel()));
  for (double& v : values) v = scale * (2.0 * rng.uniform() - 1.0);
  return on_device(values, shape);
}

/// "" when @p got holds exactly @p expected's values, else the first element that differs.
inline std::string bitwise(const std::string& what, const Tensor& expected, const Tensor& got) {
  const std::vector<double> e = expected.to_vector(), g = got.to_vector();
  if (e.size() != g.size())
    return what + ": " + std::to_string(g.size()) + " elements, expected " +
           std::to_string(e.size());
  for (std::size_t i = 0; i < e.size(); ++i)
    if (!(e[i] == g[i])) {
      std::ostringstream m;
      m.precision(17);
      m << what << ": element " << i << " is " << g[i] << ", expected exactly " << e[i];
      return m.str();
    }
  return "";
}

/// A row-major matrix of doubles read from a [rows, cols] (or [..., cols]) tensor.
struct Matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> v;
  double& at(std::int64_t r, std::int64_t c) { return v[static_cast<std::size_t>(r * cols + c)]; }
  double at(std::int64_t r, std::int64_t c) const {
    return v[static_cast<std::size_t>(r * cols + c)];
  }
};
inline Matrix matrix(const Tensor& t) {
  Matrix m;
  m.cols = t.size(t.ndim() - 1);
  m.rows = t.numel() / m.cols;
  m.v = t.to_vector();
  return m;
}
inline Matrix zeros(std::int64_t rows, std::int64_t cols) {
  return {rows, cols, std::vector<double>(rows * cols, 0.0)};
}
/// op(a) op(b) in plain loops (the checker's own product).
inline Matrix product(const Matrix& a, bool ta, const Matrix& b, bool tb) {
  const std::int64_t m = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols, n = tb ? b.rows : b.cols;
  Matrix out = zeros(m, n);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::int64_t p = 0; p < k; ++p)
        sum += (ta ? a.at(p, i) : a.at(i, p)) * (tb ? b.at(j, p) : b.at(p, j));
      out.at(i, j) = sum;
    }
  return out;
}
inline Matrix plus(const Matrix& a, double s, const Matrix& b) {
  Matrix out = a;
  for (std::size_t i = 0; i < out.v.size(); ++i) out.v[i] += s * b.v[i];
  return out;
}

/// The full-rank weight the adapter stands for: W + s B A.
inline Matrix effective_weight(const Tensor& w, const Tensor& a, const Tensor& b, double s) {
  return plus(matrix(w), s, product(matrix(b), false, matrix(a), false));
}

/// "" when @p got matches @p expected within a relative @p tolerance of the
/// largest expected magnitude; else the first wrong element, both values,
/// and what the whole tensor looks like against @p expected and @p base
/// (the value without the adapter's part): missing, scaled, or another sign.
inline std::string compare(const std::string& what, const Matrix& expected, const Matrix& got,
                           double tolerance, const Matrix* base = nullptr) {
  if (expected.v.size() != got.v.size())
    return what + ": expected " + std::to_string(expected.v.size()) + " elements, got " +
           std::to_string(got.v.size());
  double largest = 0;
  for (double e : expected.v) largest = std::max(largest, std::fabs(e));
  std::int64_t first = -1, wrong = 0;
  for (std::size_t i = 0; i < expected.v.size(); ++i)
    if (!(std::fabs(expected.v[i] - got.v[i]) <= tolerance * std::max(largest, 1e-300))) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++wrong;
    }
  if (first < 0) return "";
  std::ostringstream m;
  m.precision(12);
  const std::size_t f = static_cast<std::size_t>(first);
  m << what << ": element " << first << " (row " << first / expected.cols << ", column "
    << first % expected.cols << ") is " << got.v[f] << ", expected " << expected.v[f] << "; "
    << wrong << " of " << expected.v.size() << " elements are off by more than " << tolerance
    << " of the largest (" << largest << ")";
  if (base) {  // got = expected - base: the value that was there is gone
    bool overwrote = true;
    for (std::size_t i = 0; i < expected.v.size() && overwrote; ++i)
      overwrote = std::fabs(got.v[i] - (expected.v[i] - base->v[i])) <=
                  tolerance * std::max(largest, 1e-300) + 1e-12;
    if (overwrote)
      return m.str() +
             ". got is exactly the expected change without what the tensor held before: it was "
             "overwritten, not added to (matmul's beta = 1 accumulates)";
  }
  // The ratio of got's adapter part to expected's, fitted over all elements.
  double num = 0, den = 0;
  for (std::size_t i = 0; i < expected.v.size(); ++i) {
    const double e = expected.v[i] - (base ? base->v[i] : 0.0),
                 g = got.v[i] - (base ? base->v[i] : 0.0);
    num += e * g;
    den += e * e;
  }
  if (den > 0) {
    const double ratio = num / den;
    m << ". Fitted over every element, got" << (base ? "'s adapter part" : "") << " is "
      << std::setprecision(3) << ratio << "x the expected";
    if (std::fabs(ratio) < 1e-9)
      m << (base ? ": the adapter's part is missing" : ": zero");
    else if (std::fabs(ratio + 1) < 1e-6)
      m << ": the sign is flipped";
    else if (std::fabs(ratio - 1) > 1e-6)
      m << ": a wrong scale (s = alpha / r applied twice, or not at all?)";
  }
  return m.str();
}

}  // namespace dtp::testing::ch08
