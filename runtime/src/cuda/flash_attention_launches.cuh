// Which flash attention kernels a call runs, in order, with their threads
// per block and shared memory. One place decides it for the CUDA launcher
// (nn_kernels_attention.cu) and the emulated tests, which pass the choice
// (KernelChoice) and their own way of launching:
//   f32, TF32 on (DTP_TF32)      the WMMA kernels in TF32
//   f32, TF32 off (DTP_TF32=0)   the exact f32 kernels (flash_attention_exact.cuh)
//   bf16/f16, heads up to 64     the mma.sync kernels (or WMMA when mma is false)
//   bf16/f16, wider heads        the WMMA kernels
// and dK/dV take one launch or two (dV, then dK) where one would spill.
// Every kernel's block owns kRows rows, so the grid is the same for all.
#pragma once

#include <cstddef>
#include <type_traits>

#include "cuda/flash_attention_exact.cuh"
#include "cuda/flash_attention_mma.cuh"
#include "cuda/flash_attention_tc.cuh"

namespace dtp::cuda::flash {

/// Tags for a backward kernel's blocks: one per kRows query rows (dQ) or key rows (dK, dV).
struct QueryBlocks {};
struct KeyBlocks {};

/// The kernels a call asks for where there is a choice.
struct KernelChoice {
  bool mma;   // bf16/f16 heads up to 64: the mma.sync kernels, else WMMA (DTP_FLASH_KERNEL)
  bool tf32;  // f32: the WMMA kernels in TF32, else the exact f32 kernels (DTP_TF32)
};

/// Calls launch(kernel, threads, shared_bytes) for the forward kernel.
template <typename T, int MAXD, typename Launch>
void forward_launches(KernelChoice choice, Launch&& launch) {
  if constexpr (std::is_same_v<T, float>) {
    if (!choice.tf32) return launch(forward_kernel_exact<MAXD>, kExactThreads, std::size_t{0});
  }
  if constexpr (!std::is_same_v<T, float> && kMmaHeadDim<MAXD>) {
    if (choice.mma)
      return launch(forward_kernel_mma<T, MAXD>, kThreads, shared_bytes<MmaShared<T, MAXD>>());
  }
  launch(forward_kernel<T, MAXD>, kThreads, shared_bytes<ForwardShared<T, MAXD>>());
}

/// Calls launch(kernel, threads, shared_bytes, QueryBlocks{}) for dQ, then
/// launch(kernel, threads, shared_bytes, KeyBlocks{}) for each dK/dV launch.
template <typename T, int MAXD, typename Launch>
void backward_launches(KernelChoice choice, Launch&& launch) {
  if constexpr (std::is_same_v<T, float>) {
    if (!choice.tf32) {
      launch(dq_kernel_exact<MAXD>, kExactThreads, std::size_t{0}, QueryBlocks{});
      for_each_key_grads_launch<kSplitKeyGrads<MAXD>>([&](auto which) {
        launch(dkv_kernel_exact<MAXD, decltype(which)::value>, kExactThreads, std::size_t{0},
               KeyBlocks{});
      });
      return;
    }
  }
  if constexpr (!std::is_same_v<T, float> && kMmaHeadDim<MAXD>) {
    if (choice.mma) {
      const std::size_t bytes = shared_bytes<MmaShared<T, MAXD>>();
      launch(dq_kernel_mma<T, MAXD>, kThreads, bytes, QueryBlocks{});
      for_each_key_grads_launch<kSplitKeyGradsMma<MAXD>>([&](auto which) {
        launch(dkv_kernel_mma<T, MAXD, decltype(which)::value>, kThreads, bytes, KeyBlocks{});
      });
      return;
    }
  }
  launch(dq_kernel<T, MAXD>, kThreads, shared_bytes<DqShared<T, MAXD>>(), QueryBlocks{});
  for_each_key_grads_launch<kSplitKeyGrads<MAXD>>([&](auto which) {
    launch(dkv_kernel<T, MAXD, decltype(which)::value>, kThreads,
           shared_bytes<DkvShared<T, MAXD>>(), KeyBlocks{});
  });
}

}  // namespace dtp::cuda::flash
