// The kernels that walk rows (runtime/src/cuda/layernorm_kernels.cuh,
// cross_entropy_kernels.cuh, and the bias gradient of elementwise_kernels.cuh)
// on the CPU under the CUDA emulator, against the CPU ops, with the 16-byte
// vector width and with W = 1.
//
// A row's statistics are summed by 32 lanes (LayerNorm) or a block
// (cross-entropy) in an order that depends on W, so those results agree with
// the CPU's within rounding: f32 1e-5, bf16 2^-7 and f16 2^-10, relative to
// |cpu| + max |cpu|. A wrong chunk, row or column shows as an error of the
// size of the values. The column sums (LayerNorm's weight and bias
// gradients, a bias gradient) add each column in the same order whatever W
// is, so with the same slices the two widths must agree bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "emulated/cuda_emulator.h"  // first: it defines the CUDA keywords for the kernels

#include "cuda/cross_entropy_kernels.cuh"
#include "cuda/elementwise_kernels.cuh"
#include "cuda/layernorm_kernels.cuh"
#include "dtp/nn_ops.h"
#include "dtp/tensor.h"
#include "emulated/kernel_elements.h"

namespace dtp {
namespace {

using cuda::vec::kWidth;

using emulated::ptr;
using emulated::with_element;

const DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

double tolerance(DType dtype) {
  if (dtype == DType::bf16) return std::ldexp(1.0, -7);
  if (dtype == DType::f16) return std::ldexp(1.0, -10);
  return 1e-5;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what,
                  std::int64_t cols) {
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  ASSERT_EQ(g.size(), w.size()) << what;
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  const double tol = tolerance(got.dtype());
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i] - w[i]) <= tol * (std::abs(w[i]) + scale)) continue;
    ADD_FAILURE() << what << ": row " << i / cols << ", column " << i % cols << " is " << g[i]
                  << " from the kernel and " << w[i] << " from the CPU op (allowed " << tol
                  << " x (|cpu| + " << scale << "))";
    return;
  }
}

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::size_t size = dtype_size(got.dtype());
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  for (std::int64_t i = 0; i < got.numel(); ++i)
    if (std::memcmp(static_cast<const char*>(got.raw()) + i * size,
                    static_cast<const char*>(want.raw()) + i * size, size) != 0) {
      ADD_FAILURE() << what << ": column " << i << " is " << g[i] << " with the vector width and "
                    << w[i] << " with W = 1: a column's additions must not depend on the width";
      return;
    }
}

// Row widths a multiple of every vector width (8): fewer than 32 chunks of
// 8, and more than 32 chunks (and 32 columns) at every width, so lanes wrap.
const std::int64_t kCols[] = {40, 264};

