// The chapter 08 checkers' own pieces: seeded tensors, the checker's own
// full-rank LoRA arithmetic (written out with loops in f64, not with the code
// under test), and comparisons that say what a wrong value looks like.
//
// Where they run: the checker's device (DTP_DEVICE; the GPU in the gpu
// flavour) in checker_dtype() (support/checker_precision.h). On the CPU the
// tensors are f64 and each check keeps the tolerance it names (1e-13 of the
// largest value, say). A GPU has no f64 kernels: there the tensors are f32
// and the matrix products use TF32 tensor cores, which round their inputs to
// 10 mantissa bits (2^-11 relative, about 5e-4), so a product of a few terms
// agrees with the checker's f64 loops to about 1e-3 of its largest value.
// The GPU tolerances below say so; every mistake the messages decode (a
// missing part, a flipped sign, s applied twice) is off by far more. The CPU
// in f32 (DTP_CHECK_DTYPE=f32) keeps the GPU tolerances: its products round
// to 2^-24, finer than TF32's 2^-11, so they bound it too. Comparisons that
// hold bit for bit hold in both dtypes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "08_lora/lora.h"
#include "support/checker_precision.h"
#include "support/training.h"

namespace dtp::testing::ch08 {

/// The checkers' device and dtype: f64 on the CPU, f32 on a GPU or under
/// DTP_CHECK_DTYPE=f32 (checker_dtype()).
inline Device device() { return checker_device(); }
inline DType dtype() { return checker_dtype(device()); }
inline bool on_gpu() { return device().is_cuda(); }

/// A check's tolerance: @p f64 in f64; in f32, @p gpu (TF32 products agree
/// with f64 loops to about 1e-3 of the largest value; longer chains, a whole
/// model's backward, need more; the CPU's f32 products are finer still).
inline double tolerance(double f64, double gpu = 5e-3) {
  return dtp::testing::tolerance(dtype(), f64, gpu);
}

/// The relative rounding of one stored value of dtype(): 2^-53 or 2^-24.
inline double unit_roundoff() { return dtp::testing::unit_roundoff(dtype()); }

/// The tiny training config of every training chapter (f64 on the CPU), in
/// dtype() on device(), or on @p on when given (a rank's comm.device()).
inline TrainConfig lora_tiny_config(std::int64_t global_batch = 12, std::int64_t steps = 3,
                                    Device on = checker_device()) {
  return on_device(tiny_config(global_batch, steps), on);
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
      m << ": a wrong scale (s = alpha / r applied twice, or not at all, or to h = x A^T instead "
           "of only on y's line?)";
  }
  return m.str();
}

/// @p rows x @p cols values of @p flat from element @p offset on, as a matrix.
inline Matrix matrix_at(const std::vector<double>& flat, std::int64_t offset, std::int64_t rows,
                        std::int64_t cols) {
  const auto first = flat.begin() + offset;
  return {rows, cols, std::vector<double>(first, first + rows * cols)};
}

/// The checker's own LoRA training of @p config's model on its global batch:
/// every adapter parameter, gradient and loss, step by step. Its adapters
/// lie as LoraModel's buffers do (per block, per target in order, A then B),
/// concatenated over the blocks.
struct LoraTrajectory {
  struct Piece {
    std::string name;  ///< "block 0 attn.q A"
    std::int64_t offset = 0, rows = 0, cols = 0;
  };
  std::vector<Piece> pieces;                ///< where each A and B lies
  std::vector<double> start;                ///< every adapter parameter before step 1
  std::vector<double> losses;               ///< per step
  std::vector<std::vector<double>> grads;   ///< per step: every adapter gradient
  std::vector<std::vector<double>> params;  ///< per step: every adapter parameter after it

  /// "block 0 attn.q A [1, 3]" for element @p flat.
  std::string where(std::int64_t flat) const {
    for (const Piece& p : pieces)
      if (flat >= p.offset && flat < p.offset + p.rows * p.cols)
        return p.name + " [" + std::to_string((flat - p.offset) / p.cols) + ", " +
               std::to_string((flat - p.offset) % p.cols) + "]";
    return "element " + std::to_string(flat);
  }
};

