// The runtime's GPU memory and element-wise kernels (see device_api.h).
#include "cuda/device_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/random.h"
#include "cuda/cuda_check.h"
#include "cuda/elementwise_kernels.cuh"

namespace dtp::cuda {

namespace {
thread_local cudaStream_t stream_of_this_thread = nullptr;

cudaStream_t stream() { return stream_of_this_thread; }

template <typename T>
__global__ void fill_kernel(T* data, std::int64_t count, double value) {
  const T v = from_double<T>(value);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    data[i] = v;
}

template <typename T>
__global__ void random_kernel(T* data, std::int64_t count, std::uint64_t seed, std::int64_t offset,
                              double low, double high) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    data[i] = from_double<T>(detail::random_uniform_value(seed, offset + i, low, high));
}

// dst op= src element-wise (op 0 sum, 1 max, 2 min): the reduction step of
// the thread backend's collectives on a GPU.
template <typename T, int W>
__global__ void accumulate_kernel(T* dst, const T* src, std::int64_t count, int op) {
  vec::for_each_chunk<W>(count, [&](auto width, std::int64_t i) {
    constexpr int V = decltype(width)::value;
    typename Compute<T>::type a[V], b[V];
    vec::load<V>(dst + i, a);
    vec::load<V>(src + i, b);
#pragma unroll
    for (int k = 0; k < V; ++k)
      a[k] = op == 0   ? a[k] + b[k]
             : op == 1 ? (a[k] > b[k] ? a[k] : b[k])
                       : (a[k] < b[k] ? a[k] : b[k]);
    vec::store<V>(dst + i, a);
  });
}

// Device @p index's memory pool, told once to keep what is freed. With the
// default release threshold (0) a pool hands its free memory back to the
// driver at every synchronization, and the next step maps the activations
// again: every step would pay for the allocations of a cold start.
cudaMemPool_t pool_of(int index) {
  static std::mutex mutex;
  static std::vector<cudaMemPool_t> pools;  // by device index; null until first used
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<std::size_t>(index) >= pools.size())
    pools.resize(static_cast<std::size_t>(index) + 1, nullptr);
  cudaMemPool_t& pool = pools[static_cast<std::size_t>(index)];
  if (pool == nullptr) {
    cudaMemPool_t made = nullptr;
    DTP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&made, index));
    std::uint64_t keep_everything = UINT64_MAX;
    DTP_CUDA_CHECK(
        cudaMemPoolSetAttribute(made, cudaMemPoolAttrReleaseThreshold, &keep_everything));
    pool = made;
  }
  return pool;
}

// A thread without a stream of its own (not a rank: a test's main thread)
// launches on the legacy default stream of its current device; it moves to
// the device it allocates on, so that the fill or copy that follows runs
// there. A rank's thread keeps its device: its stream decides.
void follow_device_without_stream(Device device) {
  if (stream() == nullptr) DTP_CUDA_CHECK(cudaSetDevice(device.index));
}

}  // namespace

void* allocate(Device device, std::size_t bytes) {
  follow_device_without_stream(device);
  void* pointer = nullptr;
  // Stream-ordered (freeing and reusing memory never waits for the whole
  // GPU), from device k's own pool: this thread's stream may belong to
  // another device, and cudaMallocAsync would take its device's pool.
  DTP_CUDA_CHECK(cudaMallocFromPoolAsync(&pointer, std::max<std::size_t>(bytes, 256),
                                         pool_of(device.index), stream()));
  return pointer;
}

void release(Device device, void* pointer) {
  if (pointer == nullptr) return;
  if (stream() == nullptr) cudaSetDevice(device.index);  // no throw: called from destructors
  // The pointer knows its pool; the stream orders the free after this thread's work on it.
  cudaFreeAsync(pointer, stream());
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  DTP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
  // The host reads what it copied as soon as this returns.
  if (dst_device.is_cpu() || src_device.is_cpu()) DTP_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void fill(void* data, DType dtype, std::int64_t count, double value) {
  if (count == 0) return;
  if (value == 0.0 && !std::signbit(value)) {  // +0 is all zero bits in every dtype: one memset
    DTP_CUDA_CHECK(
        cudaMemsetAsync(data, 0, static_cast<std::size_t>(count) * dtype_size(dtype), stream()));
    return;
  }
  with_device_element(dtype, [&](auto zero) {
    using T = decltype(zero);
    fill_kernel<<<blocks_for(count), 256, 0, stream()>>>(static_cast<T*>(data), count, value);
  });
  DTP_CUDA_CHECK(cudaGetLastError());
}

void fill_random(void* data, DType dtype, std::int64_t count, std::uint64_t seed,
                 std::int64_t offset, double low, double high) {
  if (count == 0) return;
  with_device_element(dtype, [&](auto zero) {
    using T = decltype(zero);
    random_kernel<<<blocks_for(count), 256, 0, stream()>>>(static_cast<T*>(data), count, seed,
                                                           offset, low, high);
  });
  DTP_CUDA_CHECK(cudaGetLastError());
}

void accumulate(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op) {
  if (count == 0) return;
  const int code = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;
  with_device_element(dtype, [&](auto zero) {
    using T = decltype(zero);
    launch_elementwise<T>(
        count,
        [&](auto w, unsigned grid) {
          accumulate_kernel<T, decltype(w)::value><<<grid, 256, 0, stream()>>>(
              static_cast<T*>(dst), static_cast<const T*>(src), count, code);
        },
        static_cast<const T*>(dst), static_cast<const T*>(src));
  });
  DTP_CUDA_CHECK(cudaGetLastError());
}

void scale(void* data, DType dtype, std::int64_t count, double factor) {
  if (count == 0) return;
  with_device_element(dtype, [&](auto zero) {
    using T = decltype(zero);
    launch_elementwise<T>(
        count,
        [&](auto w, unsigned grid) {
          elementwise::scale_kernel<T, decltype(w)::value>
              <<<grid, 256, 0, stream()>>>(static_cast<T*>(data), count, factor);
        },
        static_cast<const T*>(data));
  });
  DTP_CUDA_CHECK(cudaGetLastError());
}

void synchronize() { DTP_CUDA_CHECK(cudaStreamSynchronize(stream())); }

void* current_stream() { return stream_of_this_thread; }
void set_current_stream(void* s) { stream_of_this_thread = static_cast<cudaStream_t>(s); }

void* create_stream(Device device) {
  DTP_CUDA_CHECK(cudaSetDevice(device.index));
  cudaStream_t s = nullptr;
  DTP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

namespace {
thread_local std::vector<void (*)(void*)> stream_releasers;
}  // namespace

void on_stream_destroy(void (*release)(void* stream)) {
  for (auto known : stream_releasers)
    if (known == release) return;
  stream_releasers.push_back(release);
}

void destroy_stream(void* s) {
  if (s == nullptr) return;
  cudaStreamSynchronize(static_cast<cudaStream_t>(s));
  for (auto release : stream_releasers) release(s);
  cudaStreamDestroy(static_cast<cudaStream_t>(s));
}

int stream_device(void* s) {
  int device = 0;
  DTP_CUDA_CHECK(cudaStreamGetDevice(static_cast<cudaStream_t>(s), &device));
  return device;
}

void* create_event() {
  cudaEvent_t event = nullptr;
  DTP_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void destroy_event(void* event) {
  if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void record(void* event) {
  DTP_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), stream()));
}

void wait(void* event) {
  DTP_CUDA_CHECK(cudaStreamWaitEvent(stream(), static_cast<cudaEvent_t>(event), 0));
}

}  // namespace dtp::cuda
