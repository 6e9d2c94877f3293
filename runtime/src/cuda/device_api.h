// Internal: what the runtime asks of a GPU, in plain C++ types so that
// tensor.cpp and ops.cpp stay free of CUDA headers. Implemented in
// device_api.cu; a build without CUDA gets stubs that explain themselves.
//
// Everything runs on the calling rank's current stream (launch() gives every
// rank its own), so ranks sharing one GPU do not serialize on each other.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtp/device.h"
#include "dtp/dtype.h"
#include "dtp/ops.h"

namespace dtp::cuda {

/// Stream-ordered allocation on @p device (cudaMallocAsync on the current stream).
void* allocate(Device device, std::size_t bytes);
/// Stream-ordered free on the current stream: work already queued on it
/// that uses the memory finishes first.
void release(Device device, void* pointer);

/// Copies @p bytes between any two of host and GPU memory on the current
/// stream. Returns once the data is usable by the host when the destination
/// is host memory; device destinations stay stream-ordered.
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);

void fill(void* data, DType dtype, std::int64_t count, double value);
/// Element i gets random_uniform_value(seed, offset + i, low, high) (see random.h),
/// the same values the CPU produces.
void fill_random(void* data, DType dtype, std::int64_t count, std::uint64_t seed,
                 std::int64_t offset, double low, double high);
void accumulate(void* dst, const void* src, DType dtype, std::int64_t count, ReduceOp op);
void scale(void* data, DType dtype, std::int64_t count, double factor);

/// Blocks the host until the current stream's work is done.
void synchronize();

/// The calling thread's stream (nullptr = the legacy default stream).
void* current_stream();
void set_current_stream(void* stream);
/// A non-blocking stream on @p device (also makes it the thread's device).
void* create_stream(Device device);
void destroy_stream(void* stream);
/// Has destroy_stream(), on this thread, call @p release(stream) after the
/// stream's work is done and before the stream goes: a library bound to the
/// stream (this thread's cuBLAS handles) lets go of it first.
void on_stream_destroy(void (*release)(void* stream));
/// The GPU a stream belongs to.
int stream_device(void* stream);

/// Lets every pair of @p devices read each other's memory (ranks of the
/// thread backend on several GPUs work directly on each other's buffers).
void enable_peer_access(int device_count);

/// The fused all-reduce step of the thread backend: for elements
/// [offset, offset + length) of the @p count buffers, writes the reduction of
/// all of them into every one of them. One read and one write per element
/// and buffer; no temporary.
void reduce_into_all(void* const* buffers, int count, std::int64_t offset, std::int64_t length,
                     DType dtype, ReduceOp op);
/// out[0, length) = reduction over the @p count inputs of their elements
/// [offset, offset + length).
void reduce_from_all(void* out, const void* const* inputs, int count, std::int64_t offset,
                     std::int64_t length, DType dtype, ReduceOp op);

/// Events let one rank's stream wait for work queued on another's.
void* create_event();
void destroy_event(void* event);
/// Records @p event at the current point of the current stream.
void record(void* event);
/// The current stream waits (on the GPU) until @p event has happened.
void wait(void* event);

}  // namespace dtp::cuda
