// Without CUDA, every GPU request fails with one clear sentence.
#ifndef DTP_HAVE_CUDA
#include "cuda/device_api.h"
#include "dtp/error.h"

namespace dtp::cuda {

namespace {
[[noreturn]] void no_cuda() {
  throw Error(
      "this build of DTP has no CUDA (nvcc was not found at configure time); use a cpu device");
}
}  // namespace

void* allocate(Device, std::size_t) { no_cuda(); }
void release(Device, void*) {}
void copy(void*, Device, const void*, Device, std::size_t) { no_cuda(); }
void fill(void*, DType, std::int64_t, double) { no_cuda(); }
void fill_random(void*, DType, std::int64_t, std::uint64_t, std::int64_t, double, double) {
  no_cuda();
}
void accumulate(void*, const void*, DType, std::int64_t, ReduceOp) { no_cuda(); }
void scale(void*, DType, std::int64_t, double) { no_cuda(); }
void synchronize() {}
void* current_stream() { return nullptr; }
void set_current_stream(void*) {}
void* create_stream(Device) { no_cuda(); }
void destroy_stream(void*) {}
void on_stream_destroy(void (*)(void*)) {}
int stream_device(void*) { no_cuda(); }
void enable_peer_access(int) {}
void reduce_into_all(void* const*, int, std::int64_t, std::int64_t, DType, ReduceOp) { no_cuda(); }
void reduce_from_all(void*, const void* const*, int, std::int64_t, std::int64_t, DType, ReduceOp) {
  no_cuda();
}
void* create_event() { no_cuda(); }
void destroy_event(void*) {}
void record(void*) { no_cuda(); }
void wait(void*) { no_cuda(); }

}  // namespace dtp::cuda
#endif
