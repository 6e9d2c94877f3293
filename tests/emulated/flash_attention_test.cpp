// The flash attention kernels, run on the CPU under the CUDA emulator,
// against the CPU's flash attention: the WMMA kernels
// (runtime/src/cuda/flash_attention_tc.cuh) in f32 (TF32), bf16 and f16, the
// mma.sync kernels (flash_attention_mma.cuh) in bf16 and f16 (heads up to
// 64 wide; wider ones run WMMA there too, as on a GPU), and the exact f32
// kernels (flash_attention_exact.cuh) that f32 runs with TF32 off. This
// checks their tiling, masking, online softmax, fragment layouts and
// synchronization on every machine; tests/gpu/ checks the same kernels on a
// GPU.
//
// Every case runs against the CPU's op in the same dtype, which computes in
// f32, rounds P and dS to a 16-bit type before their products (as the
// kernels do), and rounds what it stores.
//
// Tolerance: |kernel - cpu| <= tol (|cpu| + max |cpu|), element-wise (for
// the gradients, the max over all three), with
// - TF32: 2e-3. The kernels round their inputs and the probabilities to TF32
//   (2^-11 relative), which stays below 1e-3 on these shapes, and losing one
//   key of 64 or one column of a row moves an output by about 1e-2.
// - bf16 and f16: 2 epsilons, 2^-6 and 2^-9: the GPU checkers' tolerance
//   (tests/gpu/nn_cuda_half_test.cpp).
// - exact f32: 2 n 2^-24 with n = Tq + Tk + D: 6.4e-6 at Tq 17, Tk 29,
//   D 8 and 4.1e-5 at Tq = Tk = 150, D = 64. Kernel and CPU do the same f32
//   operations in other orders: dot products of D terms, sums over Tk keys
//   (forward, dQ) or Tq queries (dK, dV), the softmax's rescalings. Each
//   result is a chain of such sums of at most n terms in all, and a sum of
//   n terms in any order is within n 2^-24 of the exact sum, relative to
//   the terms' magnitude, so the two are within 2 n 2^-24 of each other.
//   Measured under the emulator: at most 3% of the allowance (the largest
//   error 3.7e-7, 6 x 2^-24). A wrong key, column or scale moves an output
//   by more than 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
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

// The ops' default scale, 1/sqrt(D).
double softmax_scale(const Case& c) { return 1.0 / std::sqrt(static_cast<double>(c.D)); }

double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.to_vector()) m = std::max(m, std::abs(x));
  return m;
}

// Element @p flat of @p t as "[b, t, h, d]" (outputs) or "[b, h, t]" (row statistics).
std::string position(const Tensor& t, std::int64_t flat) {
  std::string where;
  for (std::int64_t dim = t.ndim() - 1; dim >= 0; --dim) {
    where = std::to_string(flat % t.size(dim)) + (where.empty() ? "" : ", ") + where;
    flat /= t.size(dim);
  }
  return "[" + where + "]";
}

// What a wrong value suggests, for a failure message: an element the kernel
// never wrote (outputs start at -7), a value where the CPU has 0 (a hidden
// key or a row that sees no key), or the ratio kernel / cpu, decoded when it
// is the softmax scale s = 1/sqrt(D) or its inverse, or (an output, whose
// row's sum is @p l) l or l^2.
std::string meaning(double got, double want, double s, double l = 0) {
  if (got == -7) return "the kernel never wrote it";
  if (want == 0) return "the CPU has 0 there (a hidden key, or a row that sees no key)";
  const double ratio = got / want;
  const auto near = [&](double x) { return std::abs(ratio - x) <= 1e-3 * std::abs(x); };
  const std::string r = "kernel / cpu = " + std::to_string(ratio);
  if (near(1 / s)) return r + " = 1 / s: looks like a missing softmax scale s";
  if (near(s)) return r + " = s: looks like the softmax scale s applied twice";
  if (l > 0 && near(l)) return r + " = the row's sum l: looks like the output was not divided by l";
  if (l > 0 && near(l * l))
    return r + " = l^2 for the row's sum l: looks like the output was multiplied by l, not divided";
  return r;
}

