// Internal: argument checks, dtype dispatch and block reductions shared by the
// nn kernels (nn_kernels_*.cu).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "cpu/nn_ops_common.h"  // check_shape, check_numel, last_dim (device-agnostic)
#include "cuda/cuda_check.h"
#include "cuda/device_api.h"
#include "cuda/element_types.cuh"
#include "cuda/nn_kernels.h"

namespace dtp::cuda::nn {

/// The calling rank's stream.
inline cudaStream_t stream() { return static_cast<cudaStream_t>(current_stream()); }

/// Fails unless @p t is defined and on a GPU (and on @p device when given).
inline void check_gpu(const char* op, const char* name, const Tensor& t) {
  DTP_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
  DTP_CHECK(t.device().is_cuda(), op, ": ", name, " is ", t.describe(),
            " but the other inputs are on a GPU (move it with .to(device) first)");
}
inline void check_same_gpu(const char* op, const char* name, const Tensor& t, Device device) {
  check_gpu(op, name, t);
  DTP_CHECK(t.device() == device, op, ": ", name, " is ", t.describe(), " but must be on ",
            device.str(), " like the other inputs");
}

/// The floating dtypes the CUDA nn kernels accept: f32, and bf16 and f16
/// under the CPU ops' contract (read as f32, compute in f32, round each
/// stored output to nearest even). f64 stays on the CPU: the GPU's f64 rate
/// is a fraction of its f32 rate, and the f64 checks are the CPU's job.
inline bool cuda_float_supported(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

/// Fails unless @p t is a floating GPU tensor of a supported dtype on @p device.
inline void check_float(const char* op, const char* name, const Tensor& t, Device device) {
  check_same_gpu(op, name, t, device);
  DTP_CHECK(cuda_float_supported(t.dtype()), op, ": ", name, " is ", t.describe(),
            "; the CUDA kernels support f32, bf16 and f16 (f64 runs on the CPU; cast first)");
}

/// Fails unless @p t is a supported floating GPU tensor on @p like's device
/// with @p like's dtype: an op's second and later operands.
inline void check_same(const char* op, const char* name, const Tensor& t, const Tensor& like) {
  check_float(op, name, t, like.device());
  detail::check_dtype_is(op, name, t, like.dtype());
}

/// Makes @p device current for the calling thread (kernels launch there).
inline void use_device(Device device) { DTP_CUDA_CHECK(cudaSetDevice(device.index)); }

/// Calls fn(T{}) with T the device storage type of @p dtype (checked by
/// check_float): every kernel is instantiated for f32, bf16 and f16, and
/// reads and writes its elements through load() and store() (Compute<T>).
template <typename Fn>
void with_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: fn(float{}); break;
    case DType::bf16: fn(__nv_bfloat16{}); break;
    case DType::f16: fn(__half{}); break;
    default: throw Error(std::string("CUDA nn kernels: unsupported dtype ") + dtype_name(dtype));
  }
}

/// Raises the error of the last launch, if any.
inline void check_launch() { DTP_CUDA_CHECK(cudaGetLastError()); }

template <typename T>
inline T* ptr(Tensor& t) {
  return static_cast<T*>(t.raw());
}
template <typename T>
inline const T* ptr(const Tensor& t) {
  return static_cast<const T*>(t.raw());
}

/// Where a kernel adds many terms into a gradient with atomics: @p target
/// itself when it is f32, else an f32 copy of it, rounded back into it once
/// by finish(). A 16-bit gradient summed in 16 bits would be rounded at every
/// addition; the CPU ops sum in f32 and round once.
class SumsInF32 {
 public:
  explicit SumsInF32(Tensor& target)
      : target_(target),
        sums_(target.dtype() == DType::f32
                  ? target
                  : Tensor::empty(target.shape(), DType::f32, target.device(), MemoryCategory::other)) {
    if (!sums_.shares_storage_with(target_)) cast(target_, sums_);
  }
  float* data() { return ptr<float>(sums_); }
  /// Rounds the sums into the 16-bit target (to nearest even); nothing for f32.
  void finish() {
    if (!sums_.shares_storage_with(target_)) cast(sums_, target_);
  }

 private:
  Tensor& target_;
  Tensor sums_;
};

/// Rows of the matrix view of @p t with @p cols columns.
inline std::int64_t rows_of(const Tensor& t, std::int64_t cols) { return cols == 0 ? 0 : t.numel() / cols; }

inline unsigned grid_for(std::int64_t count, int threads = 256) { return blocks_for(count, threads); }

/// The current GPU's streaming multiprocessors (a cheap query: no synchronization).
inline int multiprocessor_count() {
  int device = 0, count = 0;
  DTP_CUDA_CHECK(cudaGetDevice(&device));
  DTP_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// --- reductions ---------------------------------------------------------------

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
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
