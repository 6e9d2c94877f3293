// Device-side reductions shared by the nn kernels: warp and block sums and
// maxima, the online-softmax pair, and the two-pass column sums over rows in
// a fixed order. Nothing here touches the host API, so the same source runs
// on the CPU under tests/emulated/cuda_emulator.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/element_types.cuh"

namespace dtp::cuda::nn {

// --- reductions ---------------------------------------------------------------

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
/// thread gets the result. @p shared holds 32 elements.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : A(0);
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// --- sums over rows, column by column, in a fixed order ------------------------
//
// A parameter gradient that sums over the rows of an activation (a bias, a
// LayerNorm weight) is made in two passes with a fixed order of additions,
// no atomics: the same bits on every run. Pass 1: block (x, y) sums the rows
// of slice y for kColumnBlock x W columns; its kColumnBlock x kRowThreads
// threads read consecutive chunks of W columns of a row (one coalesced line
// per warp; W = 16 bytes' worth when C and the pointers allow, else 1) and
// their row-partials meet in shared memory in a fixed order. Each column's
// additions are the same whatever W is. Pass 2
// (add_column_partials_kernel): per column, the slices' partials in slice
// order, added into the gradient.
constexpr int kColumnBlock = 32, kRowThreads = 8;

/// How the rows are cut: `slices` slices of `rows_per_slice` rows, each
/// summed by `column_blocks` blocks of kColumnBlock columns (times the
/// kernel's vector width). row_slices() (nn_kernels_common.cuh) picks them.
struct RowSlices {
  std::int64_t column_blocks = 0, slices = 0, rows_per_slice = 0;
  dim3 grid() const {
    return dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(slices));
  }
  static dim3 block() { return dim3(kColumnBlock, kRowThreads); }
};

/// The row range [first, end) of this block's slice.
__device__ __forceinline__ void slice_rows(std::int64_t rows, std::int64_t rows_per_slice,
                                           std::int64_t& first, std::int64_t& end) {
  first = static_cast<std::int64_t>(blockIdx.y) * rows_per_slice;
  end = first + rows_per_slice < rows ? first + rows_per_slice : rows;
}

/// The shared tile of a slice's row-partials: kRowThreads rows of the
/// block's kColumnBlock x W columns (W columns per thread), padded.
template <int W>
using SliceTile = float[kRowThreads][kColumnBlock * W + 1];

/// Adds the kRowThreads partials of the thread's W columns c0 .. c0 + W - 1
/// in @p tile (column c0 + j at tile[k][threadIdx.x * W + j]) in row-thread
/// order and writes the slice's partials of those below C.
template <int W>
__device__ __forceinline__ void write_slice_partial(SliceTile<W>& tile, float* partial,
                                                    std::int64_t c0, std::int64_t C) {
  __syncthreads();
  if (threadIdx.y != 0) return;
#pragma unroll
  for (int j = 0; j < W; ++j) {
    if (c0 + j >= C) return;
    float sum = 0;
    for (int k = 0; k < kRowThreads; ++k) sum += tile[k][threadIdx.x * W + j];
    partial[blockIdx.y * C + c0 + j] = sum;
  }
}

/// Pass 2: out[c] += the slices' partials of column c, in slice order
/// (computed in f32, rounded once when stored).
template <typename T>
__global__ void add_column_partials_kernel(const float* partial, T* out, std::int64_t slices,
                                           std::int64_t C) {
  for (std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0;
    for (std::int64_t s = 0; s < slices; ++s) sum += partial[s * C + c];
    store(out, c, load(out, c) + sum);
  }
}

/// Online-softmax pair (running max m, sum of exp(x - m)) and its merge.
struct MaxSum {
  float m;
  float s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
/// Adds one value x to a running pair with a single exponential (merge()
/// of {x, 1} takes two). A NaN makes the sum NaN; -inf adds nothing.
__device__ __forceinline__ void add_to(MaxSum& ms, float x) {
  if (x > ms.m) {
    ms.s = ms.s * expf(ms.m - x) + 1.f;  // ms.m = -inf at the start: expf(-inf) = 0
    ms.m = x;
  } else {
    ms.s += x == -INFINITY ? 0.f : expf(x - ms.m);
  }
}
__device__ __forceinline__ MaxSum warp_merge(MaxSum v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum o{__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)};
    v = merge(v, o);
  }
  return v;
}
/// Block-wide online-softmax merge; every thread gets the result. @p shared
/// holds 32 pairs.
__device__ __forceinline__ MaxSum block_merge(MaxSum v, MaxSum* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_merge(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : MaxSum{-INFINITY, 0.f};
  return warp_merge(v);
}

}  // namespace dtp::cuda::nn
