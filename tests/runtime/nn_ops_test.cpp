// The model's ops: results against plain loops, gradients against finite
// differences (f64, see nn_test_helpers.h for the tolerance), flash attention
// against naive attention, and the online-softmax merge.
#include "dtp/nn_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "dtp/error.h"
#include "nn_test_helpers.h"
#include "support/harness.h"

namespace dtp {
namespace {

using testing::gradients_match;
using testing::max_difference;
using testing::numeric_gradient;
using testing::random_ids;
using testing::random_tensor;
using testing::weighted_sum;

// --- matmul ---------------------------------------------------------------------------------

// out[i, j] = alpha * sum_k op(a)[i, k] op(b)[k, j] + beta * out[i, j], by plain loops.
std::vector<double> reference_matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool ta,
                                     bool tb, double alpha, double beta) {
  const std::int64_t M = out.size(0), N = out.size(1);
  const std::int64_t K = ta ? a.size(0) : a.size(1);
  std::vector<double> result(static_cast<std::size_t>(M * N));
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double sum = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double x = ta ? a.item(k * M + i) : a.item(i * K + k);
        const double y = tb ? b.item(j * K + k) : b.item(k * N + j);
        sum += x * y;
      }
      result[static_cast<std::size_t>(i * N + j)] = alpha * sum + beta * out.item(i * N + j);
    }
  return result;
}

TEST(NnOps, MatmulMatchesPlainLoopsForEveryTransposeAndTileEdge) {
  Rng rng(1);
  struct Case {
    std::int64_t M, N, K;
  };
  // Sizes cross the kernel's 4-row groups and its 256 (K) and 512 (N) tiles.
  for (Case c : {Case{7, 9, 5}, Case{1, 1, 1}, Case{6, 520, 300}, Case{13, 3, 257}}) {
    for (DType dtype : {DType::f64, DType::f32}) {
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        Tensor a = random_tensor(ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, rng, 1.0, dtype);
        Tensor b = random_tensor(tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, rng, 1.0, dtype);
        Tensor out = random_tensor({c.M, c.N}, rng, 1.0, dtype);
        for (auto [alpha, beta] :
             {std::pair{1.0, 0.0}, std::pair{0.5, 1.0}, std::pair{2.0, -0.5}}) {
          Tensor result = out.clone();
          std::vector<double> expected = reference_matmul(a, b, result, ta, tb, alpha, beta);
          ops::matmul(a, b, result, ta, tb, alpha, beta);
          const double tol = dtype == DType::f64 ? 1e-10 : 1e-3;
          for (std::int64_t i = 0; i < result.numel(); ++i)
            ASSERT_NEAR(result.item(i), expected[static_cast<std::size_t>(i)],
                        tol * (1 + std::abs(expected[static_cast<std::size_t>(i)])))
                << dtype_name(dtype) << " M=" << c.M << " N=" << c.N << " K=" << c.K
                << " transpose_a=" << ta << " transpose_b=" << tb << " alpha=" << alpha
                << " beta=" << beta << " element " << i;
        }
      }
    }
  }
}

TEST(NnOps, MatmulReadsLeadingDimsAsRowsAndIgnoresNaNsWithBetaZero) {
  Rng rng(2);
  Tensor x = random_tensor({2, 3, 4}, rng);
  Tensor w = random_tensor({5, 4}, rng);
  Tensor y = Tensor::full({2, 3, 5}, std::nan(""), DType::f64);
  ops::matmul(x, w, y, false, true);
  std::vector<double> expected =
      reference_matmul(x.view({6, 4}), w, Tensor::zeros({6, 5}, DType::f64), false, true, 1, 0);
  for (std::int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.item(i), expected[i], 1e-12);
}

