// The element-wise kernels (runtime/src/cuda/elementwise_kernels.cuh) on the
// CPU under the CUDA emulator: each kernel's vector instance (16 bytes per
// access) against its scalar instance, and the scalar one against the CPU op.
//
// The vector and scalar instances do the same arithmetic per element, so
// their outputs must be equal bit for bit: a wrong chunk index, a lost tail
// element or a bias chunk read from the wrong column shows as a difference.
// Lengths cover fewer elements than one chunk, whole chunks, and whole chunks
// plus every possible tail; the grid is small, so threads stride over chunks.
// Against the CPU op (f32 arithmetic, compiled differently; the CPU's GELU
// uses a fast tanh), elements agree within 1e-5 (f32) or one unit in the
// last place of a 16-bit type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "emulated/cuda_emulator.h"  // first: it defines the CUDA keywords for the kernels

#include "cuda/elementwise_kernels.cuh"
#include "dtp/nn_ops.h"
#include "dtp/ops.h"
#include "dtp/tensor.h"
#include "emulated/kernel_elements.h"

namespace dtp {
namespace {

namespace ew = cuda::elementwise;
using cuda::vec::kWidth;

using emulated::ptr;
using emulated::with_element;

// A small grid: 2 blocks of one warp, so every thread strides over several
// chunks (the emulator starts a thread per GPU thread: few keep it fast).
void launch(const std::function<void()>& kernel) { emu::launch(dim3(2), dim3(32), 0, kernel); }

Tensor random(std::int64_t n, std::uint64_t seed, DType dtype, double low = -3, double high = 3) {
  return Tensor::random_uniform({n}, seed, low, high, dtype);
}

// Lengths around the chunk width W: one element, whole chunks, the
// shortest and the longest tail, and more chunks than threads with a tail.
std::vector<std::int64_t> lengths(int W) {
  return {1, 3 * W, 5 * W + 1, 5 * W + W - 1, 64 * 3 * W + 5};
}

// Elements equal bit for bit (the vector instance, W elements per access,
// against the scalar one). A difference names its chunk, or the tail.
void expect_same_bits(const Tensor& got, const Tensor& want, int W, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel());
  const std::size_t size = dtype_size(got.dtype());
  const std::int64_t n = got.numel(), whole = n / W * W;
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  for (std::int64_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(got.raw()) + i * size,
                    static_cast<const char*>(want.raw()) + i * size, size) == 0)
      continue;
    ADD_FAILURE() << what << ": element " << i << " of " << n << " is " << g[i]
                  << " from the vector kernel and " << w[i] << " from the scalar one"
                  << (W == 1 ? "" : "; it is ")
                  << (W == 1      ? ""
                      : i < whole ? "element " + std::to_string(i % W) + " of chunk " +
                                        std::to_string(i / W) + " (" + std::to_string(W) +
                                        " elements per access)"
                                  : "in the tail, the " + std::to_string(n - whole) +
                                        " elements after the last whole chunk (one thread each)");
    return;
  }
}

// The scalar kernel against the CPU op: |kernel - cpu| <= tol (|cpu| + 1),
// tol = 1e-5 for f32 (the GPU checkers' tolerance: the CPU's GELU uses a
// fast tanh) or one unit in the last place of a 16-bit type (2^-7 bf16,
// 2^-10 f16).
void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  const double tol = got.dtype() == DType::bf16  ? std::ldexp(1.0, -7)
                     : got.dtype() == DType::f16 ? std::ldexp(1.0, -10)
                                                 : 1e-5;
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  ASSERT_EQ(g.size(), w.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i] - w[i]) <= tol * (std::abs(w[i]) + 1)) continue;
    ADD_FAILURE() << what << ": element " << i << " is " << g[i] << " from the kernel and " << w[i]
                  << " from the CPU op (allowed " << tol << " x (|cpu| + 1))";
    return;
  }
}

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

