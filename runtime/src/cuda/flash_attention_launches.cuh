// Which flash attention kernels a call runs, in order, with their shared
// memory. One place decides it for the CUDA launcher (nn_kernels_attention.cu)
// and the emulated test, which pass their own way of launching:
//   f32                          the WMMA kernels in TF32
//   bf16/f16, heads up to 64     the mma.sync kernels (or WMMA when mma is false)
//   bf16/f16, wider heads        the WMMA kernels
// and dK/dV take one launch or two (dV, then dK) where one would spill.
#pragma once

#include <cstddef>
#include <type_traits>

#include "cuda/flash_attention_mma.cuh"
#include "cuda/flash_attention_tc.cuh"

namespace dtp::cuda::flash {

/// Tags for a backward kernel's blocks: one per kRows query rows (dQ) or key rows (dK, dV).
struct QueryBlocks {};
struct KeyBlocks {};

/// Calls launch(kernel, shared_bytes) for the forward kernel.
template <typename T, int MAXD, typename Launch>
void forward_launches(bool mma, Launch&& launch) {
  if constexpr (!std::is_same_v<T, float> && kMmaHeadDim<MAXD>) {
    if (mma) return launch(forward_kernel_mma<T, MAXD>, shared_bytes<MmaShared<T, MAXD>>());
  }
  launch(forward_kernel<T, MAXD>, shared_bytes<ForwardShared<T, MAXD>>());
}

/// Calls launch(kernel, shared_bytes, QueryBlocks{}) for dQ, then
/// launch(kernel, shared_bytes, KeyBlocks{}) for each dK/dV launch.
template <typename T, int MAXD, typename Launch>
void backward_launches(bool mma, Launch&& launch) {
  if constexpr (!std::is_same_v<T, float> && kMmaHeadDim<MAXD>) {
    if (mma) {
      const std::size_t bytes = shared_bytes<MmaShared<T, MAXD>>();
      launch(dq_kernel_mma<T, MAXD>, bytes, QueryBlocks{});
      for_each_key_grads_launch<kSplitKeyGradsMma<MAXD>>([&](auto which) {
        launch(dkv_kernel_mma<T, MAXD, decltype(which)::value>, bytes, KeyBlocks{});
      });
      return;
    }
  }
  launch(dq_kernel<T, MAXD>, shared_bytes<DqShared<T, MAXD>>(), QueryBlocks{});
  for_each_key_grads_launch<kSplitKeyGrads<MAXD>>([&](auto which) {
    launch(dkv_kernel<T, MAXD, decltype(which)::value>, shared_bytes<DkvShared<T, MAXD>>(),
           KeyBlocks{});
  });
}

}  // namespace dtp::cuda::flash