TEST(NnOps, LinearGradientsByFiniteDifferences) {
  // The three matmuls of a Linear layer: y = x W^T, dx = dy W, dW = dy^T x.
  Rng rng(3);
  Tensor x = random_tensor({2, 3, 4}, rng);
  Tensor w = random_tensor({5, 4}, rng);
  Tensor bias = random_tensor({5}, rng);
  Tensor dy = random_tensor({2, 3, 5}, rng);
  auto loss = [&] {
    Tensor y = Tensor::empty({2, 3, 5}, DType::f64);
    ops::matmul(x, w, y, false, true);
    ops::add_bias(y, bias);
    return weighted_sum(y, dy);
  };
  Tensor dx = Tensor::empty({2, 3, 4}, DType::f64);
  ops::matmul(dy, w, dx);
  Tensor dw = Tensor::zeros({5, 4}, DType::f64);
  ops::matmul(dy, x, dw, true, false, 1, 1);
  Tensor db = Tensor::zeros({5}, DType::f64);
  ops::bias_backward(dy, db);
  EXPECT_TRUE(gradients_match("linear dx", dx, numeric_gradient(x, loss)));
  EXPECT_TRUE(gradients_match("linear dW", dw, numeric_gradient(w, loss)));
  EXPECT_TRUE(gradients_match("linear db", db, numeric_gradient(bias, loss)));
}

TEST(NnOps, ShapeErrorsNameTheExpectedShape) {
  Tensor a = Tensor::zeros({3, 4}, DType::f32);
  Tensor b = Tensor::zeros({5, 6}, DType::f32);
  Tensor out = Tensor::zeros({3, 6}, DType::f32);
  try {
    ops::matmul(a, b, out);
    FAIL() << "inner dimensions 4 and 5 must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 4]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[5, 6]"), std::string::npos) << e.what();
  }
  Tensor wrong_out = Tensor::zeros({3, 5}, DType::f32);
  Tensor bt = Tensor::zeros({4, 6}, DType::f32);
  try {
    ops::matmul(a, bt, wrong_out);
    FAIL() << "an out of the wrong shape must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3, 6]"), std::string::npos) << e.what();
  }
  Tensor x = Tensor::zeros({2, 8}, DType::f32);
  Tensor weight = Tensor::zeros({7}, DType::f32), bias = Tensor::zeros({8}, DType::f32);
  Tensor y = Tensor::zeros({2, 8}, DType::f32);
  Tensor mean = Tensor::zeros({2}, DType::f32), rstd = Tensor::zeros({2}, DType::f32);
  try {
    ops::layernorm_forward(x, weight, bias, y, mean, rstd);
    FAIL() << "a LayerNorm weight of the wrong size must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight must have shape [8]"), std::string::npos)
        << e.what();
  }
  // Integer tensors are rejected with a hint, not silently computed (bf16
  // and f16 are computed: nn_half_test.cpp).
  Tensor ids = Tensor::zeros({2, 8}, DType::i32);
  Tensor ids_out = Tensor::zeros({2, 8}, DType::i32);
  try {
    ops::gelu_forward(ids, ids_out);
    FAIL() << "i32 must be rejected by the CPU kernels";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32 and f64"), std::string::npos) << e.what();
  }
}

// --- element-wise ---------------------------------------------------------------------------

TEST(NnOps, GeluGradientByFiniteDifferences) {
  Rng rng(4);
  Tensor x = random_tensor({3, 7}, rng, 2.0);
  Tensor dy = random_tensor({3, 7}, rng);
  auto loss = [&] {
    Tensor y = Tensor::empty(x.shape(), DType::f64);
    ops::gelu_forward(x, y);
    return weighted_sum(y, dy);
  };
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  ops::gelu_backward(x, dy, dx);
  EXPECT_TRUE(gradients_match("gelu dx", dx, numeric_gradient(x, loss)));
  // Known values of the tanh approximation.
  Tensor probe = Tensor::from_values({0.0, 1.0, -1.0, 3.0});
  Tensor out = Tensor::empty({4}, DType::f64);
  ops::gelu_forward(probe, out);
  EXPECT_NEAR(out.item(0), 0.0, 1e-15);
  EXPECT_NEAR(out.item(1), 0.8411919906082768, 1e-12);
  EXPECT_NEAR(out.item(2), -0.15880800939172324, 1e-12);
  EXPECT_NEAR(out.item(3), 2.996362607918227, 1e-12);
}

