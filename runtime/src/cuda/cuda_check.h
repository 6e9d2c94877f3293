// Internal: every CUDA runtime call goes through DTP_CUDA_CHECK, which turns a
// failure into a dtp::Error naming the call, the file and the line.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "dtp/error.h"

namespace dtp::cuda {
[[noreturn]] inline void fail(cudaError_t code, const char* call, const char* file, int line) {
  throw Error(std::string("CUDA error: ") + call + " failed at " + file + ":" +
              std::to_string(line) + ": " + cudaGetErrorName(code) + " (" +
              cudaGetErrorString(code) + ")");
}
}  // namespace dtp::cuda

#define DTP_CUDA_CHECK(call)                                         \
  do {                                                               \
    cudaError_t dtp_cuda_status = (call);                            \
    if (dtp_cuda_status != cudaSuccess)                              \
      ::dtp::cuda::fail(dtp_cuda_status, #call, __FILE__, __LINE__); \
  } while (0)
