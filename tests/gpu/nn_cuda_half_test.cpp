// The CUDA nn ops on bf16 and f16 tensors against the CPU ops on the same
// tensors. Both devices keep one contract: read the 16-bit inputs as f32,
// compute in f32, round each stored output to nearest even (attention also
// rounds P and dS to the 16-bit type before the products that use them:
// naive attention stores P, and flash attention multiplies them on tensor
// cores in that type, on both devices). So their outputs
// differ only where the two devices' f32 results (sums in another order,
// expf against std::exp, cuBLAS's tensor cores) fall on opposite sides of a
// 16-bit rounding boundary: by one unit in the last place.
//
// Tolerances (max |gpu - cpu| <= atol + rtol * |cpu|, element-wise), with
// u = the 16-bit type's spacing relative to a value (bf16 2^-7, f16 2^-10):
// - add, casts, embedding lookup: bitwise equal (one f32 operation, or none,
//   then the same rounding);
// - every other op: rtol = 2u, atol = 2u * max|cpu| (two roundings of
//   inputs that were themselves rounded: the stats a backward reads);
// - a whole GPT step: loss within 2u relative, each gradient within 0.1 of
//   max(its own max |grad|, 1e-2 of its unit's): 16-bit activations through
//   two layers and back drift further than one op, and a wrong kernel is off
//   by far more.
// Optimizers refuse 16-bit parameters on both devices (chapter 07 steps f32
// master weights). Skips without a GPU; fails instead under DTP_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "dtp/nn.h"
#include "dtp/nn_ops.h"
#include "gpu/cpu_gpu_pairs.h"
#include "support/harness.h"
#include "support/scoped_env.h"

namespace dtp {
namespace {

using namespace testing;

class CudaHalfOps : public ::testing::TestWithParam<DType> {
 protected:
  DType dtype() const { return GetParam(); }
  /// The spacing of the 16-bit type relative to a value: one unit in the last place, at most.
  double ulp() const { return dtype() == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10); }
  Pair rand(const Shape& shape, std::uint64_t seed, double low = -1, double high = 1) const {
    return rand_pair(shape, seed, low, high, dtype());
  }
  Pair zeros(const Shape& shape) const { return zeros_pair(shape, dtype()); }
  /// Within two units in the last place of the 16-bit type.
  void expect_near_ulps(const Tensor& gpu, const Tensor& cpu, const std::string& what) const {
    ASSERT_EQ(gpu.dtype(), dtype()) << what << ": the GPU op changed the dtype";
    expect_close(gpu, cpu, 2 * ulp(), 2 * ulp() * std::max(1e-30, max_abs(cpu.to_vector())),
                 what + " (" + dtype_name(dtype()) + ")");
  }
  void expect_bitwise(const Tensor& gpu, const Tensor& cpu, const std::string& what) const {
    EXPECT_EQ(gpu.to_vector(), cpu.to_vector())
        << what << " (" << dtype_name(dtype())
        << "): one f32 operation and one rounding must give the same bits";
  }
};

TEST_P(CudaHalfOps, ElementwiseOpsMatchTheCpuAndOptimizersRefuseSixteenBits) {
  DTP_REQUIRE_GPU();
  const Shape shape{3, 1000};
  Pair a = rand(shape, 1), b = rand(shape, 2), out = zeros(shape);
  ops::add(a.cpu, b.cpu, out.cpu);
  ops::add(a.gpu, b.gpu, out.gpu);
  expect_bitwise(out.gpu, out.cpu, "add");
  ops::axpy(out.cpu, -0.37, a.cpu);
  ops::axpy(out.gpu, -0.37, a.gpu);
  expect_near_ulps(out.gpu, out.cpu, "axpy");
  EXPECT_NEAR(ops::sum_squares(a.gpu), ops::sum_squares(a.cpu), 1e-9 * ops::sum_squares(a.cpu));
  EXPECT_TRUE(ops::all_finite(a.gpu));
  Tensor bad = a.gpu.clone();
  bad.set_item(2999, INFINITY);
  EXPECT_FALSE(ops::all_finite(bad)) << "an inf in a " << dtype_name(dtype()) << " tensor";

  Pair bias = rand({1000}, 3), dbias = rand({1000}, 4);
  ops::add_bias(out.cpu, bias.cpu);
  ops::add_bias(out.gpu, bias.gpu);
  expect_bitwise(out.gpu, out.cpu, "add_bias");
  ops::bias_backward(a.cpu, dbias.cpu);
  ops::bias_backward(a.gpu, dbias.gpu);
  expect_near_ulps(dbias.gpu, dbias.cpu, "bias_backward (accumulates)");

  Pair x = rand(shape, 5, -6, 6), y = zeros(shape), dx = zeros(shape);
  ops::gelu_forward(x.cpu, y.cpu);
  ops::gelu_forward(x.gpu, y.gpu);
  expect_near_ulps(y.gpu, y.cpu, "gelu_forward");
  ops::gelu_backward(x.cpu, b.cpu, dx.cpu);
  ops::gelu_backward(x.gpu, b.gpu, dx.gpu);
  expect_near_ulps(dx.gpu, dx.cpu, "gelu_backward");

  // Optimizers update f32 or f64 parameters on every device (16-bit ones
  // would lose small updates: chapter 07 steps f32 masters instead).
  Pair p = rand({5000}, 60), g = rand({5000}, 61), m = rand({5000}, 62),
       v = rand({5000}, 63, 0, 0.01);
  Tensor none;
  for (bool gpu : {false, true}) {
    Tensor &params = gpu ? p.gpu : p.cpu, &grads = gpu ? g.gpu : g.cpu;
    const std::string adamw = error_of([&] {
      ops::adamw_update(params, grads, gpu ? m.gpu : m.cpu, gpu ? v.gpu : v.cpu, 1e-3, 0.9, 0.95,
                        1e-8, 0.1, 1);
    });
    EXPECT_NE(adamw.find("optimizers update f32 or f64 parameters"), std::string::npos)
        << params.describe() << ": " << adamw;
    const std::string sgd = error_of([&] { ops::sgd_update(params, grads, none, 0.1, 0.0); });
    EXPECT_NE(sgd.find("optimizers update f32 or f64 parameters"), std::string::npos)
        << params.describe() << ": " << sgd;
  }
}

TEST_P(CudaHalfOps, MatmulOnTensorCoresMatchesTheCpu) {
  DTP_REQUIRE_GPU();
  const std::int64_t M = 67, N = 45, K = 130;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string("transpose_a ") + (ta ? "1" : "0") + " transpose_b " +
                   (tb ? "1" : "0"));
      Pair a = rand(ta ? Shape{K, M} : Shape{M, K}, 7), b = rand(tb ? Shape{N, K} : Shape{K, N}, 8);
      Pair c = rand({M, N}, 9);
      ops::matmul(a.cpu, b.cpu, c.cpu, ta, tb, 0.5,
                  1.0);  // accumulates into c: read, add, round once
      ops::matmul(a.gpu, b.gpu, c.gpu, ta, tb, 0.5, 1.0);
      expect_near_ulps(c.gpu, c.cpu, "matmul beta=1");
    }
  Pair x = rand({2, 33, 48}, 10), w = rand({96, 48}, 11), y = zeros({2, 33, 96});
  ops::matmul(x.cpu, w.cpu, y.cpu, false, true);
  ops::matmul(x.gpu, w.gpu, y.gpu, false, true);
  expect_near_ulps(y.gpu, y.cpu, "linear");
}

