// The CUDA nn kernels against the CPU ones: the same inputs (random_uniform
// with one seed gives identical values on both devices) must give the same
// outputs within stated tolerances, op by op and for a whole GPT training
// step. Skips without a GPU; fails instead under DTP_REQUIRE_GPU=1.
//
// Tolerances (max |gpu - cpu| <= atol + rtol * |cpu|, element-wise):
// - f32 element-wise, LayerNorm, softmax, cross-entropy, optimizers:
//   rtol = atol = 1e-5 (order of summation differs; the kernels use
//   expf/tanhf where the CPU uses std::exp/fast_tanh).
// - anything that multiplies on tensor cores in TF32 (matmul and naive
//   attention through cuBLAS, flash attention's WMMA kernels): rtol = 1e-2,
//   atol = 1e-2 * max|cpu| (TF32 keeps 10 mantissa bits). The flash kernels'
//   tiling and masking are checked tighter (2e-3) on the CPU, under the
//   emulator (tests/emulated/flash_attention_test.cpp).
// - f32 flash attention with TF32 off (its exact f32 kernels): rtol =
//   2 n 2^-24 with n = Tq + Tk + D + 2, atol = rtol * max|cpu| (for a
//   gradient, the max over all three). The sums of at most Tq + Tk + D terms
//   in all that make an output, in other orders than the CPU's, as derived
//   in tests/emulated/flash_attention_test.cpp, plus two roundings for
//   CUDA's expf (at most 2 ulp where the CPU's is within 1).
// - a whole GPT step (TF32 matmuls): loss within 1e-3 relative, every
//   gradient within 2e-2 of its buffer's max |grad|, and after one AdamW
//   step every parameter within 2 lr (Adam normalizes the step, so a
//   near-zero gradient whose sign differs moves by up to lr either way) with
//   at least 99% of them within 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cuda/nn_kernels.h"
#include "dtp/nn.h"
#include "dtp/nn_ops.h"
#include "dtp/optim.h"
#include "gpu/cpu_gpu_pairs.h"
#include "support/harness.h"

