// The smallest CUDA piece of the runtime: asking how many GPUs there are.
// cudaGetDeviceCount fails cleanly (no driver, no device) on machines without
// a GPU, which is how GPU checkers know to skip.
#include <cuda_runtime.h>

#include "dtp/device.h"

namespace dtp {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return count;
}

}  // namespace dtp