TEST_P(CudaHalfOps, LayerNormSoftmaxAndCrossEntropyMatchTheCpu) {
  DTP_REQUIRE_GPU();
  const Shape shape{2, 37, 768};
  Pair x = rand(shape, 12, -3, 3), w = rand({768}, 13, 0.5, 1.5), b = rand({768}, 14);
  Pair y = zeros(shape), mean = zeros({2, 37}), rstd = zeros({2, 37});
  ops::layernorm_forward(x.cpu, w.cpu, b.cpu, y.cpu, mean.cpu, rstd.cpu);
  ops::layernorm_forward(x.gpu, w.gpu, b.gpu, y.gpu, mean.gpu, rstd.gpu);
  expect_near_ulps(y.gpu, y.cpu, "layernorm y");
  expect_near_ulps(mean.gpu, mean.cpu, "layernorm mean");
  expect_near_ulps(rstd.gpu, rstd.cpu, "layernorm rstd");
  // The backward reads the CPU's statistics on both devices: one rounding apart at most.
  Pair dy = rand(shape, 15), dx = zeros(shape), dw = rand({768}, 16), db = rand({768}, 17);
  mean.gpu.copy_from(mean.cpu);
  rstd.gpu.copy_from(rstd.cpu);
  ops::layernorm_backward(dy.cpu, x.cpu, w.cpu, mean.cpu, rstd.cpu, dx.cpu, dw.cpu, db.cpu);
  ops::layernorm_backward(dy.gpu, x.gpu, w.gpu, mean.gpu, rstd.gpu, dx.gpu, dw.gpu, db.gpu);
  expect_near_ulps(dx.gpu, dx.cpu, "layernorm dx");
  expect_near_ulps(dw.gpu, dw.cpu, "layernorm dweight (74 rows summed in f32, rounded once)");
  expect_near_ulps(db.gpu, db.cpu, "layernorm dbias (74 rows summed in f32, rounded once)");

  Pair s = zeros(shape), ds = zeros(shape);
  ops::softmax_forward(x.cpu, s.cpu);
  ops::softmax_forward(x.gpu, s.gpu);
  expect_near_ulps(s.gpu, s.cpu, "softmax");
  s.gpu.copy_from(s.cpu);
  ops::softmax_backward(s.cpu, dy.cpu, ds.cpu);
  ops::softmax_backward(s.gpu, dy.gpu, ds.gpu);
  expect_near_ulps(ds.gpu, ds.cpu, "softmax backward");

  const std::int64_t V = 50304, rows = 24;
  Pair logits = rand({2, rows / 2, V}, 50, -4, 4),
       targets = rand_pair({2, rows / 2}, 51, 0, V, DType::i32);
  Pair losses = zeros({rows});
  const double cpu = ops::cross_entropy_forward(logits.cpu, targets.cpu, losses.cpu);
  const double gpu = ops::cross_entropy_forward(logits.gpu, targets.gpu, losses.gpu);
  EXPECT_NEAR(gpu, cpu, 1e-5 * std::abs(cpu))
      << "the mean loss is summed from f32 row losses on both";
  expect_near_ulps(losses.gpu, losses.cpu, "per-row losses");
  ops::cross_entropy_backward(logits.cpu, targets.cpu, 1.0 / rows, logits.cpu);
  ops::cross_entropy_backward(logits.gpu, targets.gpu, 1.0 / rows, logits.gpu);
  expect_near_ulps(logits.gpu, logits.cpu, "dlogits (in place)");
}