// f32 GELU runs eight floats at a time, with a padded copy for the last
// partial vector: every length from 1 to 17 and one past many vectors, every
// element against the f64 op on the same inputs. (A unity build once made
// the tail's call cross an ABI boundary and write zeros: elements 8k+.)
TEST(NnOps, F32GeluMatchesF64AtEveryTailLength) {
  std::vector<std::int64_t> lengths;
  for (std::int64_t n = 1; n <= 17; ++n) lengths.push_back(n);
  lengths.push_back(8 * 64 + 5);
  for (std::int64_t n : lengths) {
    const Tensor x = Tensor::random_uniform({n}, 11, -4, 4, DType::f32);
    const Tensor dy = Tensor::random_uniform({n}, 12, -1, 1, DType::f32);
    Tensor y = Tensor::full({n}, 99.0, DType::f32), dx = Tensor::full({n}, 99.0, DType::f32);
    ops::gelu_forward(x, y);
    ops::gelu_backward(x, dy, dx);
    Tensor x64 = Tensor::empty({n}, DType::f64), dy64 = Tensor::empty({n}, DType::f64);
    ops::cast(x, x64);
    ops::cast(dy, dy64);
    Tensor y64 = Tensor::empty({n}, DType::f64), dx64 = Tensor::empty({n}, DType::f64);
    ops::gelu_forward(x64, y64);
    ops::gelu_backward(x64, dy64, dx64);
    // f32 rounding of a fast tanh: a few 1e-7 absolute (GELU is near 0 where tanh's error is).
    for (std::int64_t i = 0; i < n; ++i) {
      const char* part = i < n / 8 * 8 ? "a whole vector" : "the padded last vector";
      ASSERT_NEAR(y.item(i), y64.item(i), 1e-5 * (1 + std::abs(y64.item(i))))
          << "gelu_forward f32, n " << n << ": element " << i << " (in " << part << ") of x "
          << x.item(i);
      ASSERT_NEAR(dx.item(i), dx64.item(i), 1e-5 * (1 + std::abs(dx64.item(i))))
          << "gelu_backward f32, n " << n << ": element " << i << " (in " << part << ") of x "
          << x.item(i);
    }
  }
}

TEST(NnOps, AddAxpySumSquaresCastAndFiniteCheck) {
  Tensor a = Tensor::from_values({1, 2, 3});
  Tensor b = Tensor::from_values({10, 20, 30});
  Tensor out = Tensor::empty({3}, DType::f64);
  ops::add(a, b, out);
  EXPECT_EQ(out.to_vector(), (std::vector<double>{11, 22, 33}));
  ops::axpy(out, -2.0, a);
  EXPECT_EQ(out.to_vector(), (std::vector<double>{9, 18, 27}));
  EXPECT_EQ(ops::sum_squares(a), 14.0);

  Tensor f32 = Tensor::empty({3}, DType::f32);
  ops::cast(Tensor::from_values({0.1, -2.5, 1e6}), f32);
  EXPECT_EQ(f32.item(0), static_cast<double>(0.1f));
  EXPECT_EQ(f32.item(1), -2.5);
  Tensor bf = Tensor::empty({3}, DType::bf16);
  ops::cast(f32, bf);
  EXPECT_EQ(bf.item(1), -2.5);
  Tensor ids = Tensor::empty({3}, DType::i32);
  ops::cast(Tensor::from_values({3, 4, 5}), ids);
  EXPECT_EQ(ids.data<std::int32_t>()[2], 5);
  Tensor too_short = Tensor::empty({2}, DType::f32);
  EXPECT_THROW(ops::cast(a, too_short), Error);

  EXPECT_TRUE(ops::all_finite(a));
  EXPECT_TRUE(ops::all_finite(ids));
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
      Tensor t = Tensor::zeros({5}, dtype);
      EXPECT_TRUE(ops::all_finite(t));
      t.set_item(3, bad);
      EXPECT_FALSE(ops::all_finite(t)) << dtype_name(dtype) << " with " << bad;
    }
  }
}

