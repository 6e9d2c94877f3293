// The tensor-core flash attention kernels, run on the CPU under the CUDA
// emulator, against the CPU's flash attention: the WMMA kernels
// (runtime/src/cuda/flash_attention_tc.cuh) in f32, bf16 and f16, and the
// mma.sync kernels (flash_attention_mma.cuh) in bf16 and f16 (heads up to
// 64 wide; wider ones run WMMA there too, as on a GPU). This checks their
// tiling, masking, online softmax, fragment layouts and synchronization on
// every machine; tests/gpu/ checks the same kernels on a GPU.
//
// Every case runs against the CPU's op in the same dtype, which computes in
// f32, rounds P and dS to a 16-bit type before their products (as the
// kernels do), and rounds what it stores.
//
// Tolerance: |kernel - cpu| <= tol (|cpu| + max |cpu|), element-wise (for
// the gradients, the max over all three), with
// tol = 2e-3 for f32 and 2 epsilons for bf16 (2^-6) and f16 (2^-9). The f32
// kernels round their inputs and the probabilities to TF32 (2^-11 relative),
// which stays below 1e-3 on these shapes, and losing one key of 64 or one
// column of a row moves an output by about 1e-2. The 16-bit tolerance is the
// GPU checkers' (tests/gpu/nn_cuda_half_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "emulated/cuda_emulator.h"  // first: it defines the CUDA keywords for the kernels

#include "cuda/flash_attention_launches.cuh"
#include "dtp/nn_ops.h"
#include "dtp/tensor.h"
#include "emulated/kernel_elements.h"

namespace dtp {
namespace {

namespace flash = cuda::flash;

// Under the sanitizers (tools/sanitizers.sh) the f16 instances are not
// compiled: they share the bf16 instances' template, barriers, indices and
// 2-byte accesses, the sanitizers run bf16 only, and the f16 kernels are a
// third of this file's compile time there. The plain build runs both.
#if defined(DTP_SANITIZER_BUILD)
constexpr bool kWithF16 = false;
#else
constexpr bool kWithF16 = true;
#endif

// with_element() for the element types this build compiles.
template <typename Fn>
void with_compiled_element(DType dtype, Fn&& fn) {
  if constexpr (kWithF16) {
    emulated::with_element(dtype, fn);
  } else {
    if (dtype == DType::bf16)
      fn(__nv_bfloat16{});
    else
      fn(float{});
  }
}

double tolerance(DType dtype) {
  if (dtype == DType::bf16) return std::ldexp(1.0, -6);
  if (dtype == DType::f16) return std::ldexp(1.0, -9);
  return 2e-3;
}

struct Case {
  std::string name;  // in the test's name (tools/sanitizers.sh picks shapes by it)
  std::int64_t B, Tq, Tk, H, D;
  ops::AttentionMask mask;
};

std::string describe(const Case& c) {
  return c.name + ": B " + std::to_string(c.B) + " Tq " + std::to_string(c.Tq) + " Tk " +
         std::to_string(c.Tk) + " H " + std::to_string(c.H) + " D " + std::to_string(c.D) +
         (c.mask.causal ? " causal" : " no mask") + " q_start " + std::to_string(c.mask.q_start) +
         " k_start " + std::to_string(c.mask.k_start);
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.to_vector()) m = std::max(m, std::abs(x));
  return m;
}

// Element-wise comparison that names the worst element by (b, t, h, d) or
// (b, h, t). The scale is max |want|, or @p floor if larger: a gradient that
// is zero in exact arithmetic (dS with a single key) comes out as rounding
// noise of the backward's other gradients' size.
void expect_close(const Tensor& got, const Tensor& want, const std::string& what,
                  double floor = 0) {
  const double tol = tolerance(want.dtype());
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  const double scale = std::max(max_abs(want), floor);
  std::int64_t worst = -1;
  double worst_excess = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double allowed = tol * (std::abs(w[i]) + scale), err = std::abs(g[i] - w[i]);
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
  ADD_FAILURE() << what << ": element [" << where << "] is " << g[worst] << " from the kernel and "
                << w[worst] << " from the CPU (allowed " << tol << " x (|cpu| + max |cpu| " << scale
                << "))";
}

// Calls fn(std::integral_constant<int, MAXD>{}) with the kernels' head-dim bucket for D.
template <typename Fn>
void with_head_dim(std::int64_t D, Fn&& fn) {
  if (D <= 16)
    fn(std::integral_constant<int, 16>{});
  else if (D <= 32)
    fn(std::integral_constant<int, 32>{});
  else if (D <= 64)
    fn(std::integral_constant<int, 64>{});
  else
    fn(std::integral_constant<int, 128>{});
}

unsigned tiles(std::int64_t rows) {
  return static_cast<unsigned>((rows + flash::kRows - 1) / flash::kRows);
}

std::vector<Case> cases() {
  return {{"one_tile", 2, 40, 40, 3, 16, {}},
          {"two_tiles", 1, 70, 70, 2, 64, {}},      // two tiles of queries and of keys
          {"three_tiles", 1, 150, 150, 1, 64, {}},  // the running max is rescaled across tiles
          {"head_80", 2, 33, 33, 2, 80, {}},        // head dim not a power of two
          {"head_128", 1, 37, 37, 1, 128, {}},      // the widest head
          {"later_queries", 1, 20, 45, 2, 32, {true, 30, 0}},  // a later block of queries (ring
                                                               // attention)
          {"keys_after_queries", 1, 25, 30, 2, 16, {true, 0, 10}},  // early rows see nothing
          {"offset_tiles", 1, 90, 130, 1, 24, {true, 100, 60}},     // offsets and several tiles on
                                                                    // both sides
          {"no_mask", 2, 17, 29, 1, 8, {false, 0, 0}},
          {"no_mask_key_tiles", 1, 70, 100, 1, 32, {false, 0, 0}},  // no mask, several key tiles
          {"one_key", 1, 1, 1, 1, 1, {}},                         // one query, one key, one column
          {"exact_tile", 1, 64, 64, 2, 64, {}},                   // exactly one tile each way
          {"odd_head_more_keys", 3, 5, 9, 2, 40, {true, 4, 0}}};  // odd head width, more keys than
                                                                  // queries
}

using emulated::ptr;
using emulated::with_element;

struct Param {
  Case c;
  DType dtype;
  bool mma;  // the mma.sync kernels (16-bit only), else the WMMA ones
};
std::string kernels(const Param& p) { return p.mma ? "mma" : "wmma"; }
void PrintTo(const Param& p, std::ostream* os) {
  *os << describe(p.c) << " " << dtype_name(p.dtype) << " " << kernels(p);
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const Case& c : cases()) out.push_back({c, DType::f32, false});
  // Heads wider than 64 run the WMMA kernels even when mma.sync is asked
  // for (flash_attention_launches.cuh): their mma cases would repeat them.
  for (DType dtype : {DType::bf16, DType::f16})
    for (bool mma : {false, true})
      if (dtype != DType::f16 || kWithF16)
        for (const Case& c : cases())
          if (!mma || c.D <= 64) out.push_back({c, dtype, mma});
  return out;
}

