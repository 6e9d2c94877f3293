// The thread backend's reduction kernels. All ranks' buffers live in one
// address space, so the rank that owns a chunk reads that chunk of every
// buffer and writes the result straight back into all of them: the fewest
// bytes an all-reduce can move (N reads and N writes per element).
#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/device_api.h"
#include "cuda/element_types.cuh"

namespace dtp::cuda {

namespace {
constexpr int kMaxBuffers = 64;

template <typename T>
struct Buffers {
  T* p[kMaxBuffers];
};

template <typename C>
__device__ __forceinline__ C combine(C a, C b, int op) {
  return op == 0 ? a + b : op == 1 ? (a > b ? a : b) : (a < b ? a : b);
}

__device__ __forceinline__ float4 combine4(float4 a, float4 b, int op) {
  return make_float4(combine(a.x, b.x, op), combine(a.y, b.y, op), combine(a.z, b.z, op),
                     combine(a.w, b.w, op));
}

// f32 fast path: 16-byte loads and stores.
__global__ void reduce_into_all_f32x4(Buffers<float4> buffers, int count, std::int64_t length4,
                                      int op, float scale) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < length4; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float4 acc = buffers.p[0][i];
    for (int r = 1; r < count; ++r) acc = combine4(acc, buffers.p[r][i], op);
    acc = make_float4(acc.x * scale, acc.y * scale, acc.z * scale, acc.w * scale);
    for (int r = 0; r < count; ++r) buffers.p[r][i] = acc;
  }
}

template <typename T>
__global__ void reduce_into_all_scalar(Buffers<T> buffers, int count, std::int64_t length, int op,
                                       double scale) {
  using C = typename Compute<T>::type;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < length; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    C acc = load(buffers.p[0], i);
    for (int r = 1; r < count; ++r) acc = combine(acc, load(buffers.p[r], i), op);
    if (scale != 1.0) acc = static_cast<C>(acc * static_cast<C>(scale));
    for (int r = 0; r < count; ++r) store(buffers.p[r], i, acc);
  }
}

template <typename T>
__global__ void reduce_from_all_scalar(T* out, Buffers<const T> inputs, int count,
                                       std::int64_t length, int op, double scale) {
  using C = typename Compute<T>::type;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < length; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    C acc = load(inputs.p[0], i);
    for (int r = 1; r < count; ++r) acc = combine(acc, load(inputs.p[r], i), op);
    if (scale != 1.0) acc = static_cast<C>(acc * static_cast<C>(scale));
    store(out, i, acc);
  }
}

int op_code(ReduceOp op) { return op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0; }
double op_scale(ReduceOp op, int count) { return op == ReduceOp::avg ? 1.0 / count : 1.0; }

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
}  // namespace

void enable_peer_access(int device_count) {
  for (int a = 0; a < device_count; ++a) {
    for (int b = 0; b < device_count; ++b) {
      if (a == b) continue;
      int possible = 0;
      DTP_CUDA_CHECK(cudaDeviceCanAccessPeer(&possible, a, b));
      if (!possible) {
        throw Error("GPU " + std::to_string(a) + " cannot read GPU " + std::to_string(b) +
                    "'s memory (no peer access); run one thread-backend world per GPU or use the "
                    "nccl backend");
      }
      DTP_CUDA_CHECK(cudaSetDevice(a));
      cudaError_t status = cudaDeviceEnablePeerAccess(b, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled)
        cudaGetLastError();
      else
        DTP_CUDA_CHECK(status);
    }
  }
}

void reduce_into_all(void* const* buffers, int count, std::int64_t offset, std::int64_t length,
                     DType dtype, ReduceOp op) {
  DTP_CHECK(count >= 1 && count <= kMaxBuffers, "reduce_into_all: ", count, " buffers; at most ",
            kMaxBuffers);
  if (length == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream());
  with_device_element(dtype, [&](auto zero) {
    using T = decltype(zero);
    Buffers<T> chunk{};
    bool vectorizable = std::is_same_v<T, float> && length % 4 == 0;
    for (int r = 0; r < count; ++r) {
      chunk.p[r] = static_cast<T*>(buffers[r]) + offset;
      vectorizable = vectorizable && aligned16(chunk.p[r]);
    }
    if (vectorizable) {
      Buffers<float4> wide{};
      for (int r = 0; r < count; ++r) wide.p[r] = reinterpret_cast<float4*>(chunk.p[r]);
      reduce_into_all_f32x4<<<blocks_for(length / 4), 256, 0, stream>>>(
          wide, count, length / 4, op_code(op), static_cast<float>(op_scale(op, count)));
    } else {
      reduce_into_all_scalar<<<blocks_for(length), 256, 0, stream>>>(
          chunk, count, length, op_code(op), op_scale(op, count));
    }
  });
  DTP_CUDA_CHECK(cudaGetLastError());
}

void reduce_from_all(void* out, const void* const* inputs, int count, std::int64_t offset,
                     std::int64_t length, DType dtype, ReduceOp op) {
  DTP_CHECK(count >= 1 && count <= kMaxBuffers, "reduce_from_all: ", count, " inputs; at most ",
            kMaxBuffers);
  if (length == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(current_stream());
  with_device_element(dtype, [&](auto zero) {
    using T = decltype(zero);
    Buffers<const T> chunk{};
    for (int r = 0; r < count; ++r) chunk.p[r] = static_cast<const T*>(inputs[r]) + offset;
    reduce_from_all_scalar<<<blocks_for(length), 256, 0, stream>>>(
        static_cast<T*>(out), chunk, count, length, op_code(op), op_scale(op, count));
  });
  DTP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtp::cuda
