// Internal: argument checks, dtype dispatch and the host side of the
// reductions shared by the nn kernels (nn_kernels_*.cu); the device side of
// the reductions is in reductions.cuh, which the CPU emulator also runs.
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
#include "cuda/reductions.cuh"

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
    case DType::f32:
      fn(float{});
      break;
    case DType::bf16:
      fn(__nv_bfloat16{});
      break;
    case DType::f16:
      fn(__half{});
      break;
    default:
      throw Error(std::string("CUDA nn kernels: unsupported dtype ") + dtype_name(dtype));
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
inline std::int64_t rows_of(const Tensor& t, std::int64_t cols) {
  return cols == 0 ? 0 : t.numel() / cols;
}

inline unsigned grid_for(std::int64_t count, int threads = 256) {
  return blocks_for(count, threads);
}

/// The current GPU's streaming multiprocessors (a cheap query: no synchronization).
inline int multiprocessor_count() {
  int device = 0, count = 0;
  DTP_CUDA_CHECK(cudaGetDevice(&device));
  DTP_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
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
    sum_in_order_kernel<256>
        <<<1, 256, 0, stream()>>>(ptr<double>(parts), parts.numel(), ptr<double>(total));
    check_launch();
  }
  return total.item(0);
}

// --- sums over rows (reductions.cuh has the idea and the device side) ---

/// Enough slices for about four blocks per SM, each at least kRowThreads
/// rows; blocks of kColumnBlock x @p width columns.
inline RowSlices row_slices(std::int64_t rows, std::int64_t C, int width = 1) {
  RowSlices s;
  s.column_blocks = (C + kColumnBlock * width - 1) / (kColumnBlock * width);
  const std::int64_t wanted = (4 * multiprocessor_count() + s.column_blocks - 1) / s.column_blocks;
  const std::int64_t most = std::max<std::int64_t>(1, (rows + kRowThreads - 1) / kRowThreads);
  s.slices = std::min<std::int64_t>({wanted, most, 65535});  // >= 1
  s.rows_per_slice = (rows + s.slices - 1) / s.slices;
  return s;
}

}  // namespace dtp::cuda::nn