// Runs run_kernel(W, tensors) with W = the vector width and W = 1, and
// cpu(tensors), each on its own copies of @p inputs; the tensors at the
// indices @p written must agree: vector and scalar bit for bit, scalar and
// CPU within expect_close's tolerance.
template <typename T, typename Launch, typename Cpu>
void check_kernel(const std::string& name, std::int64_t n, const std::vector<Tensor>& inputs,
                  const std::vector<int>& written, Launch&& run_kernel, Cpu&& cpu) {
  auto copies = [&] {
    std::vector<Tensor> c;
    for (const Tensor& t : inputs) c.push_back(t.clone());
    return c;
  };
  std::vector<Tensor> vector = copies(), scalar = copies(), on_cpu = copies();
  run_kernel(std::integral_constant<int, kWidth<T>>{}, vector);
  run_kernel(std::integral_constant<int, 1>{}, scalar);
  cpu(on_cpu);
  for (int w : written) {
    const std::string what = name + " " + dtype_name(inputs[0].dtype()) + " n " +
                             std::to_string(n) + ", output " + std::to_string(w);
    expect_same_bits(vector[w], scalar[w], kWidth<T>, what);
    expect_close(scalar[w], on_cpu[w], what);
  }
}

TEST(EmulatedElementwise, AddAxpyScaleMatchScalarAndCpu) {
  for (DType dtype : kDtypes)
    with_element(dtype, [&](auto zero) {
      using T = decltype(zero);
      for (std::int64_t n : lengths(kWidth<T>)) {
        const std::vector<Tensor> in = {random(n, 1, dtype), random(n, 2, dtype),
                                        random(n, 3, dtype)};
        check_kernel<T>(
            "add", n, in, {2},
            [&](auto w, std::vector<Tensor>& t) {
              launch([&] {
                ew::add_kernel<T, decltype(w)::value>(ptr<T>(t[0]), ptr<T>(t[1]), ptr<T>(t[2]), n);
              });
            },
            [&](std::vector<Tensor>& t) { ops::add(t[0], t[1], t[2]); });
        check_kernel<T>(
            "axpy", n, in, {0},
            [&](auto w, std::vector<Tensor>& t) {
              launch([&] {
                ew::axpy_kernel<T, decltype(w)::value>(ptr<T>(t[0]), -0.75f, ptr<T>(t[1]), n);
              });
            },
            [&](std::vector<Tensor>& t) { ops::axpy(t[0], -0.75, t[1]); });
        check_kernel<T>(
            "scale", n, in, {0},
            [&](auto w, std::vector<Tensor>& t) {
              launch([&] { ew::scale_kernel<T, decltype(w)::value>(ptr<T>(t[0]), n, 1.0 / 3.0); });
            },
            [&](std::vector<Tensor>& t) { ops::scale(t[0], 1.0 / 3.0); });
      }
    });
}

TEST(EmulatedElementwise, AddBiasMatchesScalarAndCpu) {
  for (DType dtype : kDtypes)
    with_element(dtype, [&](auto zero) {
      using T = decltype(zero);
      constexpr int W = kWidth<T>;
      // Columns a multiple of W (the host's condition for the vector kernel), one to many rows.
      for (std::int64_t cols : {std::int64_t{W}, std::int64_t{3 * W}, std::int64_t{24 * W}})
        for (std::int64_t rows : {1, 2, 7}) {
          const std::int64_t n = rows * cols;
          const std::vector<Tensor> in = {random(n, 4, dtype), random(cols, 5, dtype)};
          check_kernel<T>(
              "add_bias cols " + std::to_string(cols), n, in, {0},
              [&](auto w, std::vector<Tensor>& t) {
                launch([&] {
                  ew::add_bias_kernel<T, decltype(w)::value>(ptr<T>(t[0]), ptr<T>(t[1]), n, cols);
                });
              },
              [&](std::vector<Tensor>& t) {
                Tensor x = t[0].view(Shape{rows, cols});
                ops::add_bias(x, t[1]);
              });
        }
    });
}