/// Trains @p steps steps without the code under test: a full-rank copy of
/// the base whose target weights the checker sets to W + s B A before every
/// step; its weight gradient G gives the adapters' gradients by the chain
/// rule (dA = s B^T G, dB = s G A^T, the checker's loops), and the runtime's
/// optimizer (make_optimizer, as Trainer builds it) updates the checker's own
/// A and B. A is drawn as LoraModel's contract says; B starts at 0.
/// With @p world > 1, rank @p rank's slice of each global batch instead.
inline LoraTrajectory checker_lora_training(const TrainConfig& config,
                                            const dtp::ch08::LoraConfig& lora, int steps,
                                            int rank = 0, int world = 1) {
  Trainer trainer(config, rank, world);  // the base and the batches a run of config trains on
  GPT& full = trainer.model();
  const double s = lora.scale();
  const std::int64_t r = lora.rank;
  LoraTrajectory out;
  std::vector<ParamBuffer> buffers;
  struct Target {
    Linear* linear;
    Matrix base;                 // W
    LoraTrajectory::Piece a, b;  // offsets within the block's buffer
    int block;
  };
  std::vector<Target> targets;
  std::int64_t block_start = 0;
  for (int i = 0; i < full.num_blocks(); ++i) {
    Rng rng(Rng::derive(lora.seed, static_cast<std::uint64_t>(i)));
    std::vector<double> values;
    for (const std::string& name : lora.targets) {
      Linear& linear = dtp::ch08::target_linear(full.block(i), name);
      const std::int64_t in = linear.in_features, out_features = linear.out_features;
      Tensor a = Tensor::empty({r, in}, dtype());  // drawn on the host, as the model does
      ops::fill_normal(a, 0.0, 1.0 / std::sqrt(static_cast<double>(in)), rng);
      const std::string label = "block " + std::to_string(i) + " " + name;
      Target t{&linear, matrix(linear.weight), {label + " A", 0, r, in}, {}, i};
      t.a.offset = static_cast<std::int64_t>(values.size());
      for (double v : a.to_vector()) values.push_back(v);
      t.b = {label + " B", static_cast<std::int64_t>(values.size()), out_features, r};
      values.resize(values.size() + static_cast<std::size_t>(out_features * r), 0.0);
      out.pieces.push_back({t.a.name, block_start + t.a.offset, t.a.rows, t.a.cols});
      out.pieces.push_back({t.b.name, block_start + t.b.offset, t.b.rows, t.b.cols});
      targets.push_back(t);
    }
    const Shape shape{static_cast<std::int64_t>(values.size())};
    buffers.push_back({"block." + std::to_string(i) + ".lora", on_device(values, shape),
                       on_device(std::vector<double>(values.size(), 0.0), shape)});
    block_start += shape.numel();
  }
  auto concatenated = [&](bool grads) {
    std::vector<double> all;
    for (const ParamBuffer& b : buffers)
      for (double v : (grads ? b.grads : b.params).to_vector()) all.push_back(v);
    return all;
  };
  out.start = concatenated(false);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(trainer.config(), buffers);
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<double>> params, grads;
    for (const ParamBuffer& b : buffers) {
      params.push_back(b.params.to_vector());
      grads.push_back(std::vector<double>(params.back().size(), 0.0));
    }
    for (Target& t : targets) {
      const std::vector<double>& p = params[static_cast<std::size_t>(t.block)];
      const Matrix a = matrix_at(p, t.a.offset, t.a.rows, t.a.cols);
      const Matrix b = matrix_at(p, t.b.offset, t.b.rows, t.b.cols);
      t.linear->weight.copy_from(
          on_device(plus(t.base, s, product(b, false, a, false)).v, t.linear->weight.shape()));
    }
    full.zero_grad();
    const Batch batch = trainer.sampler().batch(step, config.model.device);
    out.losses.push_back(full.forward(batch.inputs, batch.targets));
    full.backward();
    for (Target& t : targets) {
      const std::vector<double>& p = params[static_cast<std::size_t>(t.block)];
      const Matrix a = matrix_at(p, t.a.offset, t.a.rows, t.a.cols);
      const Matrix b = matrix_at(p, t.b.offset, t.b.rows, t.b.cols);
      const Matrix g = matrix(t.linear->weight_grad);
      const Matrix da = product(b, true, g, false), db = product(g, false, a, true);
      std::vector<double>& into = grads[static_cast<std::size_t>(t.block)];
      for (std::size_t k = 0; k < da.v.size(); ++k)
        into[static_cast<std::size_t>(t.a.offset) + k] = s * da.v[k];
      for (std::size_t k = 0; k < db.v.size(); ++k)
        into[static_cast<std::size_t>(t.b.offset) + k] = s * db.v[k];
    }
    for (std::size_t i = 0; i < buffers.size(); ++i)
      buffers[i].grads.copy_from(on_device(grads[i], buffers[i].grads.shape()));
    out.grads.push_back(concatenated(true));
    optimizer->step(trainer.config().schedule().at(step));
    out.params.push_back(concatenated(false));
  }
  return out;
}

