/// @file harness.h
/// @brief The checker harness: run a body on every rank, make data that shows
/// every mistake, and compare with messages that say where to look.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtp/dtp.h"

namespace dtp::testing {

/// A fresh folder for one test's files (named after the test and the
/// process, so parallel runs never share one), removed afterwards.
struct TempFolder {
  std::filesystem::path path;
  TempFolder();
  ~TempFolder();
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  /// The path of @p name inside the folder.
  std::string file(const std::string& name) const { return (path / name).string(); }
};

/// Installs a fresh memory tracker on this thread for one test's allocations
/// and removes it at the end of the scope.
class ScopedTracker {
 public:
  ScopedTracker() { set_current_memory_tracker(tracker); }
  ~ScopedTracker() { set_current_memory_tracker(nullptr); }
  ScopedTracker(const ScopedTracker&) = delete;
  ScopedTracker& operator=(const ScopedTracker&) = delete;
  std::shared_ptr<MemoryTracker> tracker = std::make_shared<MemoryTracker>();
};

/// The message of what @p fn throws, or "(no error)" when it returns: for
/// checking that bad input is refused with words a student can act on.
std::string error_of(const std::function<void()>& fn);

/// World sizes the collectives checkers sweep: 1 to 8, odd ones included
/// (under mpi, those up to the processes mpiexec started).
std::vector<int> all_world_sizes();

/// True when the backend named by DTP_BACKEND can run a world of
/// @p world_size ranks: always with threads; under mpi, at most as many
/// ranks as mpiexec started processes.
bool world_fits(int world_size);

/// The device named by DTP_DEVICE (the GPU flavours set it to cuda), else
/// the CPU: where a checker that runs without ranks makes its model and
/// tensors. Inside run_ranks, a rank's device is comm.device().
Device checker_device();

/// Runs body(comm) on @p world_size ranks of the backend and device named by
/// DTP_BACKEND / DTP_DEVICE, with @p cost as the alpha-beta model. A rank's
/// failure is rethrown as dtp::RankFailure naming the rank.
void run_ranks(int world_size, const std::function<void(Comm&)>& body, CostModel cost = {});

/// A value unique to (rank, index) for the lengths checkers use, never zero,
/// exactly representable in @p dtype, and such that sums over up to 8 ranks
/// stay exact. f64: rank * 2^24 + index + 1 (index < 2^24). Narrower dtypes
/// repeat the index part with a shorter period (f32 4096, f16 32, bf16 4,
/// i32 2^20) to keep sums exact.
double pattern_value(int rank, std::int64_t index, DType dtype);

/// A 1-D tensor of pattern_value(rank, i, dtype) for i in [0, numel).
Tensor pattern_tensor(int rank, std::int64_t numel, DType dtype = DType::f64,
                      Device device = Device::cpu());

/// The pattern values of @p rank as doubles (what pattern_tensor holds).
std::vector<double> pattern_values(int rank, std::int64_t numel, DType dtype = DType::f64);

/// Element-wise sum over ranks 0..world_size-1 of pattern_values().
std::vector<double> pattern_sum(int world_size, std::int64_t numel, DType dtype = DType::f64);

/// The value a checker fills an output buffer with before the call: never a
/// pattern value nor a sum of them, so seeing it means "never written".
inline constexpr double kUnwritten = -1.0;

/// How expected values were made from the pattern: copies of one rank's
/// values (broadcast, gather, all-gather, all-to-all) or sums over ranks
/// (reduce, all-reduce, reduce-scatter).
enum class PatternMeaning { copies, sums };

/// Which pattern made the values being compared: the world size whose ranks
/// contributed, the dtype (it sets the period) and whether the expected
/// values are copies or sums. world 0: not pattern data, nothing is decoded.
struct PatternKey {
  int world = 0;             ///< ranks whose values may appear (0: don't decode)
  DType dtype = DType::f64;  ///< dtype of the pattern (sets the index period)
  PatternMeaning meaning = PatternMeaning::copies;  ///< what an expected value is
};

/// Says what a value made of pattern data is, in words: "rank 1's element 0",
/// "the sum over ranks 0 and 2 of element 5", "the sum over all 4 ranks of
/// element 5 plus rank 3's element 5 again", "-1, the fill value: never
/// written". @p index_hint is the pattern index the value should belong to
/// (decoded from the expected value; -1 when unknown): explanations at that
/// index are preferred. "" when the value fits no explanation.
std::string describe_pattern_value(double value, PatternKey key, std::int64_t index_hint = -1);

/// Compares exactly. On mismatch the message names @p what, the rank, the
/// first few wrong elements with expected and got, and how many are wrong.
/// With @p chunks > 0 each element is also located as "chunk c of chunks,
/// offset o" under chunk_range(expected.size(), chunks, c). With a @p key,
/// expected and got values are decoded in words (describe_pattern_value):
/// "got 16777217 = rank 1's element 0 alone (expected 16777218 = the sum over
/// ranks 0 and 1 of element 0)".
::testing::AssertionResult values_equal(const std::string& what, int rank,
                                        const std::vector<double>& expected,
                                        const std::vector<double>& got, int chunks = 0,
                                        PatternKey key = {});

/// True when DTP_REQUIRE_GPU=1: GPU checks must run, not skip.
bool gpu_required();

}  // namespace dtp::testing

/// Skips the current test when no CUDA device is usable, or fails it under
/// DTP_REQUIRE_GPU=1.
#define DTP_REQUIRE_GPU()                                                              \
  do {                                                                                 \
    if (::dtp::cuda_device_count() == 0) {                                             \
      if (::dtp::testing::gpu_required()) {                                            \
        FAIL() << "DTP_REQUIRE_GPU=1 but no usable CUDA device was found";             \
      }                                                                                \
      GTEST_SKIP() << "no usable CUDA device (set DTP_REQUIRE_GPU=1 to fail instead)"; \
    }                                                                                  \
  } while (0)
