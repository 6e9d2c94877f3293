// One warp runs the building blocks of the mma.sync flash kernels
// (runtime/src/cuda/flash_attention_mma.cuh) on plain matrices:
//   S = A K^T   (load_a, load_b_transposed, mma_16816: warp_scores)
//   O = S V     (S's accumulators as the A operand, load_b: warp_accumulate)
// with A 16 x 64 and K, V 64 x 64, row-major in global memory, and writes S
// and O by the accumulator layout. If the flash kernels fail on a GPU, this
// says whether the fragment layouts are the cause. Compiled by nvcc for the
// GPU check (mma_layout_check.cu) and by g++ under the emulator.
#pragma once

#include "cuda/flash_attention_mma.cuh"
#include "gpu/mma_layout_shape.h"

namespace dtp::testing {

template <typename T>
__global__ void mma_layout_kernel(const T* a, const T* keys, const T* values, float* scores,
                                  float* out) {
  namespace flash = cuda::flash;
  constexpr int W = kLayoutWidth;
  DTP_DYNAMIC_SHARED(float, smem);
  const flash::MmaShared<T, W> sh(smem);
  flash::stage_rows<T, W>(sh.own0, a, W, 0, kLayoutRows, W, flash::kRows);  // rows past 16 are zero
  flash::stage_rows<T, W>(sh.other0, keys, W, 0, W, W, flash::kCols);
  flash::stage_rows<T, W>(sh.other1, values, W, 0, W, W, flash::kCols);
  __syncthreads();
  if (threadIdx.x >= 32) return;  // one warp
  const flash::Lane l = flash::this_lane();
  float s[flash::kCols / 8][4], o[W / 8][4];
  flash::warp_scores<T, W>(s, sh.own0, sh.other0, l);
  flash::zero(o);
  flash::warp_accumulate<T, W>(o, s, sh.other1, l);
  for (int n = 0; n < W / 8; ++n)
    for (int e = 0; e < 4; ++e) {
      const int row = l.g + 8 * (e / 2), col = n * 8 + 2 * l.t + e % 2;  // the accumulator layout
      scores[row * W + col] = s[n][e];
      out[row * W + col] = o[n][e];
    }
}

}  // namespace dtp::testing