// The list forms (one wait on a GPU): each tensor's sum in order, and a
// non-finite element of any tensor found.
TEST(NnOps, SumSquaresAndFiniteCheckOfSeveralTensors) {
  const std::vector<Tensor> xs = {Tensor::from_values({1, 2, 3}), Tensor::zeros({0}),
                                  Tensor::from_values({0.5, -4}, DType::f32)};
  EXPECT_EQ(ops::sum_squares(xs), (std::vector<double>{14.0, 0.0, 16.25}));
  EXPECT_TRUE(ops::sum_squares(std::vector<Tensor>{}).empty());
  EXPECT_TRUE(ops::all_finite(xs));
  EXPECT_TRUE(ops::all_finite(std::vector<Tensor>{}));
  std::vector<Tensor> with_nan = xs;
  with_nan[2] = Tensor::from_values({1, std::nan("")}, DType::bf16);
  EXPECT_FALSE(ops::all_finite(with_nan)) << "a NaN in the last tensor of three";
}

// --- LayerNorm and softmax -------------------------------------------------------------------

TEST(NnOps, LayerNormGradientsByFiniteDifferences) {
  Rng rng(5);
  Tensor x = random_tensor({2, 3, 6}, rng, 1.5);
  Tensor weight = random_tensor({6}, rng);
  Tensor bias = random_tensor({6}, rng);
  Tensor dy = random_tensor({2, 3, 6}, rng);
  Tensor mean = Tensor::empty({6}, DType::f64), rstd = Tensor::empty({6}, DType::f64);
  auto loss = [&] {
    Tensor y = Tensor::empty(x.shape(), DType::f64);
    ops::layernorm_forward(x, weight, bias, y, mean, rstd);
    return weighted_sum(y, dy);
  };
  loss();
  // The saved statistics are the row mean and 1/sqrt(var + eps).
  double m = 0, v = 0;
  for (int c = 0; c < 6; ++c) m += x.item(c) / 6;
  for (int c = 0; c < 6; ++c) v += (x.item(c) - m) * (x.item(c) - m) / 6;
  EXPECT_NEAR(mean.item(0), m, 1e-14);
  EXPECT_NEAR(rstd.item(0), 1 / std::sqrt(v + 1e-5), 1e-12);

  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  Tensor dw = Tensor::full({6}, 0.25, DType::f64), db = Tensor::full({6}, -0.5, DType::f64);
  ops::layernorm_backward(dy, x, weight, mean, rstd, dx, dw, db);
  EXPECT_TRUE(gradients_match("layernorm dx", dx, numeric_gradient(x, loss)));
  // Parameter gradients accumulate onto what was there (0.25 and -0.5).
  std::vector<double> num_dw = numeric_gradient(weight, loss),
                      num_db = numeric_gradient(bias, loss);
  for (double& g : num_dw) g += 0.25;
  for (double& g : num_db) g -= 0.5;
  EXPECT_TRUE(gradients_match("layernorm dweight (accumulated)", dw, num_dw));
  EXPECT_TRUE(gradients_match("layernorm dbias (accumulated)", db, num_db));
}

TEST(NnOps, SoftmaxRowsSumToOneAndGradientByFiniteDifferences) {
  Rng rng(6);
  Tensor x = random_tensor({4, 5}, rng, 3.0);
  Tensor dy = random_tensor({4, 5}, rng);
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  auto loss = [&] {
    ops::softmax_forward(x, y);
    return weighted_sum(y, dy);
  };
  loss();
  for (int r = 0; r < 4; ++r) {
    double sum = 0;
    for (int c = 0; c < 5; ++c) sum += y.item(r * 5 + c);
    EXPECT_NEAR(sum, 1.0, 1e-14);
  }
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  ops::softmax_backward(y, dy, dx);
  EXPECT_TRUE(gradients_match("softmax dx", dx, numeric_gradient(x, loss)));
  // Huge logits do not overflow.
  Tensor big = Tensor::from_values({1000, 1000});
  Tensor p = Tensor::empty({2}, DType::f64);
  ops::softmax_forward(big, p);
  EXPECT_EQ(p.item(0), 0.5);
}

// --- attention --------------------------------------------------------------------------------

struct AttentionCase {
  std::string name;
  std::int64_t B, Tq, Tk, H, D;
  ops::AttentionMask mask;
};

std::vector<AttentionCase> attention_cases() {
  return {
      {"causal self-attention", 2, 5, 5, 2, 3, {true, 0, 0}},
      {"full (non-causal)", 1, 4, 6, 2, 3, {false, 0, 0}},
      {"causal block of a longer sequence (queries 6..9, keys 3..9)", 1, 4, 7, 3, 2, {true, 6, 3}},
      {"causal block where early queries see no key", 2, 4, 4, 1, 4, {true, 0, 2}},
  };
}