namespace dtp {
namespace {

using namespace testing;

constexpr double kTight = 1e-5;
constexpr double kTf32 = 1e-2;

void expect_close_tf32(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  expect_close(gpu, cpu, kTf32, kTf32 * std::max(1e-30, max_abs(cpu.to_vector())), what);
}

TEST(CudaNnOps, ElementwiseMatchTheCpu) {
  DTP_REQUIRE_GPU();
  const Shape shape{3, 1000};
  Pair a = rand_pair(shape, 1), b = rand_pair(shape, 2);
  Pair out = zeros_pair(shape);
  ops::add(a.cpu, b.cpu, out.cpu);
  ops::add(a.gpu, b.gpu, out.gpu);
  expect_close(out.gpu, out.cpu, kTight, kTight, "add");
  ops::axpy(out.cpu, -0.37, a.cpu);
  ops::axpy(out.gpu, -0.37, a.gpu);
  expect_close(out.gpu, out.cpu, kTight, kTight, "axpy");
  EXPECT_NEAR(ops::sum_squares(a.gpu), ops::sum_squares(a.cpu), 1e-9 * ops::sum_squares(a.cpu));
  EXPECT_TRUE(ops::all_finite(a.gpu));
  Tensor bad = a.gpu.clone();
  bad.set_item(2999, std::nan(""));
  EXPECT_FALSE(ops::all_finite(bad));
  bad.set_item(2999, INFINITY);
  EXPECT_FALSE(ops::all_finite(bad));

  Pair bias = rand_pair({1000}, 3);
  ops::add_bias(out.cpu, bias.cpu);
  ops::add_bias(out.gpu, bias.gpu);
  expect_close(out.gpu, out.cpu, kTight, kTight, "add_bias");
  Pair dbias = rand_pair({1000}, 4);
  ops::bias_backward(a.cpu, dbias.cpu);
  ops::bias_backward(a.gpu, dbias.gpu);
  expect_close(dbias.gpu, dbias.cpu, kTight, kTight, "bias_backward (accumulates)");

  Pair x = rand_pair(shape, 5, -6, 6), y = zeros_pair(shape), dx = zeros_pair(shape);
  ops::gelu_forward(x.cpu, y.cpu);
  ops::gelu_forward(x.gpu, y.gpu);
  expect_close(y.gpu, y.cpu, kTight, kTight, "gelu_forward");
  ops::gelu_backward(x.cpu, b.cpu, dx.cpu);
  ops::gelu_backward(x.gpu, b.gpu, dx.gpu);
  expect_close(dx.gpu, dx.cpu, kTight, kTight, "gelu_backward");
}

// Views one element past an aligned start take the kernels' scalar path
// (16-byte accesses need aligned pointers); odd row widths take it for
// LayerNorm and the bias. Both paths must give the CPU's results.
TEST(CudaNnOps, ElementwiseOnUnalignedViewsMatchTheCpu) {
  DTP_REQUIRE_GPU();
  Pair a = rand_pair({3001}, 21), b = rand_pair({3001}, 22);
  Tensor a_cpu = a.cpu.slice(1, 3000), a_gpu = a.gpu.slice(1, 3000);
  Tensor b_cpu = b.cpu.slice(1, 3000), b_gpu = b.gpu.slice(1, 3000);
  ops::axpy(a_cpu, 0.5, b_cpu);
  ops::axpy(a_gpu, 0.5, b_gpu);
  expect_close(a.gpu, a.cpu, kTight, kTight,
               "axpy on views at element 1 (and element 0 untouched)");
  ops::gelu_forward(b_cpu, a_cpu);
  ops::gelu_forward(b_gpu, a_gpu);
  expect_close(a.gpu, a.cpu, kTight, kTight, "gelu_forward on views at element 1");
  for (std::int64_t cols : {771, 768}) {
    SCOPED_TRACE("rows of " + std::to_string(cols));
    Pair x = rand_pair({9, cols}, 23), w = rand_pair({cols}, 24, 0.5, 1.5),
         bias = rand_pair({cols}, 25);
    Pair y = zeros_pair({9, cols}), mean = zeros_pair({9}), rstd = zeros_pair({9});
    ops::layernorm_forward(x.cpu, w.cpu, bias.cpu, y.cpu, mean.cpu, rstd.cpu);
    ops::layernorm_forward(x.gpu, w.gpu, bias.gpu, y.gpu, mean.gpu, rstd.gpu);
    expect_close(y.gpu, y.cpu, kTight, kTight, "layernorm_forward");
    ops::add_bias(x.cpu, bias.cpu);
    ops::add_bias(x.gpu, bias.gpu);
    expect_close(x.gpu, x.cpu, kTight, kTight, "add_bias");
  }
}

// The batched forms wait once for many tensors; each result is the one-tensor op's.
TEST(CudaNnOps, SumSquaresAndFiniteCheckOfManyTensorsMatchOneByOne) {
  DTP_REQUIRE_GPU();
  std::vector<Tensor> xs = {rand_on(kGpu, {1000}, 31), rand_on(kGpu, {1}, 32),
                            rand_on(kGpu, {0}, 33), rand_on(kGpu, {70001}, 34)};
  const std::vector<double> sums = ops::sum_squares(xs);
  ASSERT_EQ(sums.size(), xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i)
    EXPECT_EQ(sums[i], ops::sum_squares(xs[i]))
        << "tensor " << i << ": the batched sum must be the same bits";
  EXPECT_TRUE(ops::all_finite(xs));
  xs[3].set_item(70000, std::nan(""));
  EXPECT_FALSE(ops::all_finite(xs)) << "a NaN in the last element of the last tensor";
  EXPECT_TRUE(std::isnan(ops::sum_squares(xs)[3]));
}

TEST(CudaNnOps, BiasBackwardOverManyRowsMatchesTheCpuAndRepeatsBitForBit) {
  DTP_REQUIRE_GPU();
  // 8195 rows x 771 columns: many row slices, a last slice and a last column
  // block that are partly empty.
  Pair dy = rand_pair({5, 1639, 771}, 11);
  Pair dbias = rand_pair({771}, 12);
  Tensor again = dbias.gpu.clone();
  ops::bias_backward(dy.cpu, dbias.cpu);
  ops::bias_backward(dy.gpu, dbias.gpu);
  // Sums of ~8k f32 values of size ~1 in two different orders: ~1e-3 apart at worst.
  expect_close(dbias.gpu, dbias.cpu, 1e-4, 2e-3, "bias_backward (sum of 8195 rows, accumulated)");
  ops::bias_backward(dy.gpu, again);
  EXPECT_EQ(again.to_vector(), dbias.gpu.to_vector())
      << "bias_backward: two runs on the same input differ";
}

TEST(CudaNnOps, CastsMatchTheCpu) {
  DTP_REQUIRE_GPU();
  Pair x = rand_pair({4099}, 6, -100, 100);
  for (DType dtype : {DType::f64, DType::bf16, DType::f16, DType::i32, DType::f32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Pair y = zeros_pair({4099}, dtype);
    ops::cast(x.cpu, y.cpu);
    ops::cast(x.gpu, y.gpu);
    EXPECT_EQ(y.gpu.to_vector(), y.cpu.to_vector());  // conversions are exact functions
    Pair back = zeros_pair({4099});
    ops::cast(y.cpu, back.cpu);
    ops::cast(y.gpu, back.gpu);
    EXPECT_EQ(back.gpu.to_vector(), back.cpu.to_vector());
  }
}

TEST(CudaNnOps, MatmulMatchesTheCpuWithinTf32) {
  DTP_REQUIRE_GPU();
  const std::int64_t M = 67, N = 45, K = 130;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string("transpose_a ") + (ta ? "1" : "0") + " transpose_b " +
                   (tb ? "1" : "0"));
      Pair a = rand_pair(ta ? Shape{K, M} : Shape{M, K}, 7),
           b = rand_pair(tb ? Shape{N, K} : Shape{K, N}, 8);
      Pair c = rand_pair({M, N}, 9);
      ops::matmul(a.cpu, b.cpu, c.cpu, ta, tb, 0.5, 1.0);  // accumulate into existing values
      ops::matmul(a.gpu, b.gpu, c.gpu, ta, tb, 0.5, 1.0);
      expect_close_tf32(c.gpu, c.cpu, "matmul beta=1");
      Tensor nan_out = Tensor::full({M, N}, std::nan(""), DType::f32, kGpu);
      ops::matmul(a.gpu, b.gpu, nan_out, ta, tb, 0.5, 0.0);  // beta 0 ignores old NaNs
      EXPECT_TRUE(ops::all_finite(nan_out));
    }
  // A [B, T, C] activation times a weight [out, C]^T, as Linear does.
  Pair x = rand_pair({2, 33, 48}, 10), w = rand_pair({96, 48}, 11), y = zeros_pair({2, 33, 96});
  ops::matmul(x.cpu, w.cpu, y.cpu, false, true);
  ops::matmul(x.gpu, w.gpu, y.gpu, false, true);
  expect_close_tf32(y.gpu, y.cpu, "linear");
}

TEST(CudaNnOps, UnsupportedDtypesFailClearly) {
  DTP_REQUIRE_GPU();
  Tensor a = rand_on(kGpu, {4, 4}, 1, -1, 1, DType::f64),
         out = Tensor::zeros({4, 4}, DType::f64, kGpu);
  try {
    ops::gelu_forward(a, out);
    FAIL() << "f64 gelu on CUDA should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("support f32, bf16 and f16"), std::string::npos)
        << e.what();
  }
}

TEST(CudaNnOps, LayerNormAndSoftmaxMatchTheCpu) {
  DTP_REQUIRE_GPU();
  for (std::int64_t C : {50, 768}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const Shape shape{2, 37, C};
    Pair x = rand_pair(shape, 12, -3, 3), w = rand_pair({C}, 13, 0.5, 1.5), b = rand_pair({C}, 14);
    Pair y = zeros_pair(shape), mean = zeros_pair({2, 37}), rstd = zeros_pair({2, 37});
    ops::layernorm_forward(x.cpu, w.cpu, b.cpu, y.cpu, mean.cpu, rstd.cpu);
    ops::layernorm_forward(x.gpu, w.gpu, b.gpu, y.gpu, mean.gpu, rstd.gpu);
    expect_close(y.gpu, y.cpu, kTight, kTight, "layernorm y");
    expect_close(mean.gpu, mean.cpu, kTight, kTight, "layernorm mean");
    expect_close(rstd.gpu, rstd.cpu, kTight, kTight, "layernorm rstd");
    Pair dy = rand_pair(shape, 15), dx = zeros_pair(shape), dw = rand_pair({C}, 16),
         db = rand_pair({C}, 17);
    ops::layernorm_backward(dy.cpu, x.cpu, w.cpu, mean.cpu, rstd.cpu, dx.cpu, dw.cpu, db.cpu);
    ops::layernorm_backward(dy.gpu, x.gpu, w.gpu, mean.gpu, rstd.gpu, dx.gpu, dw.gpu, db.gpu);
    expect_close(dx.gpu, dx.cpu, kTight, kTight, "layernorm dx");
    expect_close(dw.gpu, dw.cpu, 1e-4, 1e-4, "layernorm dweight (sum of 74 rows)");
    expect_close(db.gpu, db.cpu, 1e-4, 1e-4, "layernorm dbias (sum of 74 rows)");

    Pair s = zeros_pair(shape), ds = zeros_pair(shape);
    ops::softmax_forward(x.cpu, s.cpu);
    ops::softmax_forward(x.gpu, s.gpu);
    expect_close(s.gpu, s.cpu, kTight, kTight, "softmax");
    ops::softmax_backward(s.cpu, dy.cpu, ds.cpu);
    ops::softmax_backward(s.gpu, dy.gpu, ds.gpu);
    expect_close(ds.gpu, ds.cpu, kTight, kTight, "softmax backward");
  }
}

struct AttentionCase {
  std::int64_t B, Tq, Tk, H, D;
  ops::AttentionMask mask;
};

std::vector<AttentionCase> attention_cases() {
  return {{2, 40, 40, 3, 16, {}},
          {1, 70, 70, 2, 64, {}},
          {1, 300, 300, 2, 64, {}},           // five 64-row tiles each way: GPT-2's head width
          {2, 33, 33, 2, 80, {}},             // head dim not a power of two
          {1, 37, 37, 2, 128, {}},            // the widest head: 4 lanes per row in the backward
          {1, 20, 45, 2, 32, {true, 30, 0}},  // a later block of queries (ring attention)
          {1, 25, 30, 2, 16, {true, 0, 10}},  // keys after queries: early rows see nothing
          {2, 17, 29, 1, 8, {false, 0, 0}}};  // no mask
}

TEST(CudaNnOps, NaiveAttentionMatchesTheCpu) {
  DTP_REQUIRE_GPU();
  for (const AttentionCase& c : attention_cases()) {
    SCOPED_TRACE("Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) + " D " +
                 std::to_string(c.D));
    const Shape qs{c.B, c.Tq, c.H, c.D}, ks{c.B, c.Tk, c.H, c.D};
    Pair q = rand_pair(qs, 20), k = rand_pair(ks, 21), v = rand_pair(ks, 22),
         dout = rand_pair(qs, 23);
    Pair out = zeros_pair(qs), probs = zeros_pair({c.B, c.H, c.Tq, c.Tk});
    ops::attention_forward(q.cpu, k.cpu, v.cpu, out.cpu, probs.cpu, c.mask);
    ops::attention_forward(q.gpu, k.gpu, v.gpu, out.gpu, probs.gpu, c.mask);
    expect_close(probs.gpu, probs.cpu, kTf32, 1e-3, "probs (TF32 scores)");
    expect_close_tf32(out.gpu, out.cpu, "out");
    Pair dq = zeros_pair(qs), dk = zeros_pair(ks), dv = zeros_pair(ks);
    ops::attention_backward(q.cpu, k.cpu, v.cpu, probs.cpu, dout.cpu, dq.cpu, dk.cpu, dv.cpu,
                            c.mask);
    ops::attention_backward(q.gpu, k.gpu, v.gpu, probs.gpu, dout.gpu, dq.gpu, dk.gpu, dv.gpu,
                            c.mask);
    expect_close_tf32(dq.gpu, dq.cpu, "dq");
    expect_close_tf32(dk.gpu, dk.cpu, "dk");
    expect_close_tf32(dv.gpu, dv.cpu, "dv");
  }
}

// Flash attention's row maxima: -inf on both sides for a row that sees no
// key, within @p tol (relative, plus 1) elsewhere.
void expect_row_max_close(const Tensor& gpu, const Tensor& cpu, double tol, const char* scores) {
  const auto mg = gpu.to_vector(), mc = cpu.to_vector();
  for (std::size_t i = 0; i < mg.size(); ++i) {
    if (std::isinf(mc[i]))
      EXPECT_TRUE(std::isinf(mg[i]) && mg[i] < 0)
          << "row_max of row " << i << ": " << mg[i] << " on the GPU, -inf on the CPU (the row "
          << "sees no key)";
    else
      EXPECT_NEAR(mg[i], mc[i], tol * (1 + std::abs(mc[i])))
          << "row_max of row " << i << " (" << scores << ")";
  }
}

TEST(CudaNnOps, FlashAttentionMatchesTheCpu) {
  DTP_REQUIRE_GPU();
  for (const AttentionCase& c : attention_cases()) {
    SCOPED_TRACE("Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) + " D " +
                 std::to_string(c.D));
    const Shape qs{c.B, c.Tq, c.H, c.D}, ks{c.B, c.Tk, c.H, c.D}, stat{c.B, c.H, c.Tq};
    Pair q = rand_pair(qs, 30), k = rand_pair(ks, 31), v = rand_pair(ks, 32),
         dout = rand_pair(qs, 33);
    Pair out = zeros_pair(qs), m = zeros_pair(stat), l = zeros_pair(stat);
    ops::flash_attention_forward(q.cpu, k.cpu, v.cpu, out.cpu, m.cpu, l.cpu, c.mask);
    ops::flash_attention_forward(q.gpu, k.gpu, v.gpu, out.gpu, m.gpu, l.gpu, c.mask);
    expect_close_tf32(out.gpu, out.cpu, "out");
    expect_close_tf32(l.gpu, l.cpu, "row_sum");
    expect_row_max_close(m.gpu, m.cpu, kTf32, "TF32 scores");
    Pair dq = zeros_pair(qs), dk = zeros_pair(ks), dv = zeros_pair(ks);
    ops::flash_attention_backward(q.cpu, k.cpu, v.cpu, out.cpu, m.cpu, l.cpu, dout.cpu, dq.cpu,
                                  dk.cpu, dv.cpu, c.mask);
    ops::flash_attention_backward(q.gpu, k.gpu, v.gpu, out.gpu, m.gpu, l.gpu, dout.gpu, dq.gpu,
                                  dk.gpu, dv.gpu, c.mask);
    expect_close_tf32(dq.gpu, dq.cpu, "dq");
    expect_close_tf32(dk.gpu, dk.cpu, "dk");
    expect_close_tf32(dv.gpu, dv.cpu, "dv");

    // Merge with a second partial result over other keys (the merge itself is f32 on CUDA cores).
    Pair out2 = rand_pair(qs, 34), m2 = rand_pair(stat, 35), l2 = rand_pair(stat, 36, 0, 3);
    ops::attention_merge(out.cpu, m.cpu, l.cpu, out2.cpu, m2.cpu, l2.cpu);
    ops::attention_merge(out.gpu, m.gpu, l.gpu, out2.gpu, m2.gpu, l2.gpu);
    expect_close_tf32(out.gpu, out.cpu, "merged out");
    expect_close_tf32(l.gpu, l.cpu, "merged row_sum");
  }
}

// Turns TF32 off for its lifetime, as DTP_TF32=0 does for a process, and
// restores the setting after.
class Tf32Off {
 public:
  Tf32Off() : was_on_(cuda::tf32_enabled()) { cuda::set_tf32_enabled(false); }
  ~Tf32Off() { cuda::set_tf32_enabled(was_on_); }
  Tf32Off(const Tf32Off&) = delete;
  Tf32Off& operator=(const Tf32Off&) = delete;

