// Memory-bound kernels read and write 16 bytes per thread and access.
//
// Why: a warp of scalar bf16 loads asks for 64 bytes at a time, and an H100
// or H200 needs several megabytes in flight to reach its bandwidth; with
// 16-byte accesses each load brings 8 bf16 (or 4 f32) values, so the same
// threads keep 4-8 times more bytes in flight, and the kernel issues that
// many times fewer instructions per byte.
//
// How: a kernel is written once over "chunks" of W consecutive elements
// (W = 16 / sizeof(T), or 1). The host picks W: the vector width when every
// pointer the kernel touches is aligned to W elements (views into a flat
// parameter buffer may start anywhere), else 1, the scalar path. An
// element-wise kernel does exactly the same arithmetic per element at either
// width, so its two instances store the same bits (the emulated tests check
// it); a kernel that sums along a row adds in another order at the vector
// width, within rounding.
// for_each_chunk runs the n / W whole chunks over a grid-stride loop and the
// n % W elements left at the end one per thread, with W = 1.
//
// The same source runs on the CPU under tests/emulated/cuda_emulator.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/element_types.cuh"

namespace dtp::cuda::vec {

/// Elements of T in one 16-byte access.
template <typename T>
constexpr int kWidth = 16 / static_cast<int>(sizeof(T));

/// A chunk width as a type, so a kernel's body is instantiated for both
/// the vector width and the scalar tail.
template <int W>
using Width = std::integral_constant<int, W>;

/// W consecutive elements at p (aligned to W elements), as float (or the
/// compute type): one access of W * sizeof(T) bytes.
template <int W, typename T, typename C = typename Compute<T>::type>
__device__ __forceinline__ void load(const T* p, C (&out)[W]) {
  struct alignas(W * sizeof(T)) Chunk {
    T v[W];
  };
  Chunk c;
#ifdef DTP_CUDA_EMULATION
  std::memcpy(&c, p, sizeof c);  // no type punning on the host compiler
#else
  c = *reinterpret_cast<const Chunk*>(p);
#endif
#pragma unroll
  for (int k = 0; k < W; ++k) out[k] = static_cast<C>(c.v[k]);
}

/// Rounds W values to T (nearest even) and stores them at p in one access.
template <int W, typename T, typename C = typename Compute<T>::type>
__device__ __forceinline__ void store(T* p, const C (&in)[W]) {
  struct alignas(W * sizeof(T)) Chunk {
    T v[W];
  };
  Chunk c;
#pragma unroll
  for (int k = 0; k < W; ++k) c.v[k] = to_storage<T>(in[k]);
#ifdef DTP_CUDA_EMULATION
  std::memcpy(p, &c, sizeof c);
#else
  *reinterpret_cast<Chunk*>(p) = c;
#endif
}

/// Calls body(Width<W>{}, i) for the first element i of every whole chunk of
/// W elements in [0, n), grid-stride, then body(Width<1>{}, i) for each of
/// the n % W elements after them.
template <int W, typename Body>
__device__ __forceinline__ void for_each_chunk(std::int64_t n, Body&& body) {
  const std::int64_t threads = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t me = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t chunks = n / W;
  for (std::int64_t c = me; c < chunks; c += threads) body(Width<W>{}, c * W);
  if constexpr (W > 1) {
    const std::int64_t tail = chunks * W + me;
    if (tail < n) body(Width<1>{}, tail);  // fewer than W elements: one thread each
  }
}

}  // namespace dtp::cuda::vec

namespace dtp::cuda {

/// True when every pointer is aligned to @p width elements of its type
/// (host side: decides between a kernel's vector and scalar instances).
template <typename... P>
bool all_aligned(int width, const P*... pointers) {
  return ((reinterpret_cast<std::uintptr_t>(pointers) % (width * sizeof(P)) == 0) && ...);
}

/// Calls fn(vec::Width<W>{}) with W = vec::kWidth<T> when every pointer is
/// aligned to it, else with W = 1.
template <typename T, typename Fn, typename... P>
void with_width(Fn&& fn, const P*... pointers) {
  if (all_aligned(vec::kWidth<T>, pointers...))
    fn(vec::Width<vec::kWidth<T>>{});
  else
    fn(vec::Width<1>{});
}

/// with_width for an element-wise kernel over @p n elements: calls
/// launch(vec::Width<W>{}, blocks) with the grid that covers n / W chunks.
template <typename T, typename Launch, typename... P>
void launch_elementwise(std::int64_t n, Launch&& launch, const P*... pointers) {
  with_width<T>([&](auto width) { launch(width, blocks_for((n + width - 1) / width)); },
                pointers...);
}

/// with_width for kernels that walk rows of @p cols elements in chunks: the
/// vector width only when it also divides the row, so no chunk crosses a row
/// and every row starts aligned.
template <typename T, typename Fn, typename... P>
void with_row_width(std::int64_t cols, Fn&& fn, const P*... pointers) {
  if (cols % vec::kWidth<T> == 0 && all_aligned(vec::kWidth<T>, pointers...))
    fn(vec::Width<vec::kWidth<T>>{});
  else
    fn(vec::Width<1>{});
}

}  // namespace dtp::cuda