TEST(NnOps, AttentionGradientsByFiniteDifferences) {
  Rng rng(7);
  for (const AttentionCase& c : attention_cases()) {
    SCOPED_TRACE(c.name);
    Tensor q = random_tensor({c.B, c.Tq, c.H, c.D}, rng);
    Tensor k = random_tensor({c.B, c.Tk, c.H, c.D}, rng);
    Tensor v = random_tensor({c.B, c.Tk, c.H, c.D}, rng);
    Tensor dout = random_tensor({c.B, c.Tq, c.H, c.D}, rng);
    Tensor probs = Tensor::empty({c.B, c.H, c.Tq, c.Tk}, DType::f64);
    auto loss = [&] {
      Tensor out = Tensor::empty(q.shape(), DType::f64);
      ops::attention_forward(q, k, v, out, probs, c.mask);
      return weighted_sum(out, dout);
    };
    loss();
    Tensor dq = Tensor::empty(q.shape(), DType::f64), dk = Tensor::empty(k.shape(), DType::f64),
           dv = Tensor::empty(v.shape(), DType::f64);
    ops::attention_backward(q, k, v, probs, dout, dq, dk, dv, c.mask);
    EXPECT_TRUE(gradients_match("attention dq", dq, numeric_gradient(q, loss)));
    EXPECT_TRUE(gradients_match("attention dk", dk, numeric_gradient(k, loss)));
    EXPECT_TRUE(gradients_match("attention dv", dv, numeric_gradient(v, loss)));
  }
}

TEST(NnOps, AttentionMasksFutureKeysAndGivesZerosForRowsWithoutKeys) {
  Rng rng(8);
  Tensor q = random_tensor({1, 3, 1, 2}, rng), k = random_tensor({1, 3, 1, 2}, rng);
  Tensor v = random_tensor({1, 3, 1, 2}, rng);
  Tensor out = Tensor::empty(q.shape(), DType::f64);
  Tensor probs = Tensor::empty({1, 1, 3, 3}, DType::f64);
  ops::attention_forward(q, k, v, out, probs);
  EXPECT_EQ(probs.item(0 * 3 + 0), 1.0);  // the first query sees only the first key
  EXPECT_EQ(probs.item(0 * 3 + 1), 0.0);
  EXPECT_EQ(probs.item(1 * 3 + 2), 0.0);
  EXPECT_EQ(out.item(0), v.item(0));
  // Queries at positions 0..2 against keys at 5..7: nothing is visible.
  ops::attention_forward(q, k, v, out, probs, {true, 0, 5});
  for (std::int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.item(i), 0.0);
}

TEST(NnOps, FlashAttentionEqualsNaiveForwardAndBackward) {
  Rng rng(9);
  std::vector<AttentionCase> cases = attention_cases();
  cases.push_back({"longer sequence, several key blocks", 2, 37, 37, 2, 8, {true, 0, 0}});
  for (const AttentionCase& c : cases) {
    for (std::int64_t block : {1, 3, 16, 64}) {
      SCOPED_TRACE(c.name + ", block " + std::to_string(block));
      Tensor q = random_tensor({c.B, c.Tq, c.H, c.D}, rng);
      Tensor k = random_tensor({c.B, c.Tk, c.H, c.D}, rng);
      Tensor v = random_tensor({c.B, c.Tk, c.H, c.D}, rng);
      Tensor dout = random_tensor(q.shape(), rng);
      Tensor naive = Tensor::empty(q.shape(), DType::f64),
             flash = Tensor::empty(q.shape(), DType::f64);
      Tensor probs = Tensor::empty({c.B, c.H, c.Tq, c.Tk}, DType::f64);
      Tensor row_max = Tensor::empty({c.B, c.H, c.Tq}, DType::f64);
      Tensor row_sum = Tensor::empty({c.B, c.H, c.Tq}, DType::f64);
      ops::attention_forward(q, k, v, naive, probs, c.mask);
      ops::flash_attention_forward(q, k, v, flash, row_max, row_sum, c.mask, 0, block);
      EXPECT_LT(max_difference(naive, flash), 1e-13);
      Tensor dq1 = Tensor::empty(q.shape(), DType::f64), dk1 = Tensor::empty(k.shape(), DType::f64),
             dv1 = Tensor::empty(v.shape(), DType::f64);
      Tensor dq2 = dq1.clone(), dk2 = dk1.clone(), dv2 = dv1.clone();
      ops::attention_backward(q, k, v, probs, dout, dq1, dk1, dv1, c.mask);
      ops::flash_attention_backward(q, k, v, flash, row_max, row_sum, dout, dq2, dk2, dv2, c.mask);
      EXPECT_LT(max_difference(dq1, dq2), 1e-12);
      EXPECT_LT(max_difference(dk1, dk2), 1e-12);
      EXPECT_LT(max_difference(dv1, dv2), 1e-12);
    }
  }
}