TEST_P(CudaHalfOps, AttentionBothKernelsMatchTheCpu) {
  DTP_REQUIRE_GPU();
  const std::int64_t B = 2, T = 70, H = 3, D = 32;  // two 64-row tiles each way
  const Shape qs{B, T, H, D}, stat{B, H, T};
  Pair q = rand(qs, 20), k = rand(qs, 21), v = rand(qs, 22), dout = rand(qs, 23);
  {
    Pair out = zeros(qs), probs = zeros({B, H, T, T});
    ops::attention_forward(q.cpu, k.cpu, v.cpu, out.cpu, probs.cpu);
    ops::attention_forward(q.gpu, k.gpu, v.gpu, out.gpu, probs.gpu);
    expect_near_ulps(probs.gpu, probs.cpu, "naive probs");
    expect_near_ulps(out.gpu, out.cpu, "naive out");
    probs.gpu.copy_from(probs.cpu);
    Pair dq = zeros(qs), dk = zeros(qs), dv = zeros(qs);
    ops::attention_backward(q.cpu, k.cpu, v.cpu, probs.cpu, dout.cpu, dq.cpu, dk.cpu, dv.cpu);
    ops::attention_backward(q.gpu, k.gpu, v.gpu, probs.gpu, dout.gpu, dq.gpu, dk.gpu, dv.gpu);
    expect_near_ulps(dq.gpu, dq.cpu, "naive dq");
    expect_near_ulps(dk.gpu, dk.cpu, "naive dk");
    expect_near_ulps(dv.gpu, dv.cpu, "naive dv");
  }
  // Both 16-bit flash kernels: mma.sync (the default) and WMMA.
  for (const char* kernels : {"mma", "wmma"}) {
    const ScopedEnv choice("DTP_FLASH_KERNEL", kernels);
    const std::string flash = std::string("flash (") + kernels + ") ";
    Pair out = zeros(qs), m = zeros(stat), l = zeros(stat);
    ops::flash_attention_forward(q.cpu, k.cpu, v.cpu, out.cpu, m.cpu, l.cpu);
    ops::flash_attention_forward(q.gpu, k.gpu, v.gpu, out.gpu, m.gpu, l.gpu);
    expect_near_ulps(out.gpu, out.cpu, flash + "out");
    expect_near_ulps(m.gpu, m.cpu, flash + "row_max");
    expect_near_ulps(l.gpu, l.cpu, flash + "row_sum");
    for (Pair* saved : {&out, &m, &l}) saved->gpu.copy_from(saved->cpu);
    Pair dq = zeros(qs), dk = zeros(qs), dv = zeros(qs);
    ops::flash_attention_backward(q.cpu, k.cpu, v.cpu, out.cpu, m.cpu, l.cpu, dout.cpu, dq.cpu,
                                  dk.cpu, dv.cpu);
    ops::flash_attention_backward(q.gpu, k.gpu, v.gpu, out.gpu, m.gpu, l.gpu, dout.gpu, dq.gpu,
                                  dk.gpu, dv.gpu);
    expect_near_ulps(dq.gpu, dq.cpu, flash + "dq");
    expect_near_ulps(dk.gpu, dk.cpu, flash + "dk");
    expect_near_ulps(dv.gpu, dv.cpu, flash + "dv");
  }
  Pair out = zeros(qs), m = zeros(stat), l = zeros(stat);
  ops::flash_attention_forward(q.cpu, k.cpu, v.cpu, out.cpu, m.cpu, l.cpu);
  for (Pair* saved : {&out, &m, &l}) saved->gpu.copy_from(saved->cpu);
  Pair out2 = rand(qs, 34), m2 = rand(stat, 35), l2 = rand(stat, 36, 0, 3);
  ops::attention_merge(out.cpu, m.cpu, l.cpu, out2.cpu, m2.cpu, l2.cpu);
  ops::attention_merge(out.gpu, m.gpu, l.gpu, out2.gpu, m2.gpu, l2.gpu);
  expect_near_ulps(out.gpu, out.cpu, "merged out");
  expect_near_ulps(l.gpu, l.cpu, "merged row_sum");
  const ScopedEnv bad("DTP_FLASH_KERNEL", "tensor");
  const std::string message =
      error_of([&] { ops::flash_attention_forward(q.gpu, k.gpu, v.gpu, out.gpu, m.gpu, l.gpu); });
  EXPECT_NE(message.find("DTP_FLASH_KERNEL must be mma or wmma"), std::string::npos) << message;
  EXPECT_NE(message.find("got 'tensor'"), std::string::npos) << message;
}

