// The mma.sync flash kernels' building blocks on a GPU against a plain
// matrix product, exactly (mma_layout_kernel.cuh, mma_layout_case.h). This
// tests the PTX ISA fragment layout those kernels and the emulator assume:
// if the flash attention checks fail on a GPU and this passes, the layouts
// are right and the fault is in the attention; if this fails, it names the
// first wrong element. Skips without a GPU; fails instead under DTP_REQUIRE_GPU=1.
#include <gtest/gtest.h>

#include "support/harness.h"

#if DTP_HAVE_CUDA
#include "gpu/mma_layout_case.h"
#include "gpu/mma_layout_check.h"

namespace dtp::testing {
namespace {

TEST(CudaMmaLayout, TheFlashBuildingBlocksMultiplyExactly) {
  DTP_REQUIRE_GPU();
  const MmaLayoutCase c = mma_layout_case();
  for (bool bf16 : {true, false}) {
    const char* type = bf16 ? "bf16" : "f16";
    std::vector<float> scores, out;
    run_mma_layout_check(bf16, c.a, c.keys, c.values, scores, out);
    expect_layout_result(scores, c.scores, std::string("S = A K^T (") + type + ")");
    expect_layout_result(out, c.out, std::string("O = S V (") + type + ")");
  }
}

}  // namespace
}  // namespace dtp::testing
#endif
