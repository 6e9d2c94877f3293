// One pass over memory: for each tile of this rank's chunk, sum the tile of
// every buffer in a small cache-resident accumulator, then store it into
// every buffer. Each element of each buffer is read once and written once
// (2 S bytes per rank for S bytes of chunks) instead of the 2 S per peer of
// accumulating one buffer at a time.
#include "cpu/reduce_into_all.h"

#include <algorithm>
#include <array>

#include "cpu/element.h"

namespace dtp::cpu {

namespace {
// Elements per tile: a 64 KiB f32 accumulator, in L2. Long tiles keep each
// buffer's reads and writes in long sequential runs the prefetcher follows:
// 2048 (L1-sized) reached 56-76% of the memcpy roofline at 2 ranks on the
// 2-core CI machine, 16384 84-101% (64 MiB, interleaved runs).
constexpr std::int64_t kTile = 16384;

template <typename T>
void reduce_tiles(const std::vector<void*>& buffers, std::int64_t offset, std::int64_t length,
                  ReduceOp op) {
  using C = detail::compute_t<T>;
  const int n = static_cast<int>(buffers.size());
  const C scale = op == ReduceOp::avg ? static_cast<C>(1.0 / n) : C(1);
  std::array<C, kTile> acc;
  for (std::int64_t start = offset; start < offset + length; start += kTile) {
    const std::int64_t count = std::min(kTile, offset + length - start);
    const T* first = static_cast<const T*>(buffers[0]) + start;
    for (std::int64_t i = 0; i < count; ++i) acc[i] = static_cast<C>(detail::to_double(first[i]));
    for (int r = 1; r < n; ++r) {
      const T* __restrict in = static_cast<const T*>(buffers[r]) + start;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          for (std::int64_t i = 0; i < count; ++i)
            acc[i] += static_cast<C>(detail::to_double(in[i]));
          break;
        case ReduceOp::max:
          for (std::int64_t i = 0; i < count; ++i)
            acc[i] = std::max(acc[i], static_cast<C>(detail::to_double(in[i])));
          break;
        case ReduceOp::min:
          for (std::int64_t i = 0; i < count; ++i)
            acc[i] = std::min(acc[i], static_cast<C>(detail::to_double(in[i])));
          break;
      }
    }
    if (op == ReduceOp::avg)
      for (std::int64_t i = 0; i < count; ++i) acc[i] *= scale;
    for (int r = 0; r < n; ++r) {
      T* __restrict out = static_cast<T*>(buffers[r]) + start;
      for (std::int64_t i = 0; i < count; ++i) out[i] = detail::from_double<T>(acc[i]);
    }
  }
}
}  // namespace

void reduce_into_all(const std::vector<void*>& buffers, std::int64_t offset, std::int64_t length,
                     DType dtype, ReduceOp op) {
  detail::with_element(
      dtype, [&](auto zero) { reduce_tiles<decltype(zero)>(buffers, offset, length, op); });
}

}  // namespace dtp::cpu
