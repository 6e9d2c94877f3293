// The mma.sync layout check (tests/gpu/mma_layout_kernel.cuh) under the
// emulator: the flash kernels' operand loaders and accumulator reuse against
// a plain matrix product, exactly. tests/gpu/mma_layout_test.cpp runs the
// same kernel on a GPU, where it tests the PTX ISA layout the emulator assumes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "emulated/cuda_emulator.h"  // first: it defines the CUDA keywords for the kernel

#include "gpu/mma_layout_case.h"
#include "gpu/mma_layout_kernel.cuh"

namespace dtp::testing {
namespace {

template <typename T>
void run_and_check(const char* type) {
  const MmaLayoutCase c = mma_layout_case();
  auto to16 = [](const std::vector<float>& v) {
    std::vector<T> out;
    for (float x : v) out.push_back(cuda::flash::Mma<T>::operand(x));
    return out;
  };
  const std::vector<T> a = to16(c.a), keys = to16(c.keys), values = to16(c.values);
  std::vector<float> scores(c.scores.size(), -1.f), out(c.out.size(), -1.f);
  emu::launch(dim3(1), dim3(cuda::flash::kThreads),
              cuda::flash::shared_bytes<cuda::flash::MmaShared<T, kLayoutWidth>>(), [&] {
                mma_layout_kernel<T>(a.data(), keys.data(), values.data(), scores.data(),
                                     out.data());
              });
  expect_layout_result(scores, c.scores, std::string("S = A K^T (") + type + ")");
  expect_layout_result(out, c.out, std::string("O = S V (") + type + ")");
}

TEST(EmulatedMmaLayout, TheFlashBuildingBlocksMultiplyExactly) {
  run_and_check<__nv_bfloat16>("bf16");
  run_and_check<__half>("f16");
}

}  // namespace
}  // namespace dtp::testing
