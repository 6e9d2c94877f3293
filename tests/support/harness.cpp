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

#include <unistd.h>

namespace dtp::testing {

TempFolder::TempFolder() {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      test ? std::string(test->test_suite_name()) + "." + test->name() : "no-test";
  path =
      std::filesystem::temp_directory_path() / ("dtp-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
}

TempFolder::~TempFolder() {
  std::error_code ignored;  // a destructor must not throw
  std::filesystem::remove_all(path, ignored);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

bool world_fits(int world_size) {
  const World world = World::from_env(1);
  return world.backend == Backend::thread || world_size <= max_world_size(world.backend);
}

std::vector<int> all_world_sizes() {
  std::vector<int> sizes;
  for (int n = 1; n <= 8 && world_fits(n); ++n) sizes.push_back(n);
  return sizes;
}

Device checker_device() { return World::from_env(1).device; }

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
    case DType::f64:
      return std::int64_t{1} << 24;
    case DType::f32:
      return 4096;
    case DType::f16:
      return 32;
    case DType::bf16:
      return 4;
    case DType::i32:
      return std::int64_t{1} << 20;
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

// The pattern index (within one period) a value of rank r holds.
struct Single {
  int rank;
  std::int64_t index;
};

std::string ranks_phrase(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    if (k > 0) out += (k + 1 == ranks.size()) ? " and " : ", ";
    out += std::to_string(ranks[k]);
  }
  return out;
}

// " (index mod P)" for dtypes whose pattern repeats within the lengths checked.
std::string index_words(std::int64_t index, DType dtype) {
  std::string out = "element " + std::to_string(index);
  if (dtype != DType::f64) out += " (mod " + std::to_string(pattern_period(dtype)) + ")";
  return out;
}

// The subsets of ranks 0..world-1 (as bit masks) whose pattern values at
// `index` add up to `value`.
std::vector<unsigned> subsets_summing_to(double value, int world, std::int64_t index, DType dtype) {
  std::vector<unsigned> found;
  for (unsigned mask = 1; mask < (1u << world); ++mask) {
    double sum = 0;
    for (int r = 0; r < world; ++r)
      if (mask & (1u << r)) sum += pattern_value(r, index, dtype);
    if (sum == value) found.push_back(mask);
  }
  return found;
}

std::vector<int> ranks_of(unsigned mask, int world) {
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r)
    if (mask & (1u << r)) ranks.push_back(r);
  return ranks;
}

// Explanations at one pattern index: a single rank's value, a sum over some
// ranks, or the full sum with one rank counted twice.
std::string describe_at_index(double value, PatternKey key, std::int64_t index) {
  const int world = key.world;
  const std::vector<unsigned> subsets = subsets_summing_to(value, world, index, key.dtype);
  if (subsets.size() == 1) {
    const std::vector<int> ranks = ranks_of(subsets[0], world);
    if (ranks.size() == 1) {
      const bool alone = world > 1 && key.meaning == PatternMeaning::sums;
      return "rank " + std::to_string(ranks[0]) + "'s " + index_words(index, key.dtype) +
             (alone ? " alone" : "");
    }
    if (static_cast<int>(ranks.size()) == world)
      return "the sum over all " + std::to_string(world) + " ranks of " +
             index_words(index, key.dtype);
    return "the sum over " + ranks_phrase(ranks) + " only of " + index_words(index, key.dtype);
  }
  if (subsets.size() > 1) {
    // Several subsets fit (possible with the short f16/bf16 periods): say so.
    return "a sum over " + ranks_phrase(ranks_of(subsets[0], world)) +
           " (or another set of ranks) of " + index_words(index, key.dtype);
  }
  double full = 0;
  for (int r = 0; r < world; ++r) full += pattern_value(r, index, key.dtype);
  for (int r = 0; r < world && world > 1; ++r) {
    if (value == full + pattern_value(r, index, key.dtype))
      return "the sum over all " + std::to_string(world) + " ranks of " +
             index_words(index, key.dtype) + " plus rank " + std::to_string(r) +
             "'s value again (added twice)";
    if (value == 2 * full)
      return "twice the sum over all " + std::to_string(world) + " ranks of " +
             index_words(index, key.dtype) + " (the whole sum added twice)";
  }
  return "";
}

// The pattern index an expected value belongs to: one rank's value
// (rank * period + index + 1) for copies, the sum over all W ranks
// (period * W(W-1)/2 + W * (index + 1)) for sums; -1 when it is neither.
std::int64_t pattern_index_of(double value, PatternKey key) {
  if (key.world <= 0 || !(value > 0) || value != std::trunc(value) || value > 9.0e15) return -1;
  const std::int64_t period = pattern_period(key.dtype);
  const auto v = static_cast<std::int64_t>(value);
  if (key.meaning == PatternMeaning::copies) {
    return (v - 1) / period < key.world ? (v - 1) % period : -1;
  }
  const std::int64_t w = key.world;
  const std::int64_t rest = v - period * w * (w - 1) / 2;
  if (rest <= 0 || rest % w != 0 || rest / w - 1 >= period) return -1;
  return rest / w - 1;
}

}  // namespace

