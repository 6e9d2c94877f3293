// The mma.sync layout check's matrices: A is 16 x 64; K and V are 64 x 64.
// Shared by its kernel (mma_layout_kernel.cuh) and its expected values
// (mma_layout_case.h), which cannot include each other (device code; gtest).
#pragma once

namespace dtp::testing {
constexpr int kLayoutRows = 16, kLayoutWidth = 64;
}  // namespace dtp::testing
