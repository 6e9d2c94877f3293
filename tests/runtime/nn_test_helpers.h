// Helpers for the nn checkers: seeded random tensors and finite-difference
// gradients. Every gradient check here runs in f64 with central differences,
// step h = 1e-5, and accepts |analytic - numeric| <= 1e-6 * max(|a|, |n|) + 1e-8.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "dtp/nn.h"
#include "dtp/nn_ops.h"
#include "dtp/tensor.h"

namespace dtp::testing {

inline constexpr double kFiniteDifferenceStep = 1e-5;
inline constexpr double kGradientRelativeTolerance = 1e-6;
inline constexpr double kGradientAbsoluteTolerance = 1e-8;

/// The tiny f64 GPT the nn checkers share: vocabulary 7, context 6, C = 8
/// with 2 heads, 2 blocks, MLP ratio 2, and a large init (0.4) so that every
/// path carries real gradient. Callers set the seed, attention or experts.
inline GPTConfig tiny_f64_config() {
  GPTConfig c;
  c.vocab_size = 7;
  c.context = 6;
  c.d_model = 8;
  c.heads = 2;
  c.layers = 2;
  c.mlp_ratio = 2;
  c.init_std = 0.4;
  c.dtype = DType::f64;
  return c;
}

/// Normal(0, scale) values from @p rng.
inline Tensor random_tensor(const Shape& shape, Rng& rng, double scale = 1.0,
                            DType dtype = DType::f64) {
  Tensor t = Tensor::empty(shape, dtype);
  ops::fill_normal(t, 0.0, scale, rng);
  return t;
}

/// Token ids uniform in [0, vocab).
inline Tensor random_ids(const Shape& shape, int vocab, Rng& rng) {
  Tensor t = Tensor::empty(shape, DType::i32);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.below(vocab));
  return t;
}

/// sum(out * weights) in double: a scalar whose gradient w.r.t. out is weights.
inline double weighted_sum(const Tensor& out, const Tensor& weights) {
  double total = 0;
  for (std::int64_t i = 0; i < out.numel(); ++i) total += out.item(i) * weights.item(i);
  return total;
}

/// d f / d x[i] for every element of x by central differences (x is restored).
inline std::vector<double> numeric_gradient(Tensor x, const std::function<double()>& f,
                                            double h = kFiniteDifferenceStep) {
  std::vector<double> grad(static_cast<std::size_t>(x.numel()));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double saved = x.item(i);
    x.set_item(i, saved + h);
    const double plus = f();
    x.set_item(i, saved - h);
    const double minus = f();
    x.set_item(i, saved);
    grad[static_cast<std::size_t>(i)] = (plus - minus) / (2 * h);
  }
  return grad;
}

/// Compares an analytic gradient with a numeric one; names the worst element.
inline ::testing::AssertionResult gradients_match(const std::string& what, const Tensor& analytic,
                                                  const std::vector<double>& numeric,
                                                  double rtol = kGradientRelativeTolerance,
                                                  double atol = kGradientAbsoluteTolerance) {
  if (analytic.numel() != static_cast<std::int64_t>(numeric.size()))
    return ::testing::AssertionFailure() << what << ": analytic gradient has " << analytic.numel()
                                         << " elements, numeric " << numeric.size();
  int bad = 0;
  std::ostringstream first;
  double max_abs = 0;
  for (std::int64_t i = 0; i < analytic.numel(); ++i) {
    const double a = analytic.item(i), n = numeric[static_cast<std::size_t>(i)];
    max_abs = std::max(max_abs, std::abs(n));
    if (!(std::abs(a - n) <= rtol * std::max(std::abs(a), std::abs(n)) + atol)) {
      if (bad < 5) first << "\n  element " << i << ": analytic " << a << ", numeric " << n;
      ++bad;
    }
  }
  if (bad > 0)
    return ::testing::AssertionFailure()
           << what << ": " << bad << " of " << analytic.numel()
           << " gradient elements differ from finite differences" << first.str();
  if (max_abs == 0 && analytic.numel() > 0)
    return ::testing::AssertionFailure()
           << what << ": every gradient is zero: the check is vacuous";
  return ::testing::AssertionSuccess();
}

/// Checks every unit's gradient after model.backward() (which the caller
/// has run once on tokens and targets, from zeroed gradients) against central
/// differences of the model's loss; @p label names the model in messages.
inline void expect_model_gradients_match(GPT& model, const Tensor& tokens, const Tensor& targets,
                                         const std::string& label) {
  auto loss = [&] {
    const double value = model.forward(tokens, targets);
    model.release_activations();
    return value;
  };
  for (Unit* unit : model.units())
    EXPECT_TRUE(gradients_match(label + " unit " + unit->name(), unit->grads(),
                                numeric_gradient(unit->params(), loss)));
}

/// Largest |a[i] - b[i]|.
inline double max_difference(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(a.item(i) - b.item(i)));
  return worst;
}

}  // namespace dtp::testing