TEST(EmulatedElementwise, GeluForwardBackwardMatchScalarAndCpu) {
  for (DType dtype : kDtypes)
    with_element(dtype, [&](auto zero) {
      using T = decltype(zero);
      for (std::int64_t n : lengths(kWidth<T>)) {
        const std::vector<Tensor> in = {random(n, 6, dtype), random(n, 7, dtype),
                                        random(n, 8, dtype)};
        check_kernel<T>(
            "gelu_forward", n, in, {1},
            [&](auto w, std::vector<Tensor>& t) {
              launch([&] {
                ew::gelu_forward_kernel<T, decltype(w)::value>(ptr<T>(t[0]), ptr<T>(t[1]), n);
              });
            },
            [&](std::vector<Tensor>& t) { ops::gelu_forward(t[0], t[1]); });
        check_kernel<T>(
            "gelu_backward", n, in, {2},
            [&](auto w, std::vector<Tensor>& t) {
              launch([&] {
                ew::gelu_backward_kernel<T, decltype(w)::value>(ptr<T>(t[0]), ptr<T>(t[1]),
                                                                ptr<T>(t[2]), n);
              });
            },
            [&](std::vector<Tensor>& t) { ops::gelu_backward(t[0], t[1], t[2]); });
      }
    });
}

TEST(EmulatedElementwise, OptimizerUpdatesMatchScalarAndCpu) {
  using T = float;  // the optimizers update f32 masters (16-bit parameters are refused)
  const DType dtype = DType::f32;
  const double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, decay = 0.1;
  const std::int64_t step = 3;
  const ew::AdamWScalars s{static_cast<float>(beta1),
                           static_cast<float>(beta2),
                           static_cast<float>(lr / (1 - std::pow(beta1, step))),
                           static_cast<float>(1 / std::sqrt(1 - std::pow(beta2, step))),
                           static_cast<float>(eps),
                           static_cast<float>(lr * decay)};
  for (std::int64_t n : lengths(kWidth<T>)) {
    const std::vector<Tensor> in = {random(n, 9, dtype), random(n, 10, dtype), random(n, 11, dtype),
                                    random(n, 12, dtype, 0, 2)};  // v >= 0
    check_kernel<T>(
        "adamw", n, in, {0, 2, 3},
        [&](auto w, std::vector<Tensor>& t) {
          launch([&] {
            ew::adamw_kernel<T, decltype(w)::value>(ptr<T>(t[0]), ptr<T>(t[1]), ptr<T>(t[2]),
                                                    ptr<T>(t[3]), n, s);
          });
        },
        [&](std::vector<Tensor>& t) {
          ops::adamw_update(t[0], t[1], t[2], t[3], lr, beta1, beta2, eps, decay, step);
        });
    for (bool nesterov : {false, true})
      check_kernel<T>(
          nesterov ? "sgd nesterov" : "sgd momentum", n, in, {0, 2},
          [&](auto w, std::vector<Tensor>& t) {
            launch([&] {
              ew::sgd_kernel<T, decltype(w)::value>(ptr<T>(t[0]), ptr<T>(t[1]), ptr<T>(t[2]), n,
                                                    0.1f, 0.9f, 0.01f, nesterov);
            });
          },
          [&](std::vector<Tensor>& t) {
            ops::sgd_update(t[0], t[1], t[2], 0.1, 0.9, 0.01, nesterov);
          });
    check_kernel<T>(
        "sgd plain", n, in, {0},
        [&](auto w, std::vector<Tensor>& t) {
          launch([&] {
            ew::sgd_kernel<T, decltype(w)::value>(ptr<T>(t[0]), ptr<T>(t[1]), nullptr, n, 0.1f, 0.f,
                                                  0.01f, false);
          });
        },
        [&](std::vector<Tensor>& t) {
          Tensor none;
          ops::sgd_update(t[0], t[1], none, 0.1, 0.0, 0.01, false);
        });
  }
}