// The row sum l[b, h, t] of element @p flat of an output [b, t, h, d].
double row_sum_of(const Tensor& l, const Tensor& out, std::int64_t flat) {
  const std::int64_t T = out.size(1), H = out.size(2), D = out.size(3);
  const std::int64_t t = flat / (H * D) % T, h = flat / D % H, b = flat / (T * H * D);
  return l.to_vector()[static_cast<std::size_t>((b * H + h) * T + t)];
}

// Element-wise comparison within tol (|want| + scale) that names the worst
// element and what its value suggests (meaning(), with the softmax scale
// @p s, and for an output the CPU's @p row_sums). The scale is max |want|,
// or @p floor if larger: a gradient that is zero in exact arithmetic (dS
// with a single key) comes out as rounding noise of the backward's other
// gradients' size.
void expect_close(const Tensor& got, const Tensor& want, double tol, double s,
                  const std::string& what, double floor = 0, const Tensor* row_sums = nullptr) {
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
  ADD_FAILURE() << what << ": element " << position(got, worst) << " is " << g[worst]
                << " from the kernel and " << w[worst] << " from the CPU (allowed " << tol
                << " x (|cpu| + max |cpu| " << scale << ")): "
                << meaning(g[worst], w[worst], s, row_sums ? row_sum_of(*row_sums, got, worst) : 0);
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

/// Which kernels run: WMMA (TF32 for f32), mma.sync (16-bit only), or exact f32 (f32 only).
enum class Kernels { wmma, mma, exact };
std::string kernels_name(Kernels k) {
  return k == Kernels::wmma ? "wmma" : k == Kernels::mma ? "mma" : "exact";
}
flash::KernelChoice choice_of(Kernels k) { return {k == Kernels::mma, k != Kernels::exact}; }

struct Param {
  Case c;
  DType dtype;
  Kernels kernels;
};
void PrintTo(const Param& p, std::ostream* os) {
  *os << describe(p.c) << " " << dtype_name(p.dtype) << " " << kernels_name(p.kernels);
}

// The tolerances of the header comment.
double tolerance(const Param& p) {
  if (p.dtype == DType::bf16) return std::ldexp(1.0, -6);
  if (p.dtype == DType::f16) return std::ldexp(1.0, -9);
  if (p.kernels == Kernels::exact)
    return 2 * std::ldexp(1.0, -24) * static_cast<double>(p.c.Tq + p.c.Tk + p.c.D);
  return 2e-3;
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (Kernels kernels : {Kernels::wmma, Kernels::exact})
    for (const Case& c : cases()) out.push_back({c, DType::f32, kernels});
  // Heads wider than 64 run the WMMA kernels even when mma.sync is asked
  // for (flash_attention_launches.cuh): their mma cases would repeat them.
  for (DType dtype : {DType::bf16, DType::f16})
    for (Kernels kernels : {Kernels::wmma, Kernels::mma})
      if (dtype != DType::f16 || kWithF16)
        for (const Case& c : cases())
          if (kernels != Kernels::mma || c.D <= 64) out.push_back({c, dtype, kernels});
  return out;
}

/// A flash attention's inputs and its forward and backward outputs.
struct Attention {
  Tensor q, k, v, dout;  // the inputs
  Tensor out, m, l;      // the forward: output, row max, row sum
  Tensor dq, dk, dv;     // the backward
};

/// Random inputs of case @p c and the CPU's flash attention on them.
Attention cpu_attention(const Case& c, DType dtype) {
  const Shape qs{c.B, c.Tq, c.H, c.D}, ks{c.B, c.Tk, c.H, c.D}, stat{c.B, c.H, c.Tq};
  Attention a{Tensor::random_uniform(qs, 30, -1, 1, dtype),
              Tensor::random_uniform(ks, 31, -1, 1, dtype),
              Tensor::random_uniform(ks, 32, -1, 1, dtype),
              Tensor::random_uniform(qs, 33, -1, 1, dtype),
              Tensor::zeros(qs, dtype),
              Tensor::zeros(stat, dtype),
              Tensor::zeros(stat, dtype),
              Tensor::zeros(qs, dtype),
              Tensor::zeros(ks, dtype),
              Tensor::zeros(ks, dtype)};
  ops::flash_attention_forward(a.q, a.k, a.v, a.out, a.m, a.l, c.mask);
  ops::flash_attention_backward(a.q, a.k, a.v, a.out, a.m, a.l, a.dout, a.dq, a.dk, a.dv, c.mask);
  return a;
}

/// The kernels that @p kernels selects, under the emulator, on cpu's inputs:
/// the forward, and the backward from the CPU's forward (out, m, l), so each
/// half is checked on its own. Outputs start at -7, so a missed element shows.
Attention kernel_attention(const Case& c, const Attention& cpu, Kernels kernels) {
  const DType dtype = cpu.q.dtype();
  const Shape qs{c.B, c.Tq, c.H, c.D}, ks{c.B, c.Tk, c.H, c.D}, stat{c.B, c.H, c.Tq};
  Attention e{cpu.q,
              cpu.k,
              cpu.v,
              cpu.dout,
              Tensor::full(qs, -7.0, dtype),
              Tensor::full(stat, -7.0, dtype),
              Tensor::full(stat, -7.0, dtype),
              Tensor::full(qs, -7.0, dtype),
              Tensor::full(ks, -7.0, dtype),
              Tensor::full(ks, -7.0, dtype)};
  const flash::Dims d{c.B, c.Tq, c.Tk, c.H, c.D, static_cast<float>(softmax_scale(c))};
  const flash::Mask mask{c.mask.causal, c.mask.q_start, c.mask.k_start};
  const flash::KernelChoice choice = choice_of(kernels);
  Tensor delta = Tensor::zeros(stat);  // f32, as on the GPU

  with_compiled_element(dtype, [&](auto element) {
    using T = decltype(element);
    const flash::Dims rows{c.B, c.Tq, 0, c.H, c.D, 1.f};
    emu::launch(dim3(1), dim3(64), 0,
                [&] {  // delta = rowsum(dO * O) from the CPU's output, by 64 threads
                  flash::row_dot_kernel<T>(ptr<T>(cpu.dout), ptr<T>(cpu.out), delta.data<float>(),
                                           rows);
                });
    with_head_dim(c.D, [&](auto maxd) {
      constexpr int MAXD = decltype(maxd)::value;
      flash::forward_launches<T, MAXD>(choice, [&](auto kernel, int threads, std::size_t bytes) {
        emu::launch(dim3(tiles(c.Tq), c.H, c.B), dim3(threads), bytes, [&] {
          kernel(ptr<T>(e.q), ptr<T>(e.k), ptr<T>(e.v), ptr<T>(e.out), ptr<T>(e.m), ptr<T>(e.l), d,
                 mask);
        });
      });
      flash::backward_launches<T, MAXD>(
          choice, [&](auto kernel, int threads, std::size_t bytes, auto blocks) {
            const T* in[] = {ptr<T>(cpu.q),    ptr<T>(cpu.k), ptr<T>(cpu.v),
                             ptr<T>(cpu.dout), ptr<T>(cpu.m), ptr<T>(cpu.l)};
            if constexpr (std::is_same_v<decltype(blocks), flash::KeyBlocks>)
              emu::launch(dim3(tiles(c.Tk), c.H, c.B), dim3(threads), bytes, [&] {
                kernel(in[0], in[1], in[2], in[3], in[4], in[5], delta.data<float>(), ptr<T>(e.dk),
                       ptr<T>(e.dv), d, mask);
              });
            else
              emu::launch(dim3(tiles(c.Tq), c.H, c.B), dim3(threads), bytes, [&] {
                kernel(in[0], in[1], in[2], in[3], in[4], in[5], delta.data<float>(), ptr<T>(e.dq),
                       d, mask);
              });
          });
    });
  });
  return e;
}

class EmulatedFlashAttention : public ::testing::TestWithParam<Param> {};

TEST_P(EmulatedFlashAttention, ForwardAndBackwardMatchTheCpu) {
  const Param& p = GetParam();
  SCOPED_TRACE(describe(p.c) + " " + dtype_name(p.dtype) + " " + kernels_name(p.kernels));
  const Attention cpu = cpu_attention(p.c, p.dtype);
  const Attention got = kernel_attention(p.c, cpu, p.kernels);
  const double tol = tolerance(p), s = softmax_scale(p.c);

  expect_close(got.out, cpu.out, tol, s, "out", 0, &cpu.l);
  expect_close(got.l, cpu.l, tol, s, "row_sum");
  // row_max is -inf for a row that sees no key: it must be -inf there, and close elsewhere.
  const std::vector<double> want_m = cpu.m.to_vector(), got_m = got.m.to_vector();
  for (std::size_t r = 0; r < want_m.size(); ++r) {
    const std::string row = "row_max " + position(cpu.m, static_cast<std::int64_t>(r));
    if (std::isinf(want_m[r]))
      EXPECT_TRUE(std::isinf(got_m[r]) && got_m[r] < 0)
          << row << " is " << got_m[r]
          << " from the kernel, -inf from the CPU (the row sees no key)";
    else
      EXPECT_NEAR(got_m[r], want_m[r], tol * (1 + std::abs(want_m[r])))
          << row << ": " << meaning(got_m[r], want_m[r], s);
  }
  const double gradients = std::max({max_abs(cpu.dq), max_abs(cpu.dk), max_abs(cpu.dv)});
  expect_close(got.dq, cpu.dq, tol, s, "dq", gradients);
  expect_close(got.dk, cpu.dk, tol, s, "dk", gradients);
  expect_close(got.dv, cpu.dv, tol, s, "dv", gradients);
}

INSTANTIATE_TEST_SUITE_P(Shapes, EmulatedFlashAttention, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           const Case& c = info.param.c;
                           return std::string(dtype_name(info.param.dtype)) + "_" +
                                  kernels_name(info.param.kernels) + "_" + c.name + "_D" +
                                  std::to_string(c.D) + (c.mask.causal ? "_causal" : "_nomask");
                         });

