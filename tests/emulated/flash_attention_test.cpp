// The tensor-core flash attention kernels (runtime/src/cuda/flash_attention_tc.cuh),
// run on the CPU under the CUDA emulator, against the CPU's flash attention.
// This checks their tiling, masking, online softmax and synchronization on
// every machine; tests/gpu/nn_cuda_test.cpp checks the same kernels on a GPU.
//
// Tolerance: |kernel - cpu| <= 2e-3 (|cpu| + max |cpu|), element-wise. The
// kernels round their inputs and the probabilities to TF32 (2^-11 relative),
// which stays below 1e-3 on these shapes; losing one key of 64, or one
// column of a row, moves an output by about 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "emulated/cuda_emulator.h"  // first: it defines the CUDA keywords for the kernels

#include "cuda/flash_attention_tc.cuh"
#include "dtp/nn_ops.h"
#include "dtp/tensor.h"

namespace dtp {
namespace {

namespace flash = cuda::flash;

constexpr double kTolerance = 2e-3;

struct Case {
  std::int64_t B, Tq, Tk, H, D;
  ops::AttentionMask mask;
};

std::string describe(const Case& c) {
  return "B " + std::to_string(c.B) + " Tq " + std::to_string(c.Tq) + " Tk " + std::to_string(c.Tk) + " H " +
         std::to_string(c.H) + " D " + std::to_string(c.D) + (c.mask.causal ? " causal" : " no mask") +
         " q_start " + std::to_string(c.mask.q_start) + " k_start " + std::to_string(c.mask.k_start);
}

void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }

// Element-wise comparison that names the worst element by (b, t, h, d) or (b, h, t).
void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  double scale = 0;
  for (double x : w) scale = std::max(scale, std::abs(x));
  std::int64_t worst = -1;
  double worst_excess = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double allowed = kTolerance * (std::abs(w[i]) + scale), err = std::abs(g[i] - w[i]);
    if (!(err <= allowed) && (worst < 0 || err - allowed > worst_excess)) {
      worst = static_cast<std::int64_t>(i);
      worst_excess = err - allowed;
    }
  }
  if (worst < 0) return;
  std::string where;
  std::int64_t rest = worst;
  for (std::int64_t dim = got.ndim() - 1; dim >= 0; --dim) {
    where = std::to_string(rest % got.size(dim)) + (where.empty() ? "" : ", ") + where;
    rest /= got.size(dim);
  }
  ADD_FAILURE() << what << ": element [" << where << "] is " << g[worst] << " from the kernel and " << w[worst]
                << " from the CPU (allowed " << kTolerance << " x (|cpu| + max |cpu| " << scale << "))";
}

// Calls fn(std::integral_constant<int, MAXD>{}) with the kernels' head-dim bucket for D.
template <typename Fn>
void with_head_dim(std::int64_t D, Fn&& fn) {
  if (D <= 16) fn(std::integral_constant<int, 16>{});
  else if (D <= 32) fn(std::integral_constant<int, 32>{});
  else if (D <= 64) fn(std::integral_constant<int, 64>{});
  else fn(std::integral_constant<int, 128>{});
}

unsigned tiles(std::int64_t rows) { return static_cast<unsigned>((rows + flash::kRows - 1) / flash::kRows); }

std::vector<Case> cases() {
  return {{2, 40, 40, 3, 16, {}},
          {1, 70, 70, 2, 64, {}},                 // two tiles of queries and of keys
          {1, 150, 150, 1, 64, {}},               // three tiles: the running max is rescaled across tiles
          {2, 33, 33, 2, 80, {}},                 // head dim not a power of two
          {1, 37, 37, 1, 128, {}},                // the widest head
          {1, 20, 45, 2, 32, {true, 30, 0}},      // a later block of queries (ring attention)
          {1, 25, 30, 2, 16, {true, 0, 10}},      // keys after queries: early rows see nothing
          {1, 90, 130, 1, 24, {true, 100, 60}},   // offsets and several tiles on both sides
          {2, 17, 29, 1, 8, {false, 0, 0}},       // no mask
          {1, 70, 100, 1, 32, {false, 0, 0}}};    // no mask, several key tiles
}

class EmulatedFlashAttention : public ::testing::TestWithParam<Case> {};