/// The tolerance against the checker's training, relative to the largest
/// expected value: the checker's full-rank products round differently from
/// the adapter's thin ones (a few ulps in f64; TF32's 1e-3 on a GPU).
inline double trajectory_tolerance() { return tolerance(1e-10, 2e-2); }

/// -1 when every element of @p got is within trajectory_tolerance() of
/// @p expected, else the first one that is not.
inline std::int64_t first_apart(const std::vector<double>& expected,
                                const std::vector<double>& got) {
  double largest = 0;
  for (double e : expected) largest = std::max(largest, std::fabs(e));
  const double bound = trajectory_tolerance() * std::max(largest, 1e-300);
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (i >= got.size() || !(std::fabs(expected[i] - got[i]) <= bound))
      return static_cast<std::int64_t>(i);
  return expected.size() == got.size() ? -1 : static_cast<std::int64_t>(expected.size());
}

/// -1 when @p got, the adapters after a step, moved from the checker's
/// starting values as the checker's @p want did (compared as changes, so
/// that a small update is not lost in the tolerance of a large value); else
/// the first element that did not.
inline std::int64_t first_moved_apart(const LoraTrajectory& expected,
                                      const std::vector<double>& want,
                                      const std::vector<double>& got) {
  if (got.size() != want.size())
    return static_cast<std::int64_t>(std::min(got.size(), want.size()));
  std::vector<double> want_change = want, got_change = got;
  for (std::size_t i = 0; i < want.size(); ++i) {
    want_change[i] -= expected.start[i];
    got_change[i] -= expected.start[i];
  }
  return first_apart(want_change, got_change);
}

/// Every adapter gradient of @p lora, its buffers concatenated.
inline std::vector<double> adapter_gradients(const dtp::ch08::LoraModel& lora) {
  std::vector<double> all;
  for (const ParamBuffer& b : lora.buffers())
    for (double v : b.grads.to_vector()) all.push_back(v);
  return all;
}

/// Every adapter parameter of @p lora, its buffers concatenated.
inline std::vector<double> adapter_parameters(const dtp::ch08::LoraModel& lora) {
  std::vector<double> all;
  for (const ParamBuffer& b : lora.buffers())
    for (double v : b.params.to_vector()) all.push_back(v);
  return all;
}

/// "" when @p got, step @p step's adapter gradients (counted from 1), are the
/// checker's; else the first wrong one and what the whole vector looks like:
/// the previous step's gradients still in (@p previous, what the buffers
/// held after the last step), or a multiple of the expected.
inline std::string check_step_gradients(const LoraTrajectory& expected, int step,
                                        const std::vector<double>& got,
                                        const std::vector<double>& previous) {
  const std::vector<double>& want = expected.grads[static_cast<std::size_t>(step - 1)];
  const std::int64_t i = first_apart(want, got);
  if (i < 0) return "";
  if (static_cast<std::size_t>(i) >= got.size())
    return "step " + std::to_string(step) + ": " + std::to_string(got.size()) +
           " adapter gradients, expected " + std::to_string(want.size());
  const auto k = static_cast<std::size_t>(i);
  std::string message = "step " + std::to_string(step) + ": the adapter gradient " +
                        expected.where(i) + " is " + number(got[k]) +
                        " right after backward, the checker's is " + number(want[k]);
  if (!previous.empty()) {
    std::vector<double> stale = want;
    for (std::size_t j = 0; j < stale.size(); ++j) stale[j] += previous[j];
    if (first_apart(stale, got) < 0)
      return message + ": it is this step's gradient plus step " + std::to_string(step - 1) +
             "'s, which was still in the buffers. The gradients were not zeroed before this "
             "step's backward (LoraModel::zero_grad must set every adapter gradient to 0, in "
             "place: the adapters' grad_a and grad_b are views of those buffers)";
  }
  double num = 0, den = 0;
  for (std::size_t j = 0; j < want.size(); ++j) {
    num += want[j] * got[j];
    den += want[j] * want[j];
  }
  if (den > 0) message += " (fitted over every element, got is " + number(num / den) + "x)";
  return message;
}

}  // namespace dtp::testing::ch08