std::string describe_pattern_value(double value, PatternKey key, std::int64_t index_hint) {
  if (value == kUnwritten)
    return "-1, the fill value: never written, or copied from a part of a buffer that was never "
           "written (a chunk index off by one copies a neighbour's unfilled chunk)";
  if (key.world <= 0 || key.world > 16 || !std::isfinite(value) || value != std::trunc(value) ||
      value <= 0)
    return "";
  const std::int64_t period = pattern_period(key.dtype);
  if (index_hint >= 0) {
    if (std::string words = describe_at_index(value, key, index_hint % period); !words.empty())
      return words;
  }
  // One rank's value at another index: a copy from the wrong place.
  const auto v = static_cast<std::int64_t>(value);
  const std::int64_t rank = (v - 1) / period;
  if (rank < key.world) {
    return "rank " + std::to_string(rank) + "'s " + index_words((v - 1) % period, key.dtype);
  }
  return "";
}

double pattern_value(int rank, std::int64_t index, DType dtype) {
  const std::int64_t period = pattern_period(dtype);
  const std::int64_t wrapped = ((index % period) + period) % period;
  return static_cast<double>(static_cast<std::int64_t>(rank) * period + wrapped + 1);
}

std::vector<double> pattern_values(int rank, std::int64_t numel, DType dtype) {
  std::vector<double> values(static_cast<std::size_t>(numel < 0 ? 0 : numel));
  for (std::int64_t i = 0; i < numel; ++i)
    values[static_cast<std::size_t>(i)] = pattern_value(rank, i, dtype);
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
    for (std::int64_t i = 0; i < numel; ++i)
      sum[static_cast<std::size_t>(i)] += pattern_value(rank, i, dtype);
  }
  return sum;
}

::testing::AssertionResult values_equal(const std::string& what, int rank,
                                        const std::vector<double>& expected,
                                        const std::vector<double>& got, int chunks,
                                        PatternKey key) {
  std::ostringstream head;
  head << what;
  if (rank >= 0) head << ": rank " << rank;
  if (expected.size() != got.size()) {
    return ::testing::AssertionFailure() << head.str() << (rank >= 0 ? ", " : ": ") << "expected "
                                         << expected.size() << " elements, got " << got.size();
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
      examples << ": expected " << format_value(e);
      const std::int64_t index = pattern_index_of(e, key);
      const std::string expected_words = key.world > 0 ? describe_pattern_value(e, key, index) : "";
      if (!expected_words.empty()) examples << " = " << expected_words;
      examples << ", got " << format_value(g);
      const std::string got_words = key.world > 0 ? describe_pattern_value(g, key, index) : "";
      if (!got_words.empty()) examples << " = " << got_words;
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