TEST(NnOps, FlashAttentionInF32AgreesWithF64) {
  Rng rng(10);
  Tensor q = random_tensor({2, 20, 2, 8}, rng), k = random_tensor({2, 20, 2, 8}, rng);
  Tensor v = random_tensor({2, 20, 2, 8}, rng);
  Tensor out64 = Tensor::empty(q.shape(), DType::f64);
  Tensor m64 = Tensor::empty({2, 2, 20}, DType::f64), l64 = m64.clone();
  ops::flash_attention_forward(q, k, v, out64, m64, l64);
  auto to32 = [](const Tensor& t) {
    Tensor out = Tensor::empty(t.shape(), DType::f32);
    ops::cast(t, out);
    return out;
  };
  Tensor out32 = Tensor::empty(q.shape(), DType::f32);
  Tensor m32 = Tensor::empty({2, 2, 20}, DType::f32), l32 = m32.clone();
  ops::flash_attention_forward(to32(q), to32(k), to32(v), out32, m32, l32);
  EXPECT_LT(max_difference(out64, out32), 1e-5);
}

TEST(NnOps, MergingTwoKeyHalvesEqualsAttentionOverAllKeys) {
  // Ring attention's step: attention over keys [0, s) and over [s, Tk) merged
  // with their row max and sum equals attention over all keys.
  Rng rng(11);
  for (bool causal : {true, false}) {
    for (std::int64_t split : {1, 3, 4, 6}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "full") + ", split at key " +
                   std::to_string(split));
      const std::int64_t B = 2, T = 7, H = 2, D = 3;
      Tensor q = random_tensor({B, T, H, D}, rng), k = random_tensor({B, T, H, D}, rng);
      Tensor v = random_tensor({B, T, H, D}, rng);
      Tensor whole = Tensor::empty(q.shape(), DType::f64);
      Tensor m = Tensor::empty({B, H, T}, DType::f64), l = m.clone();
      ops::flash_attention_forward(q, k, v, whole, m, l, {causal, 0, 0});

      auto keys = [&](const Tensor& t, std::int64_t first, std::int64_t count) {
        Tensor part = Tensor::empty({B, count, H, D}, DType::f64);
        for (std::int64_t b = 0; b < B; ++b)
          part.slice(b * count * H * D, count * H * D)
              .copy_from(t.slice((b * T + first) * H * D, count * H * D));
        return part;
      };
      Tensor out_a = Tensor::empty(q.shape(), DType::f64), out_b = out_a.clone();
      Tensor m_a = m.clone(), l_a = m.clone(), m_b = m.clone(), l_b = m.clone();
      ops::flash_attention_forward(q, keys(k, 0, split), keys(v, 0, split), out_a, m_a, l_a,
                                   {causal, 0, 0});
      ops::flash_attention_forward(q, keys(k, split, T - split), keys(v, split, T - split), out_b,
                                   m_b, l_b, {causal, 0, split});
      // Merge in both orders: b into a, and a into b (with causal masking,
      // the first rows saw nothing in b).
      Tensor merged = out_b.clone(), m_merged = m_b.clone(), l_merged = l_b.clone();
      ops::attention_merge(merged, m_merged, l_merged, out_a, m_a, l_a);
      ops::attention_merge(out_a, m_a, l_a, out_b, m_b, l_b);
      EXPECT_LT(max_difference(out_a, whole), 1e-13);
      EXPECT_LT(max_difference(m_a, m), 1e-15);
      EXPECT_LT(max_difference(l_a, l), 1e-12);
      EXPECT_LT(max_difference(merged, whole), 1e-13);
    }
  }
}

