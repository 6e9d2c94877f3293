// The checker harness (see harness.h): running bodies on ranks, pattern data
// that makes every misplaced or missing element visible, and exact comparisons
// whose messages point at the rank, element and chunk that went wrong.
#include "support/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <string>

namespace dtp::testing {

// Under mpi a world can have at most as many ranks as mpiexec started processes.
std::vector<int> all_world_sizes() {
  int largest = 8;
  const World world = World::from_env(1);
  if (world.backend != Backend::thread) largest = std::min(largest, max_world_size(world.backend));
  std::vector<int> sizes;
  for (int n = 1; n <= largest; ++n) sizes.push_back(n);
  return sizes;
}

void run_ranks(int world_size, const std::function<void(Comm&)>& body, CostModel cost) {
  World world = World::from_env(world_size);
  world.cost = cost;
  // Under mpi, launch() makes every process (those that sit a smaller world
  // out included) leave the same way, so sweeps stay in step.
  launch(world, body);
}

namespace {

// The index part of a pattern value repeats with this period, chosen per dtype
// so that rank * period + period stays exact and sums over 8 ranks stay exact.
std::int64_t pattern_period(DType dtype) {
  switch (dtype) {
    case DType::f64: return std::int64_t{1} << 24;
    case DType::f32: return 4096;
    case DType::f16: return 32;
    case DType::bf16: return 4;
    case DType::i32: return std::int64_t{1} << 20;
  }
  return 4;
}

// Integral values print without an exponent so that a student can compare them
// with rank * period + index + 1 by eye; everything else with full precision.
std::string format_value(double value) {
  std::ostringstream out;
  if (std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 9.0e18) {
    out << static_cast<long long>(value);
  } else {
    out << std::setprecision(17) << value;
  }
  return out.str();
}

bool same_value(double expected, double got) {
  if (std::isnan(expected) && std::isnan(got)) return true;
  return expected == got;
}

}  // namespace

double pattern_value(int rank, std::int64_t index, DType dtype) {
  const std::int64_t period = pattern_period(dtype);
  const std::int64_t wrapped = ((index % period) + period) % period;
  return static_cast<double>(static_cast<std::int64_t>(rank) * period + wrapped + 1);
}

std::vector<double> pattern_values(int rank, std::int64_t numel, DType dtype) {
  std::vector<double> values(static_cast<std::size_t>(numel < 0 ? 0 : numel));
  for (std::int64_t i = 0; i < numel; ++i) values[static_cast<std::size_t>(i)] = pattern_value(rank, i, dtype);
  return values;
}

Tensor pattern_tensor(int rank, std::int64_t numel, DType dtype, Device device) {
  Tensor host = Tensor::from_values(pattern_values(rank, numel, dtype), dtype);
  if (device.is_cpu()) return host;
  Tensor on_device = Tensor::empty(Shape{numel}, dtype, device);
  on_device.copy_from(host);
  return on_device;
}

std::vector<double> pattern_sum(int world_size, std::int64_t numel, DType dtype) {
  std::vector<double> sum(static_cast<std::size_t>(numel < 0 ? 0 : numel), 0.0);
  for (int rank = 0; rank < world_size; ++rank) {
    for (std::int64_t i = 0; i < numel; ++i) sum[static_cast<std::size_t>(i)] += pattern_value(rank, i, dtype);
  }
  return sum;
}

::testing::AssertionResult values_equal(const std::string& what, int rank,
                                        const std::vector<double>& expected,
                                        const std::vector<double>& got, int chunks) {
  std::ostringstream head;
  head << what;
  if (rank >= 0) head << ": rank " << rank;
  if (expected.size() != got.size()) {
    return ::testing::AssertionFailure()
           << head.str() << (rank >= 0 ? ", " : ": ") << "expected " << expected.size()
           << " elements, got " << got.size();
  }
  constexpr int kExamples = 5;
  const auto numel = static_cast<std::int64_t>(expected.size());
  std::int64_t wrong = 0;
  std::ostringstream examples;
  for (std::int64_t i = 0; i < numel; ++i) {
    const double e = expected[static_cast<std::size_t>(i)];
    const double g = got[static_cast<std::size_t>(i)];
    if (same_value(e, g)) continue;
    if (wrong < kExamples) {
      examples << "; element " << i;
      if (chunks > 0) {
        // Chunks are ceil-sized, so the owner of element i is i / chunk size.
        const std::int64_t chunk_size = chunk_range(numel, chunks, 0).length;
        const int c = static_cast<int>(chunk_size > 0 ? i / chunk_size : 0);
        examples << " (chunk " << c << " of " << chunks << ", offset "
                 << i - chunk_range(numel, chunks, c).offset << ")";
      }
      examples << ": expected " << format_value(e) << ", got " << format_value(g);
    }
    ++wrong;
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  failure << head.str() << (rank >= 0 ? ", " : ": ") << wrong << " of " << numel
          << " elements wrong" << examples.str();
  if (wrong > kExamples) failure << "; ...";
  return failure;
}

bool gpu_required() {
  const char* value = std::getenv("DTP_REQUIRE_GPU");
  return value != nullptr && std::string(value) == "1";
}

}  // namespace dtp::testing