class EmulatedFlashAttention : public ::testing::TestWithParam<Param> {};

TEST_P(EmulatedFlashAttention, ForwardAndBackwardMatchTheCpu) {
  const auto& [c, dtype, mma] = GetParam();
  SCOPED_TRACE(describe(c) + " " + dtype_name(dtype) + " " + kernels(GetParam()));
  const Shape qs{c.B, c.Tq, c.H, c.D}, ks{c.B, c.Tk, c.H, c.D}, stat{c.B, c.H, c.Tq};
  const Tensor q = Tensor::random_uniform(qs, 30, -1, 1, dtype),
               k = Tensor::random_uniform(ks, 31, -1, 1, dtype),
               v = Tensor::random_uniform(ks, 32, -1, 1, dtype),
               dout = Tensor::random_uniform(qs, 33, -1, 1, dtype);
  Tensor out = Tensor::zeros(qs, dtype), m = Tensor::zeros(stat, dtype),
         l = Tensor::zeros(stat, dtype);
  ops::flash_attention_forward(q, k, v, out, m, l, c.mask);
  Tensor dq = Tensor::zeros(qs, dtype), dk = Tensor::zeros(ks, dtype),
         dv = Tensor::zeros(ks, dtype);
  ops::flash_attention_backward(q, k, v, out, m, l, dout, dq, dk, dv, c.mask);

  const flash::Dims d{c.B, c.Tq, c.Tk,
                      c.H, c.D,  static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)))};
  const flash::Mask mask{c.mask.causal, c.mask.q_start, c.mask.k_start};
  Tensor e_out = Tensor::full(qs, -7.0, dtype), e_m = Tensor::full(stat, -7.0, dtype),
         e_l = Tensor::full(stat, -7.0, dtype);
  Tensor e_dq = Tensor::full(qs, -7.0, dtype), e_dk = Tensor::full(ks, -7.0, dtype),
         e_dv = Tensor::full(ks, -7.0, dtype);
  Tensor delta = Tensor::zeros(stat);  // f32, as on the GPU

  with_compiled_element(dtype, [&](auto element) {
    using T = decltype(element);
    const flash::Dims rows{c.B, c.Tq, 0, c.H, c.D, 1.f};
    emu::launch(dim3(1), dim3(64), 0,
                [&] {  // delta = rowsum(dO * O) from the CPU's output, by 64 threads
                  flash::row_dot_kernel<T>(ptr<T>(dout), ptr<T>(out), delta.data<float>(), rows);
                });
    with_head_dim(c.D, [&](auto maxd) {
      constexpr int MAXD = decltype(maxd)::value;
      const dim3 threads(flash::kThreads);
      flash::forward_launches<T, MAXD>(mma, [&](auto kernel, std::size_t bytes) {
        emu::launch(dim3(tiles(c.Tq), c.H, c.B), threads, bytes, [&] {
          kernel(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(e_out), ptr<T>(e_m), ptr<T>(e_l), d, mask);
        });
      });
      // The backward runs from the CPU's forward, so each half is checked on its own.
      flash::backward_launches<T, MAXD>(mma, [&](auto kernel, std::size_t bytes, auto blocks) {
        const T* in[] = {ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(dout), ptr<T>(m), ptr<T>(l)};
        if constexpr (std::is_same_v<decltype(blocks), flash::KeyBlocks>)
          emu::launch(dim3(tiles(c.Tk), c.H, c.B), threads, bytes, [&] {
            kernel(in[0], in[1], in[2], in[3], in[4], in[5], delta.data<float>(), ptr<T>(e_dk),
                   ptr<T>(e_dv), d, mask);
          });
        else
          emu::launch(dim3(tiles(c.Tq), c.H, c.B), threads, bytes, [&] {
            kernel(in[0], in[1], in[2], in[3], in[4], in[5], delta.data<float>(), ptr<T>(e_dq), d,
                   mask);
          });
      });
    });
  });

  expect_close(e_out, out, "out");
  expect_close(e_l, l, "row_sum");
  // row_max is -inf for a row that sees no key: it must be -inf there, and close elsewhere.
  const std::vector<double> want_m = m.to_vector(), got_m = e_m.to_vector();
  for (std::size_t r = 0; r < want_m.size(); ++r) {
    if (std::isinf(want_m[r]))
      EXPECT_TRUE(std::isinf(got_m[r]) && got_m[r] < 0)
          << "row_max of row " << r << ": got " << got_m[r];
    else
      EXPECT_NEAR(got_m[r], want_m[r], tolerance(dtype) * (1 + std::abs(want_m[r])))
          << "row_max of row " << r;
  }
  const double gradients = std::max({max_abs(dq), max_abs(dk), max_abs(dv)});
  expect_close(e_dq, dq, "dq", gradients);
  expect_close(e_dk, dk, "dk", gradients);
  expect_close(e_dv, dv, "dv", gradients);
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmulatedFlashAttention, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const Case& c = info.param.c;
                           return std::string(dtype_name(info.param.dtype)) + "_" +
                                  kernels(info.param) + "_" + c.name + "_D" + std::to_string(c.D) +
                                  (c.mask.causal ? "_causal" : "_nomask");
                         });

