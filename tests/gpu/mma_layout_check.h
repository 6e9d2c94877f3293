// Runs the mma.sync layout check (mma_layout_kernel.cuh) on the GPU: inputs
// rounded to bf16 (or f16), S and O back as f32. Throws dtp::Error on a CUDA error.
#pragma once

#include <vector>

namespace dtp::testing {

void run_mma_layout_check(bool bf16, const std::vector<float>& a, const std::vector<float>& keys,
                          const std::vector<float>& values, std::vector<float>& scores,
                          std::vector<float>& out);

}  // namespace dtp::testing
