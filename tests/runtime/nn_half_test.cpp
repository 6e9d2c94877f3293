// The CPU ops on bf16 and f16 tensors: inputs read as f32, computed in f32,
// each stored value rounded to nearest even once (the GPU kernels' contract).
// The expected values are the f32 op on the exactly widened inputs, rounded
// by the checker; a GPT in bf16/f16 against the same GPT in f64.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/nn_ops.h"
#include "nn_test_helpers.h"
#include "support/harness.h"

namespace dtp {
namespace {

using testing::error_of;
using testing::random_ids;
using testing::random_tensor;

const DType kHalfTypes[] = {DType::bf16, DType::f16};

// The 16-bit value nearest to v, as a double: what one rounding gives.
double rounded(double v, DType half) {
  const float f = static_cast<float>(v);
  return half == DType::bf16 ? bf16_to_float(float_to_bf16(f)) : f16_to_float(float_to_f16(f));
}

Tensor cast_to(const Tensor& t, DType dtype) {
  Tensor out = Tensor::empty(t.shape(), dtype);
  ops::cast(t, out);
  return out;
}

// Every element of got (16-bit) must be the f32 result rounded once.
void expect_rounded_once(const std::string& what, const Tensor& f32_result, const Tensor& got) {
  ASSERT_EQ(got.numel(), f32_result.numel()) << what;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double expected = rounded(f32_result.item(i), got.dtype());
    ASSERT_EQ(got.item(i), expected)
        << what << " in " << dtype_name(got.dtype()) << ", element " << i << ": expected "
        << expected << " (the f32 result " << f32_result.item(i)
        << " rounded once to nearest even), got " << got.item(i)
        << (std::abs(got.item(i) - f32_result.item(i)) > std::abs(expected - f32_result.item(i))
                ? ": further from the f32 result than one rounding allows (computed in 16 bits?)"
                : "");
  }
}

// ops::cast between f32 and the 16-bit types converts arrays 8 values at a
// time where the CPU can (cpu/convert.cpp); each element must have the bits
// of the scalar casts in dtp/dtype.h. Every f16 and bf16 pattern going up;
// going down, every f32 exponent with the mantissas at the rounding
// boundaries of both formats, NaNs with payloads and random patterns, in a
// length that leaves a tail.
TEST(NnHalfOps, CastsToAndFromF32HaveTheScalarCastsBits) {
  std::vector<std::uint16_t> every16(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) every16[b] = static_cast<std::uint16_t>(b);
  for (DType half : kHalfTypes) {
    Tensor t = Tensor::empty({65536}, half), up = Tensor::empty({65536}, DType::f32);
    std::memcpy(t.raw(), every16.data(), 65536 * 2);
    ops::cast(t, up);
    const std::uint32_t* got = static_cast<const std::uint32_t*>(up.raw());
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const std::uint16_t bits = static_cast<std::uint16_t>(b);
      const float want = half == DType::bf16 ? bf16_to_float(bf16{bits}) : f16_to_float(f16{bits});
      ASSERT_EQ(got[b], std::bit_cast<std::uint32_t>(want))
          << dtype_name(half) << " 0x" << std::hex << b << " cast to f32";
    }
  }
  std::vector<std::uint32_t> patterns;
  const std::uint32_t mantissas[] = {0,        1,        0xFFF,   0x1000,   0x1001,   0x1FFF,
                                     0x2000,   0x2001,   0x3000,  0x7FFF,   0x8000,   0x8001,
                                     0xFFFF,   0x10000,  0x18000, 0x7FFFFF, 0x400000, 0x400001,
                                     0x7FE000, 0x7FF000, 0x7FEFFF};
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent)
      for (std::uint32_t m : mantissas) patterns.push_back(sign | exponent << 23 | m);
  std::uint64_t state = 12345;
  for (int i = 0; i < 200003; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    patterns.push_back(static_cast<std::uint32_t>(state >> 32));
  }
  const auto n = static_cast<std::int64_t>(patterns.size());
  Tensor f32 = Tensor::empty({n}, DType::f32);
  std::memcpy(f32.raw(), patterns.data(), patterns.size() * 4);
  for (DType half : kHalfTypes) {
    const Tensor down = cast_to(f32, half);
    const std::uint16_t* got = static_cast<const std::uint16_t*>(down.raw());
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = std::bit_cast<float>(patterns[i]);
      const std::uint16_t want = half == DType::bf16 ? float_to_bf16(x).bits : float_to_f16(x).bits;
      ASSERT_EQ(got[i], want) << "f32 0x" << std::hex << patterns[i] << " (" << x << ") cast to "
                              << dtype_name(half) << std::dec << ", element " << i << " of " << n;
    }
  }
}

TEST(NnHalfOps, ElementwiseAndMatmulRoundEachStoredValueOnce) {
  for (DType half : kHalfTypes) {
    Rng rng(7);
    // 16-bit inputs, and their exact f32 copies.
    const Tensor a = cast_to(random_tensor({6, 5}, rng, 1.0, DType::f32), half);
    const Tensor b = cast_to(random_tensor({5, 4}, rng, 1.0, DType::f32), half);
    const Tensor af = cast_to(a, DType::f32), bf = cast_to(b, DType::f32);

    Tensor out = Tensor::empty({6, 4}, half), outf = Tensor::empty({6, 4}, DType::f32);
    ops::matmul(a, b, out);
    ops::matmul(af, bf, outf);
    expect_rounded_once("matmul", outf, out);

    Tensor g = Tensor::empty({6, 5}, half), gf = Tensor::empty({6, 5}, DType::f32);
    ops::gelu_forward(a, g);
    ops::gelu_forward(af, gf);
    expect_rounded_once("gelu_forward", gf, g);

    // In place (y aliasing x) gives the same.
    Tensor in_place = a.clone();
    ops::gelu_forward(in_place, in_place);
    expect_rounded_once("gelu_forward in place", gf, in_place);
  }
}