TEST(NnOps, MergeStatisticsFollowTheFormula) {
  // One row, D = 1: a saw scores {0} (max 0, sum 1, out 2), b saw {ln 3}
  // (max ln 3, sum 1, out 5). Union: weights 1 and 3 -> out (2 + 15) / 4.
  Tensor out = Tensor::from_values({2.0}).view({1, 1, 1, 1});
  Tensor m = Tensor::from_values({0.0}).view({1, 1, 1}),
         l = Tensor::from_values({1.0}).view({1, 1, 1});
  Tensor other = Tensor::from_values({5.0}).view({1, 1, 1, 1});
  Tensor om = Tensor::from_values({std::log(3.0)}).view({1, 1, 1});
  Tensor ol = Tensor::from_values({1.0}).view({1, 1, 1});
  ops::attention_merge(out, m, l, other, om, ol);
  EXPECT_NEAR(out.item(0), 17.0 / 4.0, 1e-15);
  EXPECT_NEAR(m.item(0), std::log(3.0), 1e-15);
  EXPECT_NEAR(l.item(0), 4.0 / 3.0, 1e-15);  // sum of exp(score - new max): 1/3 + 1
  // A partial that saw no key (sum 0, max -inf) changes nothing.
  Tensor none = Tensor::from_values({0.0}).view({1, 1, 1, 1});
  Tensor none_m = Tensor::from_values({-std::numeric_limits<double>::infinity()}).view({1, 1, 1});
  Tensor none_l = Tensor::from_values({0.0}).view({1, 1, 1});
  ops::attention_merge(out, m, l, none, none_m, none_l);
  EXPECT_NEAR(out.item(0), 17.0 / 4.0, 1e-15);
}

// --- embedding and cross-entropy -------------------------------------------------------------

TEST(NnOps, EmbeddingAndPositionsGradientsByFiniteDifferences) {
  Rng rng(12);
  const int V = 5;
  Tensor ids = random_ids({2, 4}, V, rng);
  Tensor table = random_tensor({V, 3}, rng);
  Tensor positions = random_tensor({6, 3}, rng);
  Tensor dout = random_tensor({2, 4, 3}, rng);
  const std::int64_t start = 1;
  auto loss = [&] {
    Tensor x = Tensor::empty({2, 4, 3}, DType::f64);
    ops::embedding_forward(ids, table, x);
    ops::add_positions(x, positions, start);
    return weighted_sum(x, dout);
  };
  Tensor dtable = Tensor::zeros(table.shape(), DType::f64);
  Tensor dpositions = Tensor::zeros(positions.shape(), DType::f64);
  ops::embedding_backward(ids, dout, dtable);
  ops::positions_backward(dout, dpositions, start);
  EXPECT_TRUE(gradients_match("embedding dtable", dtable, numeric_gradient(table, loss)));
  EXPECT_TRUE(
      gradients_match("embedding dpositions", dpositions, numeric_gradient(positions, loss)));

  ids.data<std::int32_t>()[5] = V;
  try {
    loss();
    FAIL() << "an id outside the vocabulary must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 5"), std::string::npos) << e.what();
  }
  Tensor x = Tensor::empty({1, 6, 3}, DType::f64);
  EXPECT_THROW(ops::add_positions(x, positions, 1), Error);  // positions 1..6 of a table of 6
}

