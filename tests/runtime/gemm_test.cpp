// The CPU matmul's fast path equals its definition bitwise (runtime/src/cpu/gemm.h):
// every shape class the blocking has edges for, both dtypes, every transpose,
// every vector instruction set this CPU runs, and 1, 2 and 3 compute threads.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <vector>

#include "cpu/gemm.h"
#include "dtp/error.h"
#include "dtp/parallel.h"

namespace dtp {
namespace {

template <typename T>
std::vector<T> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// C is M x N inside rows of ldc elements; the padding must come through untouched.
template <typename T>
void expect_fast_equals_definition(cpu::VectorIsa isa, std::int64_t M, std::int64_t N,
                                   std::int64_t K, bool ta, bool tb, T alpha, std::int64_t ldc,
                                   bool accumulate) {
  const auto A = random_values<T>(static_cast<std::size_t>(M * K), 1);
  const auto B = random_values<T>(static_cast<std::size_t>(K * N), 2);
  const auto C0 = random_values<T>(static_cast<std::size_t>(M * ldc), 3);  // += onto a nonzero C
  const cpu::Strides a = ta ? cpu::Strides{1, M} : cpu::Strides{K, 1};
  const cpu::Strides b = tb ? cpu::Strides{1, K} : cpu::Strides{N, 1};
  std::vector<T> want = C0, got = C0;
  cpu::gemm_definition(M, N, K, alpha, A.data(), a, B.data(), b,
                       cpu::Output<T>{want.data(), ldc, accumulate});
  cpu::gemm(M, N, K, alpha, A.data(), a, B.data(), b, cpu::Output<T>{got.data(), ldc, accumulate},
            isa);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const std::size_t e = static_cast<std::size_t>(i * ldc + j);
      ASSERT_EQ(std::memcmp(&want[e], &got[e], sizeof(T)), 0)
          << sizeof(T) * 8 << "-bit " << cpu::to_string(isa) << " gemm " << M << "x" << N << "x"
          << K << (ta ? " A^T" : "") << (tb ? " B^T" : "") << (accumulate ? " C +=" : " C =")
          << " ldc " << ldc << " with " << compute_threads() << " thread(s): C[" << i << ", " << j
          << "] is " << got[e]
          << (j < N ? " but the definition gives " : " but this padding element was ") << want[e];
    }
}

TEST(CpuGemm, FastPathEqualsTheDefinitionBitwise) {
  // Edges: rows not a multiple of 6, columns not a multiple of a tile's
  // width (4 to 32), K over one 256-tile.
  const std::int64_t shapes[][3] = {{1, 1, 1},     {5, 7, 3},    {6, 16, 256},   {7, 17, 257},
                                    {13, 33, 300}, {64, 64, 64}, {97, 130, 513}, {200, 9, 40}};
  for (cpu::VectorIsa isa : cpu::supported_isas())
    for (int threads : {1, 2, 3}) {
      set_compute_threads(threads);
      for (const auto& s : shapes)
        for (bool ta : {false, true})
          for (bool tb : {false, true}) {
            expect_fast_equals_definition<float>(isa, s[0], s[1], s[2], ta, tb, 0.5f, s[1], true);
            expect_fast_equals_definition<double>(isa, s[0], s[1], s[2], ta, tb, 1.0, s[1], true);
            // C = ..., into rows wider than N (attention writes a head's columns of [T, H * D])
            expect_fast_equals_definition<float>(isa, s[0], s[1], s[2], ta, tb, 0.5f, s[1] + 5,
                                                 false);
            expect_fast_equals_definition<double>(isa, s[0], s[1], s[2], ta, tb, 1.0, s[1] + 3,
                                                  false);
          }
    }
  set_compute_threads(default_compute_threads());
}

TEST(CpuGemm, TheFastestInstructionSetIsOneThisCpuRuns) {
  const std::vector<cpu::VectorIsa> isas = cpu::supported_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), cpu::VectorIsa::baseline) << "every CPU runs the baseline";
  EXPECT_EQ(cpu::fastest_isa(), isas.back())
      << "the default should be the widest supported set, " << cpu::to_string(isas.back());
}

TEST(CpuGemm, AnEmptySumLeavesCOrZeroesIt) {
  std::vector<float> C = {1, 2, 3};
  const float one = 1;
  cpu::gemm(1, 3, 0, 1.0f, &one, {1, 1}, &one, {3, 1}, cpu::Output<float>{C.data(), 3});
  EXPECT_EQ(C, (std::vector<float>{1, 2, 3})) << "C += (nothing) leaves C";
  cpu::gemm(1, 3, 0, 1.0f, &one, {1, 1}, &one, {3, 1}, cpu::Output<float>{C.data(), 3, false});
  EXPECT_EQ(C, (std::vector<float>{0, 0, 0})) << "C = (empty sum) is zero";
}

TEST(Parallel, EveryItemOnceAndExceptionsReachTheCaller) {
  set_compute_threads(3);
  std::vector<int> hits(1000, 0);
  parallel_for(1000, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) ++hits[static_cast<std::size_t>(i)];
  });
  for (std::size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "item " << i;
  EXPECT_THROW(parallel_for(1000, 1,
                            [&](std::int64_t begin, std::int64_t) {
                              if (begin > 0) throw std::runtime_error("a helper's part failed");
                            }),
               std::runtime_error);
  // The team still works after a failed loop.
  int total = 0;
  std::mutex mutex;
  parallel_for(10, 1, [&](std::int64_t begin, std::int64_t end) {
    std::lock_guard lock(mutex);
    total += static_cast<int>(end - begin);
  });
  EXPECT_EQ(total, 10);
  EXPECT_THROW(set_compute_threads(0), Error);
  set_compute_threads(default_compute_threads());
}

TEST(Parallel, ALoopInsideAPartRunsOnThatThreadAlone) {
  // Attention runs a matmul per (batch, head) pair inside a loop over pairs.
  set_compute_threads(2);
  std::mutex mutex;
  std::vector<int> hits(4 * 100, 0);
  std::vector<int> inner_threads;
  parallel_for(4, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t outer = begin; outer < end; ++outer) {
      {
        std::lock_guard lock(mutex);
        inner_threads.push_back(compute_threads());
      }
      parallel_for(100, 1, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) ++hits[static_cast<std::size_t>(outer * 100 + i)];
      });
    }
  });
  for (std::size_t i = 0; i < hits.size(); ++i)
    ASSERT_EQ(hits[i], 1) << "item " << i % 100 << " of outer item " << i / 100;
  for (int t : inner_threads) EXPECT_EQ(t, 1) << "a part's own loop must not start a second team";
  EXPECT_EQ(compute_threads(), 2) << "the caller's thread count comes back after the loop";
  set_compute_threads(default_compute_threads());
}

}  // namespace
}  // namespace dtp