TEST_P(CudaHalfOps, EmbeddingMatchesTheCpu) {
  DTP_REQUIRE_GPU();
  const std::int64_t V = 50, C = 24, B = 3, T = 40;
  Pair ids =
      rand_pair({B, T}, 40, 0, V, DType::i32);  // many repeated ids: their rows add up in f32
  Pair table = rand({V, C}, 41), out = zeros({B, T, C});
  ops::embedding_forward(ids.cpu, table.cpu, out.cpu);
  ops::embedding_forward(ids.gpu, table.gpu, out.gpu);
  expect_bitwise(out.gpu, out.cpu, "embedding_forward (a copy)");
  Pair dout = rand({B, T, C}, 42), dtable = rand({V, C}, 43);
  ops::embedding_backward(ids.cpu, dout.cpu, dtable.cpu);
  ops::embedding_backward(ids.gpu, dout.gpu, dtable.gpu);
  expect_near_ulps(dtable.gpu, dtable.cpu, "embedding_backward (summed in f32, rounded once)");
  Pair pos = rand({64, C}, 44), dpos = rand({64, C}, 45);
  ops::add_positions(out.cpu, pos.cpu, 5);
  ops::add_positions(out.gpu, pos.gpu, 5);
  expect_bitwise(out.gpu, out.cpu, "add_positions");
  ops::positions_backward(dout.cpu, dpos.cpu, 5);
  ops::positions_backward(dout.gpu, dpos.gpu, 5);
  expect_near_ulps(dpos.gpu, dpos.cpu, "positions_backward");
}

// Forward and backward of a small 16-bit GPT on both devices from one seed.
TEST_P(CudaHalfOps, GptForwardAndBackwardMatchTheCpu) {
  DTP_REQUIRE_GPU();
  for (AttentionKind kind : {AttentionKind::naive, AttentionKind::flash}) {
    SCOPED_TRACE(attention_kind_name(kind));
    const GPTConfig config = small_gpt(kind, dtype());
    GPTConfig gpu_config = config;
    gpu_config.device = kGpu;
    GPT cpu_model(config), gpu_model(gpu_config);
    Pair tokens = rand_pair({3, 40}, 70, 0, config.vocab_size, DType::i32);
    Pair targets = rand_pair({3, 40}, 71, 0, config.vocab_size, DType::i32);
    const double cpu_loss = cpu_model.forward(tokens.cpu, targets.cpu);
    const double gpu_loss = gpu_model.forward(tokens.gpu, targets.gpu);
    EXPECT_NEAR(gpu_loss, cpu_loss, 2 * ulp() * cpu_loss);
    cpu_model.backward();
    gpu_model.backward();
    const auto cpu_units = cpu_model.units(), gpu_units = gpu_model.units();
    ASSERT_EQ(cpu_units.size(), gpu_units.size());
    for (std::size_t u = 0; u < cpu_units.size(); ++u) {
      double unit_scale = 0;
      for (const ParamView& c : cpu_units[u]->parameters())
        unit_scale = std::max(unit_scale, max_abs(c.grad.to_vector()));
      for (std::size_t i = 0; i < cpu_units[u]->parameters().size(); ++i) {
        const ParamView& c = cpu_units[u]->parameters()[i];
        const ParamView& g = gpu_units[u]->parameters()[i];
        ASSERT_EQ(g.grad.dtype(), dtype());
        const double scale = std::max({1e-12, max_abs(c.grad.to_vector()), 1e-2 * unit_scale});
        expect_close(g.grad, c.grad, 0, 0.1 * scale, cpu_units[u]->name() + "." + c.name + " grad");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SixteenBit, CudaHalfOps, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace dtp
