// Checkers for 7.3: the dynamic loss scaler (GradScaler's semantics).
//
// The expected schedule comes from the checker's own three-line model of
// GradScaler; the expected step from the runtime's optimizer run on copies
// (unscale, clip, step, in that order). Scales are powers of two, so
// dividing by the scale and multiplying by its inverse are both exact and
// every comparison is bitwise. The gradients live on the checker's device
// (the GPU in the gpu flavour).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "07_mixed_precision/mixed_precision.h"
#include "dtp/dtp.h"
#include "dtp/optim.h"
#include "support/harness.h"

namespace dtp::ch07 {
namespace {

// GradScaler's schedule, written out: the expected (scale, good steps) after each update.
struct Schedule {
  double scale;
  std::int64_t good = 0;
  void update(bool bad, const ScalerConfig& c) {
    if (bad) {
      scale *= c.backoff_factor;
      good = 0;
    } else if (++good == c.growth_interval) {
      scale *= c.growth_factor;
      good = 0;
    }
  }
};

std::string flags(const std::vector<bool>& bad, std::size_t upto) {
  std::string text;
  for (std::size_t i = 0; i <= upto; ++i) text += bad[i] ? "X" : ".";
  return text;
}

TEST(Puzzle7_3_loss_scaler, UpdateFollowsTheGradScalerSchedule) {
  const ScalerConfig config{1024.0, 2.0, 0.5, 3};
  // . good step, X a step with a non-finite gradient.
  const std::vector<bool> bad = {false, false, false, false, true,  false, false,
                                 true,  false, false, false, false, false, false,
                                 true,  true,  false, false, false};
  LossScaler scaler(config);
  Schedule want{config.initial_scale};
  for (std::size_t i = 0; i < bad.size(); ++i) {
    const Schedule before = want;
    const double got_before = scaler.scale();
    scaler.update(bad[i]);
    want.update(bad[i], config);
    if (scaler.scale() == want.scale && scaler.good_steps() == want.good) continue;
    std::string why;
    if (bad[i] && scaler.scale() == got_before)
      why = "a step with a non-finite gradient must multiply the scale by backoff_factor (0.5)";
    else if (bad[i] && scaler.good_steps() != 0)
      why = "a bad step restarts the count of good steps at 0";
    else if (!bad[i] && want.scale != before.scale && scaler.scale() == got_before)
      why = "the scale should grow here: growth_interval (3) good steps in a row";
    else if (!bad[i] && want.scale == before.scale && scaler.scale() != got_before)
      why =
          "the scale grew too early: it grows only after growth_interval (3) good steps in a row, "
          "counted since the last growth or backoff";
    else if (!bad[i] && want.good == 0 && scaler.good_steps() != 0)
      why = "after growing, the count of good steps restarts at 0";
    FAIL() << "LossScaler(initial 1024, growth 2, backoff 0.5, interval 3): after update #" << i + 1
           << " (history " << flags(bad, i) << ", X = non-finite) expected scale " << want.scale
           << " and good_steps " << want.good << ", got scale " << scaler.scale()
           << " and good_steps " << scaler.good_steps() << (why.empty() ? "" : "\n    -> " + why);
  }
}

TEST(Puzzle7_3_loss_scaler, TheDefaultsGrowAfter2000GoodSteps) {
  LossScaler scaler;
  ASSERT_EQ(scaler.scale(), 65536.0) << "the default initial scale is 2^16";
  for (int i = 0; i < 1999; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0) << "after 1999 good steps the scale must not have grown yet";
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 131072.0) << "after 2000 good steps in a row the scale doubles";
  EXPECT_EQ(scaler.good_steps(), 0);
}

// Gradients of three shapes and dtypes, each element = value x scale.
struct Grads {
  std::vector<std::vector<double>> values;  // unscaled
  std::vector<Tensor> tensors;              // scaled
};
Grads scaled_grads(double scale) {
  Grads g;
  const std::vector<std::pair<Shape, DType>> specs = {
      {{5}, DType::f32}, {{7}, DType::f64}, {{3, 4}, DType::f32}};
  for (std::size_t t = 0; t < specs.size(); ++t) {
    Tensor values = Tensor::random_uniform(specs[t].first, 40 + t, -2.0, 2.0, specs[t].second,
                                           dtp::testing::checker_device());
    g.values.push_back(values.to_vector());
    Tensor scaled = values.clone();
    ops::scale(scaled, scale);
    g.tensors.push_back(scaled);
  }
  return g;
}

// "" when every gradient but `skip` (-1: none) holds exactly its unscaled values.
std::string check_unscaled(const Grads& g, double scale, int skip) {
  for (std::size_t t = 0; t < g.tensors.size(); ++t) {
    if (static_cast<int>(t) == skip) continue;
    const std::vector<double> got = g.tensors[t].to_vector();
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (got[i] == g.values[t][i]) continue;
      std::ostringstream out;
      out << "gradient " << t << ", element " << i << ": expected " << g.values[t][i]
          << " (unscaled), got " << got[i];
      if (got[i] == g.values[t][i] * scale)
        out << " = still scaled: it was never divided by the scale " << scale;
      else if (got[i] == g.values[t][i] / scale)
        out << " = divided by the scale twice";
      return out.str();
    }
  }
  return "";
}

