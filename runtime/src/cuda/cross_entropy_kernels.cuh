// Softmax cross-entropy, fused (llm.c style): one block per row computes the
// row's max and sum of exponentials in a single online pass (one exponential
// per logit, W logits per 16-byte load where the vocabulary and the pointers
// allow, vectorized.cuh); the forward writes only the loss, the backward
// overwrites the row with its gradient (in place when dlogits aliases
// logits). Probabilities never reach memory.
//
// The host launchers are in nn_kernels_cross_entropy.cu; the same source
// runs on the CPU under tests/emulated/cuda_emulator.h.
#pragma once

#include <cstdint>

#include "cuda/reductions.cuh"
#include "cuda/vectorized.cuh"

namespace dtp::cuda::cross_entropy {

constexpr int kThreads = 512;

/// log(sum(exp(row))) of one row of V logits; every thread of the block gets it.
template <typename T, int W>
__device__ __forceinline__ float row_logsumexp(const T* row, std::int64_t V, nn::MaxSum* shared) {
  nn::MaxSum ms{-INFINITY, 0.f};
  for (std::int64_t c = threadIdx.x * W; c < V; c += static_cast<std::int64_t>(blockDim.x) * W) {
    float x[W];
    vec::load<W>(row + c, x);
#pragma unroll
    for (int k = 0; k < W; ++k) nn::add_to(ms, x[k]);
  }
  ms = nn::block_merge(ms, shared);
  return ms.m + logf(ms.s);
}

/// Each row's loss goes to row_loss (f32 values in f64: the mean is summed in
/// f64 like the CPU's, in a fixed order by sum_in_order) and, rounded, to
/// losses (when not null).
template <typename T, int W>
__global__ void forward_kernel(const T* logits, const std::int32_t* targets, T* losses,
                               double* row_loss, std::int64_t V) {
  __shared__ nn::MaxSum shared[32];
  const T* row = logits + blockIdx.x * V;
  const float lse = row_logsumexp<T, W>(row, V, shared);
  if (threadIdx.x == 0) {
    const float loss = lse - load(row, targets[blockIdx.x]);
    if (losses != nullptr) store(losses, blockIdx.x, loss);
    row_loss[blockIdx.x] = static_cast<double>(loss);
  }
}

/// dlogits = scale (softmax(row) - onehot(target)).
template <typename T, int W>
__global__ void backward_kernel(const T* logits, const std::int32_t* targets, float scale,
                                T* dlogits, std::int64_t V) {
  __shared__ nn::MaxSum shared[32];
  const T* row = logits + blockIdx.x * V;
  T* grad = dlogits + blockIdx.x * V;  // may be the same memory as row
  const float lse = row_logsumexp<T, W>(row, V, shared);
  const std::int32_t target = targets[blockIdx.x];
  for (std::int64_t c = threadIdx.x * W; c < V; c += static_cast<std::int64_t>(blockDim.x) * W) {
    float g[W];
    vec::load<W>(row + c, g);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      g[k] = expf(g[k] - lse) * scale;
      if (c + k == target) g[k] -= scale;
    }
    vec::store<W>(grad + c, g);
  }
}

}  // namespace dtp::cuda::cross_entropy
