// The main() of every checker binary. A whole binary run on a GPU flavour
// (DTP_DEVICE=cuda...) where no GPU is usable is skipped as one: it exits with
// kSkipExitCode, which CTest reports as skipped — unless DTP_REQUIRE_GPU=1,
// where the checkers run and fail loudly instead.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dtp/device.h"
#include "support/harness.h"

namespace {
constexpr int kSkipExitCode = 77;

bool only_listing(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--gtest_list_tests") == 0) return true;
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* device = std::getenv("DTP_DEVICE");
  const bool wants_gpu = device != nullptr && std::string(device).rfind("cuda", 0) == 0;
  if (wants_gpu && !only_listing(argc, argv) && dtp::cuda_device_count() == 0 &&
      !dtp::testing::gpu_required()) {
    std::printf(
        "skipped: DTP_DEVICE=%s but no usable CUDA device (set DTP_REQUIRE_GPU=1 to fail "
        "instead)\n",
        device);
    return kSkipExitCode;
  }
  return RUN_ALL_TESTS();
}