TEST(EmulatedRowKernels, LayerNormForwardAndBackwardMatchTheCpu) {
  for (DType dtype : kDtypes)
    with_element(dtype, [&](auto zero) {
      using T = decltype(zero);
      for (std::int64_t cols : kCols) {
        const std::int64_t rows = 9;  // two blocks of 8 warps, the second partly idle
        const Tensor x = Tensor::random_uniform({rows, cols}, 1, -2, 2, dtype);
        const Tensor w = Tensor::random_uniform({cols}, 2, 0.5, 1.5, dtype);
        const Tensor b = Tensor::random_uniform({cols}, 3, -1, 1, dtype);
        const Tensor dy = Tensor::random_uniform({rows, cols}, 4, -1, 1, dtype);
        Tensor y = Tensor::zeros({rows, cols}, dtype), mean = Tensor::zeros({rows}, dtype),
               rstd = Tensor::zeros({rows}, dtype);
        ops::layernorm_forward(x, w, b, y, mean, rstd, 1e-5);
        Tensor dx = Tensor::zeros({rows, cols}, dtype), dw = Tensor::zeros({cols}, dtype),
               db = Tensor::zeros({cols}, dtype);
        ops::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);

        Tensor dw_by_width[2], db_by_width[2];
        auto run = [&](auto width, int which) {
          constexpr int W = decltype(width)::value;
          const std::string what = std::string(dtype_name(dtype)) + " " + std::to_string(rows) +
                                   " x " + std::to_string(cols) + " W " + std::to_string(W);
          Tensor ky = Tensor::zeros({rows, cols}, dtype), km = Tensor::zeros({rows}, dtype),
                 kr = Tensor::zeros({rows}, dtype);
          const unsigned blocks = static_cast<unsigned>((rows + 7) / 8);
          emu::launch(dim3(blocks), dim3(256), 0, [&] {
            cuda::layernorm::forward_kernel<T, W>(ptr<T>(x), ptr<T>(w), ptr<T>(b), ptr<T>(ky),
                                                  ptr<T>(km), ptr<T>(kr), rows,
                                                  static_cast<int>(cols), 1e-5f);
          });
          expect_close(ky, y, "layernorm forward y " + what, cols);
          expect_close(km, mean, "layernorm forward mean " + what, 1);
          expect_close(kr, rstd, "layernorm forward rstd " + what, 1);
          // The backward from the CPU's statistics, so only its own arithmetic is compared.
          Tensor kdx = Tensor::zeros({rows, cols}, dtype);
          emu::launch(dim3(blocks), dim3(256), 0, [&] {
            cuda::layernorm::backward_kernel<T, W>(ptr<T>(dy), ptr<T>(x), ptr<T>(w), ptr<T>(mean),
                                                   ptr<T>(rstd), ptr<T>(kdx), rows,
                                                   static_cast<int>(cols));
          });
          expect_close(kdx, dx, "layernorm backward dx " + what, cols);
          // Two slices of rows (the second shorter), as many column blocks as W needs.
          const std::int64_t rows_per_slice = 6, slices = 2;
          const std::int64_t column_blocks = (cols + 32 * W - 1) / (32 * W);
          Tensor partial_dw = Tensor::zeros({slices * cols}, DType::f32),
                 partial_db = Tensor::zeros({slices * cols}, DType::f32);
          emu::launch(dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(slices)),
                      cuda::nn::RowSlices::block(), 0, [&] {
                        cuda::layernorm::param_partial_kernel<T, W>(
                            ptr<T>(dy), ptr<T>(x), ptr<T>(mean), ptr<T>(rstd),
                            ptr<float>(partial_dw), ptr<float>(partial_db), rows, cols,
                            rows_per_slice);
                      });
          Tensor kdw = Tensor::zeros({cols}, dtype), kdb = Tensor::zeros({cols}, dtype);
          emu::launch(dim3(2), dim3(64), 0, [&] {
            cuda::nn::add_column_partials_kernel<T>(ptr<float>(partial_dw), ptr<T>(kdw), slices,
                                                    cols);
            cuda::nn::add_column_partials_kernel<T>(ptr<float>(partial_db), ptr<T>(kdb), slices,
                                                    cols);
          });
          expect_close(kdw, dw, "layernorm backward dweight " + what, cols);
          expect_close(kdb, db, "layernorm backward dbias " + what, cols);
          dw_by_width[which] = kdw;
          db_by_width[which] = kdb;
        };
        run(std::integral_constant<int, kWidth<T>>{}, 0);
        run(std::integral_constant<int, 1>{}, 1);
        const std::string what = std::string(dtype_name(dtype)) + " cols " + std::to_string(cols);
        expect_same_bits(dw_by_width[0], dw_by_width[1], "layernorm dweight " + what);
        expect_same_bits(db_by_width[0], db_by_width[1], "layernorm dbias " + what);
      }
    });
}

TEST(EmulatedRowKernels, BiasGradientIsTheSameAtEveryWidthAndMatchesTheCpu) {
  for (DType dtype : kDtypes)
    with_element(dtype, [&](auto zero) {
      using T = decltype(zero);
      for (std::int64_t cols : kCols) {
        const std::int64_t rows = 13, rows_per_slice = 5, slices = 3;
        const Tensor dy = Tensor::random_uniform({rows, cols}, 5, -1, 1, dtype);
        const Tensor start =
            Tensor::random_uniform({cols}, 6, -1, 1, dtype);  // bias_backward accumulates
        Tensor want = start.clone();
        ops::bias_backward(dy, want);
        Tensor by_width[2];
        auto run = [&](auto width, int which) {
          constexpr int W = decltype(width)::value;
          Tensor partial = Tensor::zeros({slices * cols}, DType::f32), got = start.clone();
          emu::launch(dim3(static_cast<unsigned>((cols + 32 * W - 1) / (32 * W)),
                           static_cast<unsigned>(slices)),
                      cuda::nn::RowSlices::block(), 0, [&] {
                        cuda::elementwise::bias_partial_kernel<T, W>(
                            ptr<T>(dy), ptr<float>(partial), rows, cols, rows_per_slice);
                      });
          emu::launch(dim3(1), dim3(64), 0, [&] {
            cuda::nn::add_column_partials_kernel<T>(ptr<float>(partial), ptr<T>(got), slices, cols);
          });
          expect_close(got, want,
                       std::string("bias_backward ") + dtype_name(dtype) + " cols " +
                           std::to_string(cols) + " W " + std::to_string(W),
                       cols);
          by_width[which] = got;
        };
        run(std::integral_constant<int, kWidth<T>>{}, 0);
        run(std::integral_constant<int, 1>{}, 1);
        expect_same_bits(
            by_width[0], by_width[1],
            std::string("bias_backward ") + dtype_name(dtype) + " cols " + std::to_string(cols));
      }
    });
}

