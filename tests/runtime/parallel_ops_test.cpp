// The CPU ops that spread over a rank's threads give the same bits at every
// thread count: each element (or row, or column sum) is computed by one
// thread in the same order whatever the split.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dtp/nn_ops.h"
#include "dtp/parallel.h"

namespace dtp {
namespace {

Tensor wavy(Shape shape, DType dtype, double phase) {
  const std::int64_t n = shape.numel();
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    values[static_cast<std::size_t>(i)] = std::sin(0.37 * i + phase) + 0.1 * phase;
  return Tensor::from_values(values, dtype).view(shape);
}

/// Runs @p op at 1 thread, then at 2 and 3, and compares every output's bits
/// with the 1-thread run.
void expect_same_bits_at_every_thread_count(const std::string& what,
                                            const std::function<std::vector<Tensor>()>& op) {
  set_compute_threads(1);
  const std::vector<Tensor> one = op();
  for (int threads : {2, 3}) {
    set_compute_threads(threads);
    const std::vector<Tensor> many = op();
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t k = 0; k < one.size(); ++k) {
      const std::vector<double> a = one[k].to_vector(), b = many[k].to_vector();
      for (std::size_t i = 0; i < a.size(); ++i)
        ASSERT_TRUE(std::memcmp(&a[i], &b[i], sizeof(double)) == 0)
            << what << ": output " << k << ", element " << i << ": " << b[i] << " at " << threads
            << " threads but " << a[i] << " at 1 thread";
    }
  }
  set_compute_threads(default_compute_threads());
}

// Big enough that every op splits into several parts (16384 elements each).
constexpr std::int64_t kRows = 1024, kWidth = 96;

TEST(ParallelOps, LayerNormForwardAndBackward) {
  for (DType dtype : {DType::f32, DType::f64}) {
    expect_same_bits_at_every_thread_count(std::string("layernorm ") + dtype_name(dtype), [&] {
      Tensor x = wavy({kRows, kWidth}, dtype, 0.5), w = wavy({kWidth}, dtype, 1.5),
             b = wavy({kWidth}, dtype, 2.5);
      Tensor y = Tensor::zeros({kRows, kWidth}, dtype), mean = Tensor::zeros({kRows}, dtype),
             rstd = Tensor::zeros({kRows}, dtype);
      ops::layernorm_forward(x, w, b, y, mean, rstd, 1e-5);
      Tensor dy = wavy({kRows, kWidth}, dtype, 3.5), dx = Tensor::zeros({kRows, kWidth}, dtype);
      Tensor dw = wavy({kWidth}, dtype, 4.5),
             db = wavy({kWidth}, dtype, 5.5);  // gradients accumulate
      ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
      return std::vector<Tensor>{y, mean, rstd, dx, dw, db};
    });
  }
}

TEST(ParallelOps, AdamWAndSgdUpdates) {
  for (DType dtype : {DType::f32, DType::f64}) {
    expect_same_bits_at_every_thread_count(std::string("adamw ") + dtype_name(dtype), [&] {
      Tensor p = wavy({kRows * kWidth}, dtype, 0.5), g = wavy({kRows * kWidth}, dtype, 1.5);
      Tensor m = wavy({kRows * kWidth}, dtype, 2.5), v = wavy({kRows * kWidth}, dtype, 3.5);
      ops::scale(v, 0.0);
      ops::adamw_update(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3);
      return std::vector<Tensor>{p, m, v};
    });
    expect_same_bits_at_every_thread_count(std::string("sgd ") + dtype_name(dtype), [&] {
      Tensor p = wavy({kRows * kWidth}, dtype, 0.5), g = wavy({kRows * kWidth}, dtype, 1.5);
      Tensor buffer = wavy({kRows * kWidth}, dtype, 2.5);
      ops::sgd_update(p, g, buffer, 1e-2, 0.9, 0.01, true);
      return std::vector<Tensor>{p, buffer};
    });
  }
}

TEST(ParallelOps, CrossEntropyForwardAndBackward) {
  constexpr std::int64_t kVocab = 200;
  std::vector<double> ids;
  for (std::int64_t n = 0; n < kRows; ++n) ids.push_back(static_cast<double>((n * 7) % kVocab));
  const Tensor targets = Tensor::from_values(ids, DType::i32);
  for (DType dtype : {DType::f32, DType::f64}) {
    expect_same_bits_at_every_thread_count(std::string("cross_entropy ") + dtype_name(dtype), [&] {
      Tensor logits = wavy({kRows, kVocab}, dtype, 0.5), losses = Tensor::zeros({kRows}, dtype);
      const double mean = ops::cross_entropy_forward(logits, targets, losses);
      Tensor dlogits = Tensor::zeros({kRows, kVocab}, dtype);
      ops::cross_entropy_backward(logits, targets, 0.5, dlogits);
      return std::vector<Tensor>{Tensor::from_values({mean}, DType::f64), losses, dlogits};
    });
  }
}

TEST(ParallelOps, Gelu) {
  for (DType dtype : {DType::f32, DType::f64}) {
    expect_same_bits_at_every_thread_count(std::string("gelu ") + dtype_name(dtype), [&] {
      Tensor x = wavy({kRows * kWidth}, dtype, 0.5), y = Tensor::zeros({kRows * kWidth}, dtype);
      ops::gelu_forward(x, y);
      Tensor dy = wavy({kRows * kWidth}, dtype, 1.5), dx = Tensor::zeros({kRows * kWidth}, dtype);
      ops::gelu_backward(x, dy, dx);
      return std::vector<Tensor>{y, dx};
    });
  }
}

}  // namespace
}  // namespace dtp
