// LayerNorm forward and backward. One warp owns one row (the GPT's rows are
// a few hundred to a few thousand wide): the statistics are warp shuffles,
// no shared memory, no block barrier. A lane reads chunks of W consecutive
// elements (vectorized.cuh: 16 bytes when the row width and the pointers
// allow it, else W = 1), chunk lane, lane + 32, ... of the row; re-reads of
// the row in the later passes hit L1.
//
// The weight and bias gradients are sums over rows, made in two passes with
// a fixed order of additions (reductions.cuh: sums over rows), in f32 and
// rounded once when stored: the same bits on every run.
//
// The host launchers are in nn_kernels_layernorm.cu; the same source runs on
// the CPU under tests/emulated/cuda_emulator.h.
#pragma once

#include <cstdint>

#include "cuda/reductions.cuh"
#include "cuda/vectorized.cuh"

namespace dtp::cuda::layernorm {

constexpr int kWarpsPerBlock = 8;

/// The warp's row, or -1 past the last.
__device__ __forceinline__ std::int64_t warp_row(std::int64_t rows) {
  const std::int64_t row =
      blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  return row < rows ? row : -1;
}

template <typename T, int W>
__global__ void forward_kernel(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd,
                               std::int64_t rows, int C, float eps) {
  const std::int64_t row = warp_row(rows);
  if (row < 0) return;
  const int lane = threadIdx.x % 32;
  const T* in = x + row * C;
  float sum = 0;
  for (int c = lane * W; c < C; c += 32 * W) {
    float v[W];
    vec::load<W>(in + c, v);
#pragma unroll
    for (int k = 0; k < W; ++k) sum += v[k];
  }
  const float m = nn::warp_sum(sum) / C;
  float var = 0;  // a second pass over the row (L1 hits): as stable as the CPU's
  for (int c = lane * W; c < C; c += 32 * W) {
    float v[W];
    vec::load<W>(in + c, v);
#pragma unroll
    for (int k = 0; k < W; ++k) var += (v[k] - m) * (v[k] - m);
  }
  const float r = rsqrtf(nn::warp_sum(var) / C + eps);
  T* out = y + row * C;
  for (int c = lane * W; c < C; c += 32 * W) {
    float v[W], wv[W], bv[W];
    vec::load<W>(in + c, v);
    vec::load<W>(w + c, wv);
    vec::load<W>(b + c, bv);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = (v[k] - m) * r * wv[k] + bv[k];
    vec::store<W>(out + c, v);
  }
  if (lane == 0) {
    store(mean, row, m);
    store(rstd, row, r);
  }
}

// dx = rstd * (dy w - mean(dy w) - xhat * mean(dy w xhat)): one warp per row.
template <typename T, int W>
__global__ void backward_kernel(const T* dy, const T* x, const T* w, const T* mean, const T* rstd,
                                T* dx, std::int64_t rows, int C) {
  const std::int64_t row = warp_row(rows);
  if (row < 0) return;
  const int lane = threadIdx.x % 32;
  const float m = load(mean, row), r = load(rstd, row);
  // Chunk c of the row: x, dy and w, with x as xhat.
  auto load_chunk = [&](int c, float(&xhat)[W], float(&g)[W], float(&wv)[W]) {
    vec::load<W>(x + row * C + c, xhat);
    vec::load<W>(dy + row * C + c, g);
    vec::load<W>(w + c, wv);
#pragma unroll
    for (int k = 0; k < W; ++k) xhat[k] = (xhat[k] - m) * r;
  };
  float mean_dxhat = 0, mean_dxhat_xhat = 0;
  for (int c = lane * W; c < C; c += 32 * W) {
    float xhat[W], g[W], wv[W];
    load_chunk(c, xhat, g, wv);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float dxhat = g[k] * wv[k];
      mean_dxhat += dxhat;
      mean_dxhat_xhat += dxhat * xhat[k];
    }
  }
  mean_dxhat = nn::warp_sum(mean_dxhat) / C;
  mean_dxhat_xhat = nn::warp_sum(mean_dxhat_xhat) / C;
  for (int c = lane * W; c < C; c += 32 * W) {
    float xhat[W], g[W], wv[W];
    load_chunk(c, xhat, g, wv);
#pragma unroll
    for (int k = 0; k < W; ++k)
      xhat[k] = r * (g[k] * wv[k] - mean_dxhat - xhat[k] * mean_dxhat_xhat);
    vec::store<W>(dx + row * C + c, xhat);
  }
}

// Pass 1 of the weight and bias gradients: this block's slice of rows,
// summed for its kColumnBlock x W columns, dw from dy xhat and db from dy.
// Block kColumnBlock x kRowThreads; the host checked C % W == 0.
template <typename T, int W>
__global__ void param_partial_kernel(const T* dy, const T* x, const T* mean, const T* rstd,
                                     float* partial_dw, float* partial_db, std::int64_t rows,
                                     std::int64_t C, std::int64_t rows_per_slice) {
  __shared__ nn::SliceTile<W> tile_dw;
  __shared__ nn::SliceTile<W> tile_db;
  const std::int64_t c0 =
      (static_cast<std::int64_t>(blockIdx.x) * nn::kColumnBlock + threadIdx.x) * W;
  std::int64_t first, end;
  nn::slice_rows(rows, rows_per_slice, first, end);
  float acc_dw[W] = {}, acc_db[W] = {};
  if (c0 < C)
    for (std::int64_t r = first + threadIdx.y; r < end; r += nn::kRowThreads) {
      float gv[W], xv[W];
      vec::load<W>(dy + r * C + c0, gv);
      vec::load<W>(x + r * C + c0, xv);
      const float m = load(mean, r), s = load(rstd, r);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        acc_dw[k] += gv[k] * (xv[k] - m) * s;
        acc_db[k] += gv[k];
      }
    }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    tile_dw[threadIdx.y][threadIdx.x * W + k] = acc_dw[k];
    tile_db[threadIdx.y][threadIdx.x * W + k] = acc_db[k];
  }
  nn::write_slice_partial<W>(tile_dw, partial_dw, c0, C);
  nn::write_slice_partial<W>(tile_db, partial_db, c0, C);
}

}  // namespace dtp::cuda::layernorm