TEST(EmulatedRowKernels, CrossEntropyForwardAndBackwardMatchTheCpu) {
  for (DType dtype : kDtypes)
    with_element(dtype, [&](auto zero) {
      using T = decltype(zero);
      // Blocks of 64 threads, not the GPU launch's 512 (the kernels stride by
      // blockDim; fewer emulated threads keep the test fast): a vocabulary
      // shorter than the block, and one a chunk of 8 past 64 chunks of 8.
      const unsigned threads = 64;
      for (std::int64_t V : {std::int64_t{40}, std::int64_t{64 * 8 + 8}}) {
        const std::int64_t N = 2;
        const Tensor logits = Tensor::random_uniform({N, V}, 7, -4, 4, dtype);
        const Tensor targets = Tensor::from_values(
            {static_cast<double>(V - 1), static_cast<double>(V / 3)}, DType::i32);
        Tensor losses = Tensor::zeros({N}, dtype);
        ops::cross_entropy_forward(logits, targets, losses);
        Tensor dlogits = Tensor::zeros({N, V}, dtype);
        ops::cross_entropy_backward(logits, targets, 4.0, dlogits);
        auto run = [&](auto width, bool in_place) {
          constexpr int W = decltype(width)::value;
          const std::string what = std::string(dtype_name(dtype)) + " V " + std::to_string(V) +
                                   " W " + std::to_string(W);
          Tensor klosses = Tensor::zeros({N}, dtype), row_loss = Tensor::zeros({N}, DType::f64);
          emu::launch(dim3(static_cast<unsigned>(N)), dim3(threads), 0, [&] {
            cuda::cross_entropy::forward_kernel<T, W>(ptr<T>(logits), ptr<std::int32_t>(targets),
                                                      ptr<T>(klosses), ptr<double>(row_loss), V);
          });
          expect_close(klosses, losses, "cross-entropy losses " + what, 1);
          Tensor kd = Tensor::zeros({N, V}, dtype);
          emu::launch(dim3(static_cast<unsigned>(N)), dim3(threads), 0, [&] {
            cuda::cross_entropy::backward_kernel<T, W>(ptr<T>(logits), ptr<std::int32_t>(targets),
                                                       4.f, ptr<T>(kd), V);
          });
          expect_close(kd, dlogits, "cross-entropy dlogits " + what, V);
          if (!in_place) return;
          // In place, as the head's backward runs it: the gradient overwrites the logits.
          Tensor in_place_grad = logits.clone();
          emu::launch(dim3(static_cast<unsigned>(N)), dim3(threads), 0, [&] {
            cuda::cross_entropy::backward_kernel<T, W>(
                ptr<T>(in_place_grad), ptr<std::int32_t>(targets), 4.f, ptr<T>(in_place_grad), V);
          });
          expect_close(in_place_grad, dlogits, "cross-entropy dlogits in place " + what, V);
        };
        run(std::integral_constant<int, kWidth<T>>{}, true);
        run(std::integral_constant<int, 1>{}, false);
      }
    });
}

// The one-exponential running pair against the two-exponential merge, with
// the edge cases a row can hold.
TEST(EmulatedRowKernels, RunningMaxSumAddsLikeMerge) {
  const float inf = INFINITY;
  const std::vector<std::vector<float>> rows = {
      {1.f, 3.f, -2.f, 3.f, 0.5f}, {-inf, 2.f, -inf}, {-inf, -inf}, {50.f, -50.f, 49.f}};
  for (const auto& row : rows) {
    cuda::nn::MaxSum one{-inf, 0.f}, two{-inf, 0.f};
    for (float x : row) {
      cuda::nn::add_to(one, x);
      two = cuda::nn::merge(two, {x, 1.f});
    }
    EXPECT_EQ(one.m, two.m);
    EXPECT_NEAR(one.s, two.s, 1e-6f * two.s) << "row starting " << row[0];
  }
  cuda::nn::MaxSum nan_row{-inf, 0.f};
  for (float x : {1.f, std::nanf(""), 2.f}) cuda::nn::add_to(nan_row, x);
  EXPECT_TRUE(std::isnan(nan_row.s))
      << "a NaN logit must make the loss NaN (loss scaling looks for it)";
}

}  // namespace
}  // namespace dtp