TEST(Puzzle7_3_loss_scaler, UnscaleDividesEveryGradientAndFindsInfAndNaN) {
  const double scale = 4096.0;
  LossScaler scaler({scale, 2.0, 0.5, 10});
  {
    Grads g = scaled_grads(scale);
    const bool found = scaler.unscale(g.tensors);
    EXPECT_FALSE(found) << "unscale returned true (non-finite) for gradients that are all finite";
    const std::string wrong = check_unscaled(g, scale, -1);
    EXPECT_EQ(wrong, "") << "unscale with scale " << scale << ": " << wrong;
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (const double bad : {inf, -inf, std::numeric_limits<double>::quiet_NaN()}) {
    for (int t = 0; t < 3; ++t) {
      for (const bool last : {false, true}) {
        Grads g = scaled_grads(scale);
        const std::int64_t i = last ? g.tensors[t].numel() - 1 : 0;
        g.tensors[t].flatten().set_item(i, bad);
        const bool found = scaler.unscale(g.tensors);
        EXPECT_TRUE(found) << "unscale missed a " << bad << " in gradient " << t << " at element "
                           << i << " (its " << (last ? "last" : "first")
                           << "): every element of every gradient counts";
        const std::string wrong = check_unscaled(g, scale, t);
        EXPECT_EQ(wrong, "")
            << "with a " << bad << " in gradient " << t << ", the other gradients must still be "
            << "unscaled (the step is skipped, but nothing may be left half done): " << wrong;
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// A small optimizer over two buffers, with gradients of the scaled loss.
struct Model {
  std::vector<ParamBuffer> buffers;
};
Model make_model(double scale) {
  Model m;
  for (int b = 0; b < 2; ++b) {
    Tensor params = Tensor::random_uniform({16 + 8 * b}, 50 + b, -1.0, 1.0, DType::f32,
                                           dtp::testing::checker_device());
    Tensor grads = Tensor::random_uniform({16 + 8 * b}, 60 + b, -0.5, 0.5, DType::f32,
                                          dtp::testing::checker_device());
    ops::scale(grads, scale);
    m.buffers.push_back({"unit" + std::to_string(b), params, grads});
  }
  return m;
}
Model copy_of(const Model& m) {
  Model c;
  for (const ParamBuffer& b : m.buffers)
    c.buffers.push_back({b.name, b.params.clone(), b.grads.clone()});
  return c;
}
std::vector<double> all_params(const std::vector<ParamBuffer>& buffers) {
  std::vector<double> out;
  for (const ParamBuffer& b : buffers)
    for (double v : b.params.to_vector()) out.push_back(v);
  return out;
}
std::vector<double> all_state(const AdamW& adam) {
  std::vector<double> out;
  for (std::size_t i = 0; i < adam.buffers().size(); ++i) {
    for (double v : adam.first_moment(i).to_vector()) out.push_back(v);
    for (double v : adam.second_moment(i).to_vector()) out.push_back(v);
  }
  return out;
}

// The parameters after one AdamW step from `m`'s scaled gradients, done by
// the checker: divide by `divide`, clip to max_norm (<= 0: none), step.
std::vector<double> expected_params(const Model& m, double divide, double max_norm, double lr,
                                    bool clip_first = false) {
  Model c = copy_of(m);
  AdamW adam(c.buffers);
  std::vector<Tensor> grads = grad_tensors(c.buffers);
  if (clip_first) clip_grad_norm(grads, max_norm);
  for (Tensor& g : grads) ops::scale(g, 1.0 / divide);
  if (!clip_first) clip_grad_norm(grads, max_norm);
  adam.step(lr);
  return all_params(c.buffers);
}

TEST(Puzzle7_3_loss_scaler, StepUnscalesThenClipsThenSteps) {
  const double scale = 1024.0, lr = 0.01;
  const Model original = make_model(scale);
  // The unscaled gradients' norm, and a threshold that clips them to half.
  Model probe = copy_of(original);
  std::vector<Tensor> probe_grads = grad_tensors(probe.buffers);
  for (Tensor& g : probe_grads) ops::scale(g, 1.0 / scale);
  const double max_norm = 0.5 * global_grad_norm(probe_grads);

  Model mine = copy_of(original);
  AdamW adam(mine.buffers);
  LossScaler scaler({scale, 2.0, 0.5, 100});
  const bool taken = scaler.step(adam, lr, max_norm);
  ASSERT_TRUE(taken) << "step() returned false (skipped) with every gradient finite";
  const std::vector<double> got = all_params(mine.buffers);
  const std::vector<double> want = expected_params(original, scale, max_norm, lr);
  if (got == want) {
    EXPECT_EQ(adam.steps(), 1) << "the optimizer must take exactly one step";
    EXPECT_EQ(scaler.good_steps(), 1) << "step() must call update(): one good step so far";
    return;
  }
  std::string why =
      "unscale, then clip (optimizer.clip_gradients(max_norm)), then optimizer.step(lr)";
  if (got == expected_params(original, scale, max_norm, lr, true))
    why = "clipped before unscaling: the scaled gradients' norm is " +
          std::to_string(static_cast<long long>(scale)) +
          "x too large, so they were clipped far too hard; unscale first";
  else if (got == expected_params(original, scale, 0, lr))
    why = "not clipped: call optimizer.clip_gradients(max_norm) after unscaling";
  else if (got == expected_params(original, 1.0, max_norm, lr))
    why = "the gradients were never unscaled";
  else if (got == all_params(original.buffers))
    why = "the parameters did not move: optimizer.step(lr) was not called";
  FAIL()
      << "after LossScaler::step(adam, lr " << lr << ", max_norm " << max_norm << ") with scale "
      << scale
      << ", the parameters differ from unscale -> clip -> AdamW step done by the checker:\n    -> "
      << why;
}

TEST(Puzzle7_3_loss_scaler, ANonFiniteGradientSkipsTheStepAndLeavesEverythingAsItWas) {
  const double scale = 2048.0;
  Model mine = make_model(scale);
  AdamW adam(mine.buffers);
  LossScaler scaler({scale, 2.0, 0.5, 100});
  ASSERT_TRUE(scaler.step(adam, 0.01, 0.0)) << "a first, good step was skipped";
  // Scaled gradients again for the second step, one of them NaN.
  for (ParamBuffer& b : mine.buffers) {
    b.grads.copy_from(
        Tensor::random_uniform(b.grads.shape(), 70, -0.5, 0.5, DType::f32, b.grads.device()));
    ops::scale(b.grads, scaler.scale());
  }
  mine.buffers[1].grads.set_item(3, std::numeric_limits<double>::quiet_NaN());
  const std::vector<double> params_before = all_params(mine.buffers),
                            state_before = all_state(adam);
  const double scale_before = scaler.scale();
  const bool taken = scaler.step(adam, 0.01, 1.0);
  EXPECT_FALSE(taken) << "step() returned true although gradient unit1 element 3 is NaN";
  EXPECT_EQ(adam.steps(), 1)
      << "the optimizer stepped on a NaN gradient: a skipped step must not call "
         "optimizer.step (its count went from 1 to "
      << adam.steps() << ")";
  const std::vector<double> params_after = all_params(mine.buffers), state_after = all_state(adam);
  for (std::size_t i = 0; i < params_after.size(); ++i)
    if (!(params_after[i] == params_before[i])) {
      ADD_FAILURE() << "skipped step: parameter element " << i << " changed from "
                    << params_before[i] << " to " << params_after[i]
                    << " (a skipped step leaves the parameters bitwise as they were)";
      break;
    }
  for (std::size_t i = 0; i < state_after.size(); ++i)
    if (!(state_after[i] == state_before[i])) {
      ADD_FAILURE() << "skipped step: AdamW state element " << i
                    << " (m then v, buffer by buffer) changed from " << state_before[i] << " to "
                    << state_after[i]
                    << " (clipping or stepping on a non-finite gradient poisons the moments)";
      break;
    }
  EXPECT_EQ(scaler.scale(), scale_before * 0.5)
      << "a skipped step must halve the scale (backoff 0.5)";
  EXPECT_EQ(scaler.good_steps(), 0) << "a skipped step restarts the count of good steps";
}

TEST(Puzzle7_3_loss_scaler, StepGrowsTheScaleAfterTheInterval) {
  Model mine = make_model(256.0);
  SGD sgd(mine.buffers, {0.0, 0.0, false});
  LossScaler scaler({256.0, 2.0, 0.5, 2});
  for (int s = 1; s <= 2; ++s) {
    for (ParamBuffer& b : mine.buffers) {
      b.grads.copy_from(
          Tensor::random_uniform(b.grads.shape(), 80 + s, -0.5, 0.5, DType::f32, b.grads.device()));
      ops::scale(b.grads, scaler.scale());
    }
    ASSERT_TRUE(scaler.step(sgd, 0.1, 0.0)) << "good step " << s << " was skipped";
  }
  EXPECT_EQ(scaler.scale(), 512.0)
      << "two good steps with growth_interval 2: step() must update() the "
         "schedule, and the scale doubles";
}

}  // namespace
}  // namespace dtp::ch07