TEST(NnHalfOps, AccumulatingOutputsAddToTheirOldValueInF32ThenRound) {
  for (DType half : kHalfTypes) {
    Rng rng(11);
    const Tensor dy = cast_to(random_tensor({8, 3}, rng, 1.0, DType::f32), half);
    const Tensor old = cast_to(random_tensor({3}, rng, 4.0, DType::f32), half);
    Tensor dbias = old.clone();
    ops::bias_backward(dy, dbias);
    Tensor expected = cast_to(old, DType::f32);
    ops::bias_backward(cast_to(dy, DType::f32), expected);
    expect_rounded_once("bias_backward (dbias += column sums)", expected, dbias);
  }
}

TEST(NnHalfOps, LayerNormAndCrossEntropyRoundTheirOutputs) {
  for (DType half : kHalfTypes) {
    Rng rng(3);
    const Tensor x = cast_to(random_tensor({4, 6}, rng, 2.0, DType::f32), half);
    const Tensor w = cast_to(random_tensor({6}, rng, 1.0, DType::f32), half);
    const Tensor b = cast_to(random_tensor({6}, rng, 1.0, DType::f32), half);
    Tensor y = Tensor::empty({4, 6}, half), mean = Tensor::empty({4}, half),
           rstd = Tensor::empty({4}, half);
    ops::layernorm_forward(x, w, b, y, mean, rstd);
    Tensor yf = Tensor::empty({4, 6}), meanf = Tensor::empty({4}), rstdf = Tensor::empty({4});
    ops::layernorm_forward(cast_to(x, DType::f32), cast_to(w, DType::f32), cast_to(b, DType::f32),
                           yf, meanf, rstdf);
    expect_rounded_once("layernorm_forward y", yf, y);
    expect_rounded_once("layernorm_forward rstd", rstdf, rstd);

    const Tensor targets = random_ids({4}, 6, rng);
    Tensor losses = Tensor::empty({4}, half), lossesf = Tensor::empty({4});
    const double loss = ops::cross_entropy_forward(x, targets, losses);
    const double lossf = ops::cross_entropy_forward(cast_to(x, DType::f32), targets, lossesf);
    expect_rounded_once("cross_entropy_forward losses", lossesf, losses);
    EXPECT_EQ(loss, lossf) << "the mean loss is returned as a double, from the f32 computation";
  }
}

TEST(NnHalfOps, MixedDtypesAreRefusedNamingTheOperand) {
  Rng rng(1);
  const Tensor x = cast_to(random_tensor({4}, rng, 1.0, DType::f32), DType::bf16);
  Tensor y = Tensor::empty({4}, DType::f32);
  const std::string message = error_of([&] { ops::gelu_forward(x, y); });
  EXPECT_NE(message.find("gelu_forward: y is"), std::string::npos) << message;
  EXPECT_NE(message.find("must be bf16"), std::string::npos) << message;
}

// The tiny test GPT in 16 bits against the same weights in f64: a 16-bit
// run is an approximation, so this checks it is a close one (a wrong op
// would be off by far more than rounding).
TEST(NnHalfModel, LossAndGradientsFollowTheF64Model) {
  for (DType half : kHalfTypes) {
    for (AttentionKind attention : {AttentionKind::naive, AttentionKind::flash}) {
      GPTConfig c = testing::tiny_f64_config();
      c.init_std = 0.1;
      c.attention = attention;
      GPT reference(c);
      c.dtype = half;
      GPT model(c);
      Rng rng(5);
      const Tensor tokens = random_ids({2, 6}, c.vocab_size, rng);
      const Tensor targets = random_ids({2, 6}, c.vocab_size, rng);
      const std::string label =
          std::string(dtype_name(half)) + " " + attention_kind_name(attention);

      const double ref_loss = reference.forward(tokens, targets);
      reference.backward();
      const double loss = model.forward(tokens, targets);
      model.backward();
      EXPECT_NEAR(loss, ref_loss, 0.02 * ref_loss) << label << ": loss";

      // Each unit's gradient points the same way as f64's (cosine > 0.99).
      auto units = model.units();
      auto ref_units = reference.units();
      for (std::size_t u = 0; u < units.size(); ++u) {
        const Tensor g = cast_to(units[u]->grads(), DType::f64);
        const Tensor r = ref_units[u]->grads();
        double dot = 0, gg = 0, rr = 0;
        for (std::int64_t i = 0; i < r.numel(); ++i) {
          dot += g.item(i) * r.item(i);
          gg += g.item(i) * g.item(i);
          rr += r.item(i) * r.item(i);
        }
        ASSERT_GT(rr, 0) << label << " unit " << units[u]->name() << ": f64 gradient is zero";
        EXPECT_GT(dot / std::sqrt(gg * rr), 0.99)
            << label << " unit " << units[u]->name()
            << ": the gradient's direction differs from f64's";
      }
    }
  }
}

}  // namespace
}  // namespace dtp