// The exact f32 kernels sum in one fixed order with one writer per output
// row: two runs on the same inputs give the same bytes.
TEST(EmulatedExactFlashAttention, TwoRunsGiveTheSameBits) {
  const Case c{"offset_tiles", 2, 90, 130, 2, 24, {true, 100, 60}};
  SCOPED_TRACE(describe(c));
  const Attention cpu = cpu_attention(c, DType::f32);
  const Attention first = kernel_attention(c, cpu, Kernels::exact);
  const Attention second = kernel_attention(c, cpu, Kernels::exact);
  for (auto [name, a, b] :
       {std::tuple<const char*, const Tensor*, const Tensor*>{"out", &first.out, &second.out},
        {"row_max", &first.m, &second.m},
        {"row_sum", &first.l, &second.l},
        {"dq", &first.dq, &second.dq},
        {"dk", &first.dk, &second.dk},
        {"dv", &first.dv, &second.dv}}) {
    const std::vector<double> x = a->to_vector(), y = b->to_vector();
    for (std::size_t i = 0; i < x.size(); ++i)
      if (std::memcmp(&x[i], &y[i], sizeof(double)) != 0) {
        ADD_FAILURE() << name << ": element " << position(*a, static_cast<std::int64_t>(i))
                      << " is " << x[i] << " in the first run and " << y[i]
                      << " in the second: the kernels' sums depend on scheduling";
        break;
      }
  }
}

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