TEST(NnOps, CrossEntropyValueAndGradientByFiniteDifferences) {
  Rng rng(13);
  const std::int64_t N = 6, V = 7;
  Tensor logits = random_tensor({2, 3, V}, rng, 2.0);
  Tensor targets = random_ids({2, 3}, V, rng);
  Tensor losses = Tensor::empty({N}, DType::f64);
  auto loss = [&] { return ops::cross_entropy_forward(logits, targets, losses); };
  const double mean = loss();
  double expected = 0;
  for (std::int64_t n = 0; n < N; ++n) {
    double sum = 0;
    for (std::int64_t c = 0; c < V; ++c) sum += std::exp(logits.item(n * V + c));
    const double row = std::log(sum) - logits.item(n * V + targets.data<std::int32_t>()[n]);
    EXPECT_NEAR(losses.item(n), row, 1e-12);
    expected += row / N;
  }
  EXPECT_NEAR(mean, expected, 1e-12);

  Tensor dlogits = Tensor::empty(logits.shape(), DType::f64);
  ops::cross_entropy_backward(logits, targets, 1.0 / N, dlogits);
  EXPECT_TRUE(gradients_match("cross-entropy dlogits", dlogits, numeric_gradient(logits, loss)));
  // In place gives the same gradient.
  Tensor in_place = logits.clone();
  ops::cross_entropy_backward(in_place, targets, 1.0 / N, in_place);
  EXPECT_LT(max_difference(in_place, dlogits), 1e-15);
  // Uniform logits: the loss is ln V.
  Tensor zeros = Tensor::zeros({1, V}, DType::f32);
  Tensor none;
  EXPECT_NEAR(ops::cross_entropy_forward(zeros, Tensor::from_values({3}, DType::i32), none),
              std::log(static_cast<double>(V)), 1e-6);
}

// --- permute -------------------------------------------------------------------------------

// Every one of the 24 orders on a shape with four different sizes, for
// elements of 8, 4 and 2 bytes: out[i0, i1, i2, i3] = in[j] with j[order[k]] = i_k.
TEST(NnOps, PermuteMovesEveryElementForEveryOrderAndElementSize) {
  const std::int64_t size[4] = {2, 3, 4, 5};
  for (DType dtype : {DType::f64, DType::i32, DType::bf16}) {
    std::vector<double> values(120);
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<double>(i);  // exact in bf16 up to 256
    const Tensor in = Tensor::from_values(values, dtype).view({2, 3, 4, 5});
    std::array<int, 4> order{0, 1, 2, 3};
    do {
      Tensor out =
          Tensor::zeros({size[order[0]], size[order[1]], size[order[2]], size[order[3]]}, dtype);
      ops::permute(in, order, out);
      std::int64_t i[4];
      for (i[0] = 0; i[0] < out.size(0); ++i[0])
        for (i[1] = 0; i[1] < out.size(1); ++i[1])
          for (i[2] = 0; i[2] < out.size(2); ++i[2])
            for (i[3] = 0; i[3] < out.size(3); ++i[3]) {
              std::int64_t j[4];
              for (int k = 0; k < 4; ++k) j[order[k]] = i[k];
              const std::int64_t at =
                  ((i[0] * out.size(1) + i[1]) * out.size(2) + i[2]) * out.size(3) + i[3];
              const double want = static_cast<double>(((j[0] * 3 + j[1]) * 4 + j[2]) * 5 + j[3]);
              ASSERT_EQ(out.item(at), want)
                  << dtype_name(dtype) << ", order " << order[0] << order[1] << order[2] << order[3]
                  << ", out element " << at;
            }
    } while (std::next_permutation(order.begin(), order.end()));
  }
}

TEST(NnOps, PermuteErrorsNameTheOrderOrTheShape) {
  const Tensor in = Tensor::zeros({2, 3, 4, 5});
  Tensor out = Tensor::zeros({4, 2, 3, 5});
  auto error_of = [&](const std::array<int, 4>& order, Tensor& o) {
    return testing::error_of([&] { ops::permute(in, order, o); });
  };
  EXPECT_NE(error_of({2, 0, 1, 1}, out).find("a permutation of 0, 1, 2, 3, got 2, 0, 1, 1"),
            std::string::npos);
  EXPECT_NE(error_of({1, 0, 2, 3}, out).find("out's axis 0 is in's axis 1 (size 3)"),
            std::string::npos);
  Tensor flat = Tensor::zeros({120});
  EXPECT_NE(error_of({0, 1, 2, 3}, flat).find("must be 4-D"), std::string::npos);
  EXPECT_EQ(error_of({2, 0, 1, 3}, out), "(no error)");
}

}  // namespace
}  // namespace dtp
