// Internal: argument checks, dtype dispatch and block reductions shared by the
// nn kernels (nn_kernels_*.cu).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
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

/// table[id - first_id] += the rows of @p dout (one per id of @p ids) with
/// that id, added in position order in f32 and stored once; ids outside the
/// table's rows are skipped. The same bits on every run (nn_kernels_embedding.cu).
void add_rows_by_id(const Tensor& ids, const Tensor& dout, std::int64_t first_id, Tensor& table);

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

/// *total = the sum of parts[0, count), in an order fixed by count alone
/// (one block: each thread its strided share, then a fixed reduction tree).
/// Partial sums that many blocks added with atomics would come out in the
/// order the blocks finish, and differ in their last bits from run to run.
/// (A template, so that every file including this one may launch it.)
template <int Threads>
__global__ void sum_in_order_kernel(const double* parts, std::int64_t count, double* total) {
  __shared__ double shared[32];
  double acc = 0;
  for (std::int64_t i = threadIdx.x; i < count; i += Threads) acc += parts[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *total = acc;
}

/// The sum of the f64 tensor @p parts, in a fixed order (waits for the stream).
inline double sum_in_order(const Tensor& parts) {
  Tensor total = Tensor::zeros({1}, DType::f64, parts.device());
  if (parts.numel() > 0) {
    sum_in_order_kernel<256><<<1, 256, 0, stream()>>>(ptr<double>(parts), parts.numel(), ptr<double>(total));
    check_launch();
  }
  return total.item(0);
}

// --- sums over rows, column by column, in a fixed order ------------------------
//
// A parameter gradient that sums over the rows of an activation (a bias, a
// LayerNorm weight) is made in two passes with a fixed order of additions,
// no atomics: the same bits on every run. Pass 1: block (x, y) sums the rows
// of slice y for kColumnBlock columns; its kColumnBlock x kRowThreads threads
// read consecutive columns of a row (one coalesced line per warp) and their
// row-partials meet in shared memory in a fixed order. Pass 2
// (add_column_partials_kernel): per column, the slices' partials in slice
// order, added into the gradient.
constexpr int kColumnBlock = 32, kRowThreads = 8;

struct RowSlices {
  std::int64_t column_blocks = 0, slices = 0, rows_per_slice = 0;
  dim3 grid() const { return dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(slices)); }
  static dim3 block() { return dim3(kColumnBlock, kRowThreads); }
};

/// Enough slices for about four blocks per SM, each at least kRowThreads rows.
inline RowSlices row_slices(std::int64_t rows, std::int64_t C) {
  RowSlices s;
  s.column_blocks = (C + kColumnBlock - 1) / kColumnBlock;
  const std::int64_t wanted = (4 * multiprocessor_count() + s.column_blocks - 1) / s.column_blocks;
  const std::int64_t most = std::max<std::int64_t>(1, (rows + kRowThreads - 1) / kRowThreads);
  s.slices = std::min<std::int64_t>({wanted, most, 65535});  // >= 1
  s.rows_per_slice = (rows + s.slices - 1) / s.slices;
  return s;
}

/// The row range [first, end) of this block's slice.
__device__ __forceinline__ void slice_rows(std::int64_t rows, std::int64_t rows_per_slice, std::int64_t& first,
                                           std::int64_t& end) {
  first = static_cast<std::int64_t>(blockIdx.y) * rows_per_slice;
  end = first + rows_per_slice < rows ? first + rows_per_slice : rows;
}

/// Adds the kRowThreads partials of column threadIdx.x in @p tile (a
/// [kRowThreads][kColumnBlock + 1] shared array) in row-thread order and
/// writes the slice's partial for column @p c.
__device__ __forceinline__ void write_slice_partial(float (*tile)[kColumnBlock + 1], float* partial, std::int64_t c,
                                                    std::int64_t C) {
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sum = 0;
    for (int k = 0; k < kRowThreads; ++k) sum += tile[k][threadIdx.x];
    partial[blockIdx.y * C + c] = sum;
  }
}

/// Pass 2: out[c] += the slices' partials of column c, in slice order
/// (computed in f32, rounded once when stored).
template <typename T>
__global__ void add_column_partials_kernel(const float* partial, T* out, std::int64_t slices, std::int64_t C) {
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
