// Puzzle 8.1 (the adapter's forward and backward) and 8.2 (merge, unmerge),
// against the checker's own full-rank arithmetic in f64 (lora_checks.h: on a
// GPU the tensors are f32 and the tolerances TF32's).

#include "lora_checks.h"

namespace dtp {
namespace {

using namespace testing::ch08;

constexpr std::int64_t kIn = 6, kOut = 5, kRank = 3;
constexpr double kScale = 16.0 / kRank;  // alpha 16

struct Case {
  Tensor x = seeded({2, 4, kIn}, 11);  // [B, T, in]: the adapter sees rows of in
  Tensor w = seeded({kOut, kIn}, 12, 0.5);
  Tensor bias = seeded({kOut}, 13);
  Tensor a = seeded({kRank, kIn}, 14, 0.4);
  Tensor b = seeded({kOut, kRank}, 15, 0.3);
  Tensor dy = seeded({2, 4, kOut}, 16);  // the loss is sum(y * dy)

  /// y = x W^T + b, with the runtime's own ops (what a Linear computes).
  Tensor base_output() const {
    Tensor y = Tensor::empty({2, 4, kOut}, dtype(), device());
    ops::matmul(x, w, y, false, true);
    ops::add_bias(y, bias);
    return y;
  }
};

TEST(Puzzle8_1_lora_linear, WithBZeroTheOutputIsTheBaseOutputBitForBit) {
  Case c;
  Tensor zero_b = Tensor::zeros({kOut, kRank}, dtype(), device());
  Tensor y = c.base_output();
  const Tensor base = y.clone();
  const Tensor h = ch08::lora_forward(c.x, c.a, zero_b, kScale, y);
  const std::string changed = bitwise("y", base, y);
  ASSERT_EQ(changed, "")
      << "with B = 0 the adapter adds exactly zero: y must stay the base output x W^T + b bit for "
         "bit (did the forward overwrite y instead of adding to it?)";
  ASSERT_TRUE(h.defined() && h.numel() == 8 * kRank)
      << "lora_forward returns h = x A^T, [rows, r] = [8, " << kRank << "]; got "
      << (h.defined() ? h.describe() : "nothing");
  EXPECT_EQ(compare("h = x A^T", product(matrix(c.x), false, matrix(c.a), true), matrix(h),
                    tolerance(1e-14)),
            "");
}

TEST(Puzzle8_1_lora_linear, TheOutputIsTheFullRankUpdatesOutput) {
  Case c;
  Tensor y = c.base_output();
  const Matrix base = matrix(y);
  ch08::lora_forward(c.x, c.a, c.b, kScale, y);
  // x (W + s B A)^T + b, by the checker's own loops.
  Matrix expected = product(matrix(c.x), false, effective_weight(c.w, c.a, c.b, kScale), true);
  const std::vector<double> bias = c.bias.to_vector();
  for (std::int64_t r = 0; r < expected.rows; ++r)
    for (std::int64_t o = 0; o < expected.cols; ++o)
      expected.at(r, o) += bias[static_cast<std::size_t>(o)];
  EXPECT_EQ(compare("y = x W^T + b + s (x A^T) B^T", expected, matrix(y), tolerance(1e-13), &base),
            "");
}

TEST(Puzzle8_1_lora_linear, GradientsEqualTheFullRankChainRule) {
  // With W_eff = W + s B A, the loss's gradient for W_eff is G = dy^T x; the
  // chain rule through the product gives dA = s B^T G and dB = s G A^T, and
  // dx = dy W_eff. The gradients accumulate: they start at 0.25 here.
  Case c;
  const Matrix g = product(matrix(c.dy), true, matrix(c.x), false);  // [out, in]
  const Matrix expected_da = plus(zeros(kRank, kIn), 1.0, product(matrix(c.b), true, g, false));
  const Matrix expected_db = product(g, false, matrix(c.a), true);
  Matrix da_full = zeros(kRank, kIn), db_full = zeros(kOut, kRank);
  for (std::size_t i = 0; i < da_full.v.size(); ++i)
    da_full.v[i] = 0.25 + kScale * expected_da.v[i];
  for (std::size_t i = 0; i < db_full.v.size(); ++i)
    db_full.v[i] = 0.25 + kScale * expected_db.v[i];

  Tensor y = c.base_output();
  const Tensor h = ch08::lora_forward(c.x, c.a, c.b, kScale, y);
  Tensor dx = Tensor::empty({2, 4, kIn}, dtype(), device());
  ops::matmul(c.dy, c.w, dx);  // the Linear's own part, dy W
  const Matrix dx_base = matrix(dx);
  ch08::lora_backward_input(c.dy, c.a, c.b, kScale, dx);
  EXPECT_EQ(compare("dx = dy W + s (dy B) A",
                    product(matrix(c.dy), false, effective_weight(c.w, c.a, c.b, kScale), false),
                    matrix(dx), tolerance(1e-13), &dx_base),
            "");
  Tensor da = Tensor::full({kRank, kIn}, 0.25, dtype(), device()),
         db = Tensor::full({kOut, kRank}, 0.25, dtype(), device());
  ch08::lora_backward_weight(c.dy, c.x, h, c.b, kScale, da, db);
  Matrix start_a = zeros(kRank, kIn), start_b = zeros(kOut, kRank);
  for (double& v : start_a.v) v = 0.25;
  for (double& v : start_b.v) v = 0.25;
  EXPECT_EQ(compare("dA (accumulated onto 0.25)", da_full, matrix(da), tolerance(1e-13), &start_a),
            "")
      << "dA = s (dy B)^T x, added to what dA held";
  EXPECT_EQ(compare("dB (accumulated onto 0.25)", db_full, matrix(db), tolerance(1e-13), &start_b),
            "")
      << "dB = s dy^T h with h = x A^T, added to what dB held";
}

TEST(Puzzle8_1_lora_linear, GradientsEqualFiniteDifferences) {
  // Central differences of L(A, B) = sum(y * dy), y from the checker's own
  // full-rank forward in f64, for every element of A and B (perturbed in the
  // checker's f64 copies, so the differences are f64's on any device).
  Case c;
  const Matrix x = matrix(c.x), w = matrix(c.w);
  const std::vector<double> dy = c.dy.to_vector();
  auto loss = [&](const Matrix& a, const Matrix& b) {
    const Matrix y = product(x, false, plus(w, kScale, product(b, false, a, false)), true);
    double sum = 0;
    for (std::size_t i = 0; i < y.v.size(); ++i) sum += y.v[i] * dy[i];
    return sum;
  };
  Tensor y = c.base_output();
  const Tensor h = ch08::lora_forward(c.x, c.a, c.b, kScale, y);
  Tensor da = Tensor::zeros({kRank, kIn}, dtype(), device()),
         db = Tensor::zeros({kOut, kRank}, dtype(), device());
  ch08::lora_backward_weight(c.dy, c.x, h, c.b, kScale, da, db);
  Matrix a = matrix(c.a), b = matrix(c.b);
  const double eps = 1e-6;
  for (auto [name, param, grad] :
       {std::tuple<const char*, Matrix*, const Tensor*>{"A", &a, &da}, {"B", &b, &db}}) {
    const std::vector<double> backward = grad->to_vector();
    for (std::size_t i = 0; i < param->v.size(); ++i) {
      const double keep = param->v[i];
      param->v[i] = keep + eps;
      const double up = loss(a, b);
      param->v[i] = keep - eps;
      const double down = loss(a, b);
      param->v[i] = keep;
      const double numeric = (up - down) / (2 * eps);
      ASSERT_NEAR(backward[i], numeric, tolerance(1e-7, 5e-3) * std::max(1.0, std::fabs(numeric)))
          << "d" << name << " element " << i << " (row " << i / param->cols << ", column "
          << i % param->cols << "): the backward gives " << backward[i] << ", finite differences "
          << numeric;
    }
  }
}

// --- 8.2 ----------------------------------------------------------------------------------

TEST(Puzzle8_2_merge, MergeThenUnmergeRestoresWExactlyWhenTheArithmeticIsExact) {
  // Multiples of 1/8 with s = 2: every product and sum is exact in f64, and
  // in f32 and TF32 too (4 significant bits), so merging gives W + s B A
  // exactly and unmerging gives W back bit for bit, on any device.
  auto dyadic = [](Shape shape, int seed) {
    std::vector<double> v(static_cast<std::size_t>(shape.numel()));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>(static_cast<int>((i * 7 + seed) % 17) - 8) / 8.0;
    return on_device(v, shape);
  };
  const Tensor w0 = dyadic({kOut, kIn}, 1), a = dyadic({kRank, kIn}, 2),
               b = dyadic({kOut, kRank}, 3);
  Tensor w = w0.clone();
  ch08::merge(w, a, b, 2.0);
  EXPECT_EQ(compare("merged W = W + s B A", effective_weight(w0, a, b, 2.0), matrix(w), 0.0), "");
  ch08::unmerge(w, a, b, 2.0);
  EXPECT_EQ(compare("W after merge then unmerge", matrix(w0), matrix(w), 0.0), "")
      << "with exact arithmetic unmerge must give W back bit for bit";
}

TEST(Puzzle8_2_merge, MergeThenUnmergeRestoresWWithinRoundingOtherwise) {
  // General values: each element is off by at most a few roundings of the
  // sums involved, 4 unit roundoffs of the dtype x 2 (2^-52 in f64) of
  // |W| + |s B A| here: unmerge subtracts the same s B A merge added (the
  // same product, computed again), so TF32's rounding of it cancels.
  Case c;
  Tensor w = c.w.clone();
  ch08::merge(w, c.a, c.b, kScale);
  EXPECT_EQ(compare("merged W = W + s B A", effective_weight(c.w, c.a, c.b, kScale), matrix(w),
                    tolerance(1e-15)),
            "");
  ch08::unmerge(w, c.a, c.b, kScale);
  const Matrix update = product(matrix(c.b), false, matrix(c.a), false);
  const std::vector<double> before = c.w.to_vector(), after = w.to_vector();
  for (std::size_t i = 0; i < before.size(); ++i)
    ASSERT_LE(std::fabs(after[i] - before[i]),
              8 * unit_roundoff() * (std::fabs(before[i]) + kScale * std::fabs(update.v[i])))
        << "W element " << i << " is " << after[i] << " after merge then unmerge, was "
        << before[i];
}

TEST(Puzzle8_2_merge, AMergedLinearComputesWhatTheAdaptedOneDid) {
  // The adapted output x W^T + b + s (x A^T) B^T, by the checker's own loops.
  Case c;
  Matrix adapted =
      plus(matrix(c.base_output()), kScale,
           product(product(matrix(c.x), false, matrix(c.a), true), false, matrix(c.b), true));
  Tensor w = c.w.clone();
  ch08::merge(w, c.a, c.b, kScale);
  Tensor merged = Tensor::empty({2, 4, kOut}, dtype(), device());
  ops::matmul(c.x, w, merged, false, true);
  ops::add_bias(merged, c.bias);
  EXPECT_EQ(
      compare("x W'^T + b with the merged W'", adapted, matrix(merged), tolerance(1e-13, 1e-2)),
      "");
}

}  // namespace
}  // namespace dtp