 private:
  bool was_on_;
};

// Element-wise within tol (|cpu| + scale); scale is max |cpu| or @p floor if larger.
void expect_close_f32(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what,
                      double floor = 0) {
  expect_close(gpu, cpu, tol, tol * std::max(floor, max_abs(cpu.to_vector())),
               what + " (exact f32: a larger error is TF32's rounding or a wrong element)");
}

// A second run's tensor against the first's, bit for bit.
void expect_same_bits(const Tensor& second, const Tensor& first, const std::string& what) {
  const std::vector<double> x = first.to_vector(), y = second.to_vector();
  for (std::size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(double)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << x[i] << " in the first run and "
                    << y[i] << " in the second: the kernels' sums depend on scheduling";
      return;
    }
}

// With TF32 off, f32 flash attention runs the exact f32 kernels: the CPU's
// results within f32 rounding, and the same bits when run again.
TEST(CudaNnOps, FlashAttentionWithTf32OffMatchesTheCpuInExactF32) {
  DTP_REQUIRE_GPU();
  const Tf32Off exact_f32;
  for (const AttentionCase& c : attention_cases()) {
    SCOPED_TRACE("Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) + " D " +
                 std::to_string(c.D) + ", TF32 off");
    const double tol = 2 * std::ldexp(1.0, -24) * static_cast<double>(c.Tq + c.Tk + c.D + 2);
    const Shape qs{c.B, c.Tq, c.H, c.D}, ks{c.B, c.Tk, c.H, c.D}, stat{c.B, c.H, c.Tq};
    Pair q = rand_pair(qs, 30), k = rand_pair(ks, 31), v = rand_pair(ks, 32),
         dout = rand_pair(qs, 33);
    Pair out = zeros_pair(qs), m = zeros_pair(stat), l = zeros_pair(stat);
    ops::flash_attention_forward(q.cpu, k.cpu, v.cpu, out.cpu, m.cpu, l.cpu, c.mask);
    ops::flash_attention_forward(q.gpu, k.gpu, v.gpu, out.gpu, m.gpu, l.gpu, c.mask);
    expect_close_f32(out.gpu, out.cpu, tol, "out");
    expect_close_f32(l.gpu, l.cpu, tol, "row_sum");
    expect_row_max_close(m.gpu, m.cpu, tol, "exact f32 scores");
    Pair dq = zeros_pair(qs), dk = zeros_pair(ks), dv = zeros_pair(ks);
    ops::flash_attention_backward(q.cpu, k.cpu, v.cpu, out.cpu, m.cpu, l.cpu, dout.cpu, dq.cpu,
                                  dk.cpu, dv.cpu, c.mask);
    ops::flash_attention_backward(q.gpu, k.gpu, v.gpu, out.gpu, m.gpu, l.gpu, dout.gpu, dq.gpu,
                                  dk.gpu, dv.gpu, c.mask);
    const double gradients = std::max(
        {max_abs(dq.cpu.to_vector()), max_abs(dk.cpu.to_vector()), max_abs(dv.cpu.to_vector())});
    expect_close_f32(dq.gpu, dq.cpu, tol, "dq", gradients);
    expect_close_f32(dk.gpu, dk.cpu, tol, "dk", gradients);
    expect_close_f32(dv.gpu, dv.cpu, tol, "dv", gradients);

    // A second run on the same inputs: the same bits.
    const auto gpu_zeros = [](const Shape& shape) {
      return Tensor::zeros(shape, DType::f32, kGpu);
    };
    Tensor out2 = gpu_zeros(qs), m2 = gpu_zeros(stat), l2 = gpu_zeros(stat), dq2 = gpu_zeros(qs),
           dk2 = gpu_zeros(ks), dv2 = gpu_zeros(ks);
    ops::flash_attention_forward(q.gpu, k.gpu, v.gpu, out2, m2, l2, c.mask);
    ops::flash_attention_backward(q.gpu, k.gpu, v.gpu, out.gpu, m.gpu, l.gpu, dout.gpu, dq2, dk2,
                                  dv2, c.mask);
    expect_same_bits(out2, out.gpu, "out");
    expect_same_bits(m2, m.gpu, "row_max");
    expect_same_bits(l2, l.gpu, "row_sum");
    expect_same_bits(dq2, dq.gpu, "dq");
    expect_same_bits(dk2, dk.gpu, "dk");
    expect_same_bits(dv2, dv.gpu, "dv");
  }
}

TEST(CudaNnOps, EmbeddingMatchesTheCpu) {
  DTP_REQUIRE_GPU();
  const std::int64_t V = 50, C = 24, B = 3, T = 40;
  Pair ids = rand_pair({B, T}, 40, 0, V, DType::i32);  // many repeated ids: atomics must add up
  Pair table = rand_pair({V, C}, 41), out = zeros_pair({B, T, C});
  ops::embedding_forward(ids.cpu, table.cpu, out.cpu);
  ops::embedding_forward(ids.gpu, table.gpu, out.gpu);
  EXPECT_EQ(out.gpu.to_vector(), out.cpu.to_vector());
  Pair dout = rand_pair({B, T, C}, 42), dtable = rand_pair({V, C}, 43);
  ops::embedding_backward(ids.cpu, dout.cpu, dtable.cpu);
  ops::embedding_backward(ids.gpu, dout.gpu, dtable.gpu);
  expect_close(dtable.gpu, dtable.cpu, kTight, kTight, "embedding_backward");
  Pair pos = rand_pair({64, C}, 44), dpos = rand_pair({64, C}, 45);
  ops::add_positions(out.cpu, pos.cpu, 5);
  ops::add_positions(out.gpu, pos.gpu, 5);
  expect_close(out.gpu, out.cpu, kTight, kTight, "add_positions");
  ops::positions_backward(dout.cpu, dpos.cpu, 5);
  ops::positions_backward(dout.gpu, dpos.gpu, 5);
  expect_close(dpos.gpu, dpos.cpu, kTight, kTight, "positions_backward");
  Tensor bad = ids.gpu.clone();
  bad.set_item(17, V);
  EXPECT_THROW(ops::embedding_forward(bad, table.gpu, out.gpu), Error);
}

TEST(CudaNnOps, CrossEntropyMatchesTheCpu) {
  DTP_REQUIRE_GPU();
  for (std::int64_t V : {100, 50304}) {
    SCOPED_TRACE("V = " + std::to_string(V));
    const std::int64_t N = 24;
    Pair logits = rand_pair({2, N / 2, V}, 50, -4, 4),
         targets = rand_pair({2, N / 2}, 51, 0, V, DType::i32);
    Pair losses = zeros_pair({N});
    const double cpu = ops::cross_entropy_forward(logits.cpu, targets.cpu, losses.cpu);
    const double gpu = ops::cross_entropy_forward(logits.gpu, targets.gpu, losses.gpu);
    EXPECT_NEAR(gpu, cpu, 1e-5 * std::abs(cpu));
    expect_close(losses.gpu, losses.cpu, kTight, kTight, "per-row losses");
    Tensor none;
    EXPECT_NEAR(ops::cross_entropy_forward(logits.gpu, targets.gpu, none), cpu,
                1e-5 * std::abs(cpu));
    // In place, as the model does it.
    ops::cross_entropy_backward(logits.cpu, targets.cpu, 1.0 / N, logits.cpu);
    ops::cross_entropy_backward(logits.gpu, targets.gpu, 1.0 / N, logits.gpu);
    expect_close(logits.gpu, logits.cpu, kTight, 1e-7, "dlogits (in place)");
  }
}

TEST(CudaNnOps, OptimizersMatchTheCpu) {
  DTP_REQUIRE_GPU();
  const Shape shape{5000};
  Pair p = rand_pair(shape, 60), g = rand_pair(shape, 61), m = rand_pair(shape, 62, -0.1, 0.1),
       v = rand_pair(shape, 63, 0, 0.01);
  for (std::int64_t step = 1; step <= 3; ++step) {
    ops::adamw_update(p.cpu, g.cpu, m.cpu, v.cpu, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
    ops::adamw_update(p.gpu, g.gpu, m.gpu, v.gpu, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
  }
  expect_close(p.gpu, p.cpu, kTight, kTight, "adamw params");
  expect_close(m.gpu, m.cpu, kTight, kTight, "adamw m");
  expect_close(v.gpu, v.cpu, kTight, kTight, "adamw v");
  for (bool nesterov : {false, true}) {
    Pair buf = zeros_pair(shape);
    for (int i = 0; i < 3; ++i) {
      ops::sgd_update(p.cpu, g.cpu, buf.cpu, 0.1, 0.9, 0.01, nesterov);
      ops::sgd_update(p.gpu, g.gpu, buf.gpu, 0.1, 0.9, 0.01, nesterov);
    }
    expect_close(p.gpu, p.cpu, kTight, kTight, nesterov ? "sgd nesterov" : "sgd momentum");
  }
  Tensor none;
  ops::sgd_update(p.cpu, g.cpu, none, 0.1, 0.0);
  ops::sgd_update(p.gpu, g.gpu, none, 0.1, 0.0);
  expect_close(p.gpu, p.cpu, kTight, kTight, "plain sgd");
}

// One whole training step (forward, backward, AdamW) of a small GPT on both
// devices from the same seed.
void check_training_step(AttentionKind kind) {
  const GPTConfig config = small_gpt(kind);
  GPTConfig gpu_config = config;
  gpu_config.device = kGpu;
  GPT cpu_model(config), gpu_model(gpu_config);
  const std::int64_t B = 3, T = 40;
  Pair tokens = rand_pair({B, T}, 70, 0, config.vocab_size, DType::i32);
  Pair targets = rand_pair({B, T}, 71, 0, config.vocab_size, DType::i32);
  const double cpu_loss = cpu_model.forward(tokens.cpu, targets.cpu);
  const double gpu_loss = gpu_model.forward(tokens.gpu, targets.gpu);
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-3 * cpu_loss);
  cpu_model.backward();
  gpu_model.backward();
  const auto cpu_units = cpu_model.units();
  const auto gpu_units = gpu_model.units();
  ASSERT_EQ(cpu_units.size(), gpu_units.size());
  // Each gradient within 2% of its own largest element, but never tighter
  // than 2% of 1e-4 of the unit's largest gradient: attn.k.bias's gradient
  // is zero in exact arithmetic (softmax ignores a constant added to every
  // key's score of a query), so both devices hold rounding noise there, and
  // TF32's noise (about 1e-8 on the H200, against 1e-11 on the CPU) is no
  // error. A wrong k.bias gradient would be of the size of q.bias's (1e-4).
  for (std::size_t u = 0; u < cpu_units.size(); ++u) {
    double unit_scale = 0;
    for (const ParamView& c : cpu_units[u]->parameters())
      unit_scale = std::max(unit_scale, max_abs(c.grad.to_vector()));
    for (std::size_t i = 0; i < cpu_units[u]->parameters().size(); ++i) {
      const ParamView& c = cpu_units[u]->parameters()[i];
      const ParamView& g = gpu_units[u]->parameters()[i];
      const double scale = std::max({1e-12, max_abs(c.grad.to_vector()), 1e-4 * unit_scale});
      expect_close(g.grad, c.grad, 0, 2e-2 * scale, cpu_units[u]->name() + "." + c.name + " grad");
    }
  }
  const double lr = 1e-3;
  AdamW cpu_opt(param_buffers(cpu_model)), gpu_opt(param_buffers(gpu_model));
  cpu_opt.step(lr);
  gpu_opt.step(lr);
  for (std::size_t u = 0; u < cpu_units.size(); ++u) {
    const auto pc = cpu_units[u]->params().to_vector(), pg = gpu_units[u]->params().to_vector();
    std::size_t loose = 0;
    double worst = 0;
    for (std::size_t i = 0; i < pc.size(); ++i) {
      const double err = std::abs(pc[i] - pg[i]);
      worst = std::max(worst, err);
      if (err > 1e-5) ++loose;
    }
    EXPECT_LE(worst, 2 * lr + 1e-6) << cpu_units[u]->name();
    EXPECT_LE(loose, pc.size() / 100) << cpu_units[u]->name() << ": " << loose << " of "
                                      << pc.size() << " parameters differ by more than 1e-5";
  }
}

TEST(CudaNnTraining, OneGptStepMatchesTheCpuNaiveAttention) {
  DTP_REQUIRE_GPU();
  check_training_step(AttentionKind::naive);
}

TEST(CudaNnTraining, OneGptStepMatchesTheCpuFlashAttention) {
  DTP_REQUIRE_GPU();
  check_training_step(AttentionKind::flash);
}

// No kernel adds with atomics (the embedding's rows are sorted by id, the
// parameter gradients and the loss are summed in a fixed order), so two
// models from one seed give the same loss, gradients and norm, bit for bit:
// what a checker that compares a puzzle's step with its own relies on.
TEST(CudaNnTraining, TwoGptStepsOnTheGpuAgreeBitForBit) {
  DTP_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::bf16})
    for (AttentionKind kind : {AttentionKind::naive, AttentionKind::flash}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", " + attention_kind_name(kind));
      GPTConfig config = small_gpt(kind, dtype);
      config.device = kGpu;
      // 120 tokens over 96 ids: many ids repeat, so the embedding's rows meet.
      Tensor tokens = rand_on(kGpu, {3, 40}, 70, 0, config.vocab_size, DType::i32);
      Tensor targets = rand_on(kGpu, {3, 40}, 71, 0, config.vocab_size, DType::i32);
      GPT first(config), second(config);
      EXPECT_EQ(first.forward(tokens, targets), second.forward(tokens, targets))
          << "the losses differ";
      first.backward();
      second.backward();
      const auto a = first.units(), b = second.units();
      for (std::size_t u = 0; u < a.size(); ++u) {
        EXPECT_EQ(a[u]->grads().to_vector(), b[u]->grads().to_vector())
            << a[u]->name() << ": two runs of one step give different gradients";
        EXPECT_EQ(ops::sum_squares(a[u]->grads()), ops::sum_squares(b[u]->grads())) << a[u]->name();
      }
    }
}

TEST(CudaNnOps, PermuteMatchesTheCpuBitForBit) {
  DTP_REQUIRE_GPU();
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    const Pair in = rand_pair({3, 5, 4, 6}, 11, -1, 1, dtype);
    for (std::array<int, 4> order :
         {std::array<int, 4>{2, 0, 1, 3}, {1, 0, 2, 3}, {3, 2, 1, 0}, {0, 1, 2, 3}}) {
      const Shape shape{in.cpu.size(order[0]), in.cpu.size(order[1]), in.cpu.size(order[2]),
                        in.cpu.size(order[3])};
      Pair out = zeros_pair(shape, dtype);
      ops::permute(in.cpu, order, out.cpu);
      ops::permute(in.gpu, order, out.gpu);
      EXPECT_EQ(out.gpu.to_vector(), out.cpu.to_vector())
          << dtype_name(dtype) << " order " << order[0] << order[1] << order[2] << order[3];
    }
  }
}

}  // namespace
}  // namespace dtp