// Casts between f32 and the 16-bit types, 16 bytes of the wider type per access.
TEST(EmulatedElementwise, CastsMatchScalarAndCpu) {
  for (auto [from, to] : {std::pair{DType::f32, DType::bf16},
                          {DType::bf16, DType::f32},
                          {DType::f32, DType::f16},
                          {DType::f16, DType::f32}})
    with_element(from, [&](auto src_zero) {
      with_element(to, [&](auto dst_zero) {
        using S = decltype(src_zero);
        using D = decltype(dst_zero);
        constexpr int W = kWidth<std::conditional_t<(sizeof(S) > sizeof(D)), S, D>>;
        for (std::int64_t n : lengths(W)) {
          // Values past f16's range and below its normals too: overflow and subnormals round as on
          // the CPU.
          Tensor src = random(n, 13, from, -7e4, 7e4);
          if (n > 2) src.slice(1, 1).fill(3e-6);
          Tensor dst = Tensor::zeros({n}, to);
          const std::string what = std::string("cast ") + dtype_name(from) + " -> " +
                                   dtype_name(to) + " n " + std::to_string(n);
          Tensor vector = dst.clone(), scalar = dst.clone(), on_cpu = dst.clone();
          launch([&] { ew::cast_kernel<S, D, W>(ptr<S>(src), ptr<D>(vector), n); });
          launch([&] { ew::cast_kernel<S, D, 1>(ptr<S>(src), ptr<D>(scalar), n); });
          ops::cast(src, on_cpu);
          expect_same_bits(vector, scalar, W, what);
          expect_same_bits(scalar, on_cpu, 1, what + " (the scalar kernel against the CPU's cast)");
        }
      });
    });
}

TEST(EmulatedElementwise, NonFiniteFoundInAnyChunkOrTail) {
  for (DType dtype : kDtypes)
    with_element(dtype, [&](auto zero) {
      using T = decltype(zero);
      constexpr int W = kWidth<T>;
      const std::int64_t n = 5 * W + 3;
      for (std::int64_t at : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{W + 1}, n - 1})
        for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
          Tensor x = random(n, 14, dtype);
          if (at >= 0) x.slice(at, 1).fill(bad);
          for (int width : {W, 1}) {
            int found = 0;
            launch([&] {
              if (width == W)
                ew::nonfinite_kernel<T, W>(ptr<T>(x), n, &found);
              else
                ew::nonfinite_kernel<T, 1>(ptr<T>(x), n, &found);
            });
            EXPECT_EQ(found, at >= 0 ? 1 : 0)
                << dtype_name(dtype) << " width " << width << ": " << (at >= 0 ? "a " : "no ")
                << (at >= 0 ? std::to_string(bad) + " at element " + std::to_string(at)
                            : std::string("non-finite"))
                << " of " << n << (at >= 0 ? " was not found" : " element, yet one was reported");
          }
        }
    });
}

// The host's choice of width: vector only when every pointer is aligned to it.
TEST(EmulatedElementwise, WidthIsVectorOnlyWhenEveryPointerIsAligned) {
  alignas(16) float f[8] = {};
  alignas(16) std::uint16_t h[16] = {};
  EXPECT_TRUE(cuda::all_aligned(4, f, f + 4));
  EXPECT_FALSE(cuda::all_aligned(4, f, f + 1))
      << "a view 1 f32 past an aligned start is not 16-byte aligned";
  EXPECT_TRUE(cuda::all_aligned(8, h, h + 8));
  EXPECT_FALSE(cuda::all_aligned(8, h + 8, h + 4))
      << "one of two pointers misaligned must give the scalar kernel";
  int chosen = 0;
  cuda::with_width<float>([&](auto w) { chosen = decltype(w)::value; }, f,
                          static_cast<const float*>(f + 2));
  EXPECT_EQ(chosen, 1);
  cuda::with_width<float>([&](auto w) { chosen = decltype(w)::value; }, f,
                          static_cast<const float*>(f + 4));
  EXPECT_EQ(chosen, 4);
}

}  // namespace
}  // namespace dtp