// The emulator itself: a kernel that reads another lane's shared-memory
// store without __syncwarp() must be caught often enough to matter, and a
// misaligned fragment load must fail the launch with a message.
TEST(CudaEmulator, AMisalignedFragmentLoadFailsTheLaunch) {
  EXPECT_THROW(emu::launch(dim3(1), dim3(32), 4096,
                           [] {
                             DTP_DYNAMIC_SHARED(float, smem);
                             flash::FragA<float> a;
                             nvcuda::wmma::load_matrix_sync(a, smem + 1,
                                                            16);  // 4 bytes past a 32-byte boundary
                           }),
               std::runtime_error);
}

TEST(CudaEmulator, ALoadPastTheSharedMemoryFailsTheLaunch) {
  EXPECT_THROW(emu::launch(dim3(1), dim3(32), 256,
                           [] {
                             DTP_DYNAMIC_SHARED(float, smem);
                             flash::FragA<float> a;
                             nvcuda::wmma::load_matrix_sync(a, smem,
                                                            16);  // 16 rows of 16 floats: 1 KiB
                           }),
               std::runtime_error);
}

// Lanes 0-15 at a warp-wide step, lanes 16-31 at __syncthreads: on a GPU a
// hang; here a diagnosis after the (shortened) barrier timeout.
TEST(CudaEmulatorDeathTest, ThreadsAtDifferentBarriersEndWithADiagnosisNotAHang) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        emu::barrier_timeout = std::chrono::milliseconds(200);
        emu::launch(dim3(1), dim3(32), 0, [] {
          if (threadIdx.x < 16)
            __syncwarp();
          else
            __syncthreads();
        });
      },
      "no barrier completed for 200 ms(.|\n)*thread 0 waits at a warp-wide step(.|\n)*thread 16 "
      "waits at "
      "__syncthreads");
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
      EXPECT_EQ(got[b * 32 + t], static_cast<float>(((31 - t) ^ 1u) + 100 * b))
          << "block " << b << " thread " << t;
}

}  // namespace
}  // namespace dtp
