// The element-wise kernels of the nn ops: add/axpy, scale, casts, bias,
// GELU, and the optimizer updates on flat buffers. All are memory bound:
// one pass, coalesced, W elements per access (vectorized.cuh: W = 16 bytes'
// worth when the host found every pointer aligned, else 1). Each computes in
// f32 (the compute type) and rounds each stored value once, the CPU ops'
// contract; the vector and scalar instances do the same arithmetic.
//
// The host launchers are in nn_kernels_elementwise.cu and device_api.cu; the
// same source runs on the CPU under tests/emulated/cuda_emulator.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/reductions.cuh"
#include "cuda/vectorized.cuh"

namespace dtp::cuda::elementwise {

template <typename T>
using C = typename Compute<T>::type;

template <typename T, int W>
__global__ void add_kernel(const T* a, const T* b, T* out, std::int64_t n) {
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    C<T> x[V], y[V];
    vec::load<V>(a + i, x);
    vec::load<V>(b + i, y);
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] += y[k];
    vec::store<V>(out + i, x);
  });
}

template <typename T, int W>
__global__ void axpy_kernel(T* y, float alpha, const T* x, std::int64_t n) {
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    C<T> yv[V], xv[V];
    vec::load<V>(y + i, yv);
    vec::load<V>(x + i, xv);
#pragma unroll
    for (int k = 0; k < V; ++k) yv[k] = yv[k] + alpha * xv[k];
    vec::store<V>(y + i, yv);
  });
}

template <typename T, int W>
__global__ void scale_kernel(T* data, std::int64_t n, double factor) {
  const C<T> f = static_cast<C<T>>(factor);
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    C<T> v[V];
    vec::load<V>(data + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = v[k] * f;
    vec::store<V>(data + i, v);
  });
}

/// dst = src converted, through double like the CPU's cast: floats round to
/// nearest even, an i32 destination truncates. W counts elements of the
/// wider of the two types per access.
template <typename S, typename D, int W>
__global__ void cast_kernel(const S* src, D* dst, std::int64_t n) {
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    C<S> in[V];
    C<D> out[V];
    vec::load<V>(src + i, in);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = static_cast<C<D>>(static_cast<double>(in[k]));
    vec::store<V>(dst + i, out);
  });
}

/// *found = 1 when an element of x is an inf or a NaN.
template <typename T, int W>
__global__ void nonfinite_kernel(const T* x, std::int64_t n, int* found) {
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    C<T> v[V];
    vec::load<V>(x + i, v);
    bool finite = true;
#pragma unroll
    for (int k = 0; k < V; ++k) finite &= static_cast<bool>(isfinite(static_cast<double>(v[k])));
    if (!finite) *found = 1;  // benign race: every writer writes 1
  });
}

/// x[r, c] += bias[c]. With W > 1 the host has checked that C is a multiple
/// of W, so a chunk never crosses a row and its bias values are contiguous.
template <typename T, int W>
__global__ void add_bias_kernel(T* x, const T* bias, std::int64_t n, std::int64_t cols) {
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    C<T> v[V], b[V];
    vec::load<V>(x + i, v);
    vec::load<V>(bias + i % cols, b);
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] += b[k];
    vec::store<V>(x + i, v);
  });
}

// dbias[c] += sum over rows of dy[r, c], in two passes with a fixed order of
// additions (reductions.cuh: sums over rows), W columns per thread. Enough
// slices are made to fill the GPU: C = 768 with one thread per column gave
// 6 blocks.
template <typename T, int W>
__global__ void bias_partial_kernel(const T* dy, float* partial, std::int64_t rows, std::int64_t C,
                                    std::int64_t rows_per_slice) {
  __shared__ nn::SliceTile<W> tile;
  const std::int64_t c0 =
      (static_cast<std::int64_t>(blockIdx.x) * nn::kColumnBlock + threadIdx.x) * W;
  std::int64_t first, end;
  nn::slice_rows(rows, rows_per_slice, first, end);
  float acc[W] = {};
  if (c0 < C)
    for (std::int64_t r = first + threadIdx.y; r < end; r += nn::kRowThreads) {
      float g[W];
      vec::load<W>(dy + r * C + c0, g);
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] += g[k];
    }
#pragma unroll
  for (int k = 0; k < W; ++k) tile[threadIdx.y][threadIdx.x * W + k] = acc[k];
  nn::write_slice_partial<W>(tile, partial, c0, C);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// GELU, tanh approximation (GPT-2's).
template <typename T, int W>
__global__ void gelu_forward_kernel(const T* x, T* y, std::int64_t n) {
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    float v[V];
    vec::load<V>(x + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k)
      v[k] = 0.5f * v[k] * (1.f + tanhf(kGeluScale * (v[k] + kGeluCubic * v[k] * v[k] * v[k])));
    vec::store<V>(y + i, v);
  });
}

template <typename T, int W>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, std::int64_t n) {
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    float v[V], g[V];
    vec::load<V>(x + i, v);
    vec::load<V>(dy + i, g);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float t = tanhf(kGeluScale * (v[k] + kGeluCubic * v[k] * v[k] * v[k]));
      const float dt = (1.f - t * t) * kGeluScale * (1.f + 3.f * kGeluCubic * v[k] * v[k]);
      g[k] = g[k] * (0.5f * (1.f + t) + 0.5f * v[k] * dt);
    }
    vec::store<V>(dx + i, g);
  });
}

/// The scalars of one AdamW step, computed in double on the host like the CPU's.
struct AdamWScalars {
  float beta1, beta2, step_size, inv_sqrt_bias2, eps, decay;
};

template <typename T, int W>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, std::int64_t n, AdamWScalars s) {
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    float pv[V], gv[V], mv[V], vv[V];
    vec::load<V>(p + i, pv);
    vec::load<V>(g + i, gv);
    vec::load<V>(m + i, mv);
    vec::load<V>(v + i, vv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      mv[k] = s.beta1 * mv[k] + (1.f - s.beta1) * gv[k];
      vv[k] = s.beta2 * vv[k] + (1.f - s.beta2) * gv[k] * gv[k];
      const float denom = sqrtf(vv[k]) * s.inv_sqrt_bias2 + s.eps;
      pv[k] = pv[k] - (s.step_size * mv[k] / denom + s.decay * pv[k]);
    }
    vec::store<V>(m + i, mv);
    vec::store<V>(v + i, vv);
    vec::store<V>(p + i, pv);
  });
}

/// SGD with optional momentum (buf null: none) and Nesterov.
template <typename T, int W>
__global__ void sgd_kernel(T* p, const T* g, T* buf, std::int64_t n, float lr, float mu, float wd,
                           bool nesterov) {
  vec::for_each_chunk<W>(n, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    float pv[V], gv[V], bv[V];
    vec::load<V>(p + i, pv);
    vec::load<V>(g + i, gv);
    if (buf != nullptr) vec::load<V>(buf + i, bv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float grad = gv[k] + wd * pv[k];
      if (buf == nullptr) {
        pv[k] = pv[k] - lr * grad;
        continue;
      }
      bv[k] = mu * bv[k] + grad;
      pv[k] = pv[k] - lr * (nesterov ? grad + mu * bv[k] : bv[k]);
    }
    if (buf != nullptr) vec::store<V>(buf + i, bv);
    vec::store<V>(p + i, pv);
  });
}

}  // namespace dtp::cuda::elementwise
