// The main() of every checker binary. A whole binary run on a GPU flavour
// (DTP_DEVICE=cuda...) where no GPU is usable is skipped as one: it exits with
// kSkipExitCode, which CTest reports as skipped — unless DTP_REQUIRE_GPU=1,
// where the checkers run and fail loudly instead. So is a flavour whose
// checkers need DTP_MIN_RANKS ranks where the backend cannot make that many
// (NCCL: one GPU per rank): not runnable here, which is never a pass.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "dtp/device.h"
#include "dtp/launch.h"
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
  if (const char* needed = std::getenv("DTP_MIN_RANKS"); needed && !only_listing(argc, argv)) {
    const int ranks = std::atoi(needed);
    if (ranks < 1) {
      std::printf("DTP_MIN_RANKS=%s: expected a whole number of ranks >= 1\n", needed);
      return 1;
    }
    dtp::World world;
    int fits = 0;
    try {
      world = dtp::World::from_env(1);
      fits = dtp::max_world_size(world.backend);
    } catch (const std::exception& e) {
      std::printf("error: %s\n", e.what());
      return 1;
    }
    if (fits < ranks) {
      std::printf(
          "not runnable here: these checkers need %d ranks and the %s backend can make %d on "
          "this machine (NCCL: one GPU per rank)%s\n",
          ranks, dtp::backend_name(world.backend), fits,
          dtp::testing::gpu_required() ? "; DTP_REQUIRE_GPU=1 makes that a failure" : "");
      return dtp::testing::gpu_required() ? 1 : kSkipExitCode;
    }
  }
  return RUN_ALL_TESTS();
}