TEST_P(EmulatedFlashAttention, ForwardAndBackwardMatchTheCpu) {
  const Case& c = GetParam();
  const Shape qs{c.B, c.Tq, c.H, c.D}, ks{c.B, c.Tk, c.H, c.D}, stat{c.B, c.H, c.Tq};
  const Tensor q = Tensor::random_uniform(qs, 30), k = Tensor::random_uniform(ks, 31),
               v = Tensor::random_uniform(ks, 32), dout = Tensor::random_uniform(qs, 33);
  Tensor out = Tensor::zeros(qs), m = Tensor::zeros(stat), l = Tensor::zeros(stat);
  ops::flash_attention_forward(q, k, v, out, m, l, c.mask);
  Tensor dq = Tensor::zeros(qs), dk = Tensor::zeros(ks), dv = Tensor::zeros(ks);
  ops::flash_attention_backward(q, k, v, out, m, l, dout, dq, dk, dv, c.mask);

  const flash::Dims d{c.B, c.Tq, c.Tk, c.H, c.D, static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)))};
  const flash::Mask mask{c.mask.causal, c.mask.q_start, c.mask.k_start};
  Tensor e_out = Tensor::full(qs, -7.0), e_m = Tensor::full(stat, -7.0), e_l = Tensor::full(stat, -7.0);
  Tensor e_dq = Tensor::full(qs, -7.0), e_dk = Tensor::full(ks, -7.0), e_dv = Tensor::full(ks, -7.0);
  // delta = rowsum(dO * O), from the CPU's output (the GPU computes it in row_dot_kernel).
  Tensor delta = Tensor::zeros(stat);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t i = 0; i < c.Tq; ++i)
      for (std::int64_t h = 0; h < c.H; ++h) {
        double s = 0;
        for (std::int64_t x = 0; x < c.D; ++x)
          s += static_cast<double>(dout.data<float>()[((b * c.Tq + i) * c.H + h) * c.D + x]) *
               out.data<float>()[((b * c.Tq + i) * c.H + h) * c.D + x];
        delta.data<float>()[(b * c.H + h) * c.Tq + i] = static_cast<float>(s);
      }

  with_head_dim(c.D, [&](auto maxd) {
    constexpr int MAXD = decltype(maxd)::value;
    emu::launch(dim3(tiles(c.Tq), c.H, c.B), dim3(flash::kThreads), flash::forward_shared_bytes<MAXD>(), [&] {
      flash::forward_kernel<MAXD>(q.data<float>(), k.data<float>(), v.data<float>(), e_out.data<float>(),
                                  e_m.data<float>(), e_l.data<float>(), d, mask);
    });
    // The backward from the CPU's forward, so each half is checked on its own.
    emu::launch(dim3(tiles(c.Tq), c.H, c.B), dim3(flash::kThreads), flash::dq_shared_bytes<MAXD>(), [&] {
      flash::dq_kernel<MAXD>(q.data<float>(), k.data<float>(), v.data<float>(), dout.data<float>(),
                             m.data<float>(), l.data<float>(), delta.data<float>(), e_dq.data<float>(), d, mask);
    });
    flash::for_each_key_grads_launch<MAXD>([&](auto which) {
      constexpr flash::KeyGrads G = decltype(which)::value;
      emu::launch(dim3(tiles(c.Tk), c.H, c.B), dim3(flash::kThreads), flash::dkv_shared_bytes<MAXD>(), [&] {
        flash::dkv_kernel<MAXD, G>(q.data<float>(), k.data<float>(), v.data<float>(), dout.data<float>(),
                                   m.data<float>(), l.data<float>(), delta.data<float>(), e_dk.data<float>(),
                                   e_dv.data<float>(), d, mask);
      });
    });
  });

  expect_close(e_out, out, "out");
  expect_close(e_l, l, "row_sum");
  // row_max is -inf for a row that sees no key: it must be -inf there, and close elsewhere.
  for (std::int64_t r = 0; r < m.numel(); ++r) {
    const float want = m.data<float>()[r], got = e_m.data<float>()[r];
    if (std::isinf(want)) EXPECT_TRUE(std::isinf(got) && got < 0) << "row_max of row " << r << ": got " << got;
    else EXPECT_NEAR(got, want, kTolerance * (1 + std::abs(want))) << "row_max of row " << r;
  }
  expect_close(e_dq, dq, "dq");
  expect_close(e_dk, dk, "dk");
  expect_close(e_dv, dv, "dv");
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmulatedFlashAttention, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "case" + std::to_string(info.index) + "_D" + std::to_string(info.param.D) +
                                  (info.param.mask.causal ? "_causal" : "_nomask");
                         });

// The emulator itself: a kernel that reads another lane's shared-memory
// store without __syncwarp() must be caught often enough to matter, and a
// misaligned fragment load must fail the launch with a message.
TEST(CudaEmulator, AMisalignedFragmentLoadFailsTheLaunch) {
  EXPECT_THROW(emu::launch(dim3(1), dim3(32), 4096,
                           [] {
                             DTP_DYNAMIC_SHARED(float, smem);
                             flash::FragA a;
                             nvcuda::wmma::load_matrix_sync(a, smem + 1, 16);  // 4 bytes past a 32-byte boundary
                           }),
               std::runtime_error);
}

TEST(CudaEmulator, ALoadPastTheSharedMemoryFailsTheLaunch) {
  EXPECT_THROW(emu::launch(dim3(1), dim3(32), 256,
                           [] {
                             DTP_DYNAMIC_SHARED(float, smem);
                             flash::FragA a;
                             nvcuda::wmma::load_matrix_sync(a, smem, 16);  // 16 rows of 16 floats: 1 KiB
                           }),
               std::runtime_error);
}

TEST(CudaEmulator, ShufflesAndBarriersBehaveLikeAWarp) {
  std::vector<float> got(64, -1.f);
  emu::launch(dim3(2), dim3(32), 128, [&] {
    DTP_DYNAMIC_SHARED(float, smem);
    const float mine = static_cast<float>(threadIdx.x + 100 * blockIdx.x);
    const float partner = __shfl_xor_sync(0xffffffffu, mine, 1);
    smem[threadIdx.x] = partner;
    __syncthreads();
    got[blockIdx.x * 32 + threadIdx.x] = smem[31 - threadIdx.x];
  });
  for (unsigned b = 0; b < 2; ++b)
    for (unsigned t = 0; t < 32; ++t)
      EXPECT_EQ(got[b * 32 + t], static_cast<float>(((31 - t) ^ 1u) + 100 * b)) << "block " << b << " thread " << t;
}

}  // namespace
}  // namespace dtp
