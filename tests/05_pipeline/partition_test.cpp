// Puzzle 5.1: the partition. The stages must be contiguous, non-empty and
// in order, cover every unit once, and make the most expensive stage as
// cheap as any split can (the checker finds the best by trying them all).
#include <cmath>
#include <functional>
#include <sstream>

#include "pipeline_checks.h"

namespace dtp::testing::ch05 {
namespace {

// The cheapest possible "most expensive stage" and one split achieving it,
// by trying every way to place the stages - 1 cuts.
std::pair<double, std::vector<UnitRange>> best_split(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  double best = INFINITY;
  std::vector<UnitRange> best_ranges, ranges;
  std::function<void(int, int, double)> place = [&](int first, int left, double worst) {
    if (worst >= best) return;
    if (left == 1) {
      double sum = 0;
      for (int u = first; u < n; ++u) sum += costs[static_cast<std::size_t>(u)];
      ranges.push_back({first, n - first});
      if (std::max(worst, sum) < best) best = std::max(worst, sum), best_ranges = ranges;
      ranges.pop_back();
      return;
    }
    double sum = 0;
    for (int end = first + 1; end <= n - (left - 1); ++end) {
      sum += costs[static_cast<std::size_t>(end - 1)];
      ranges.push_back({first, end - first});
      place(end, left - 1, std::max(worst, sum));
      ranges.pop_back();
    }
  };
  place(0, stages, 0.0);
  return {best, best_ranges};
}

std::string show(const std::vector<UnitRange>& ranges) {
  std::ostringstream out;
  for (const UnitRange& r : ranges)
    out << (&r == ranges.data() ? "" : " ") << "[" << r.first << ", " << r.first + r.count << ")";
  return out.str();
}

std::string show(const std::vector<double>& costs) {
  std::string out;
  for (double c : costs) out += (out.empty() ? "" : ", ") + number(c);
  return "{" + out + "}";
}

// "" or what is wrong with partition_units(costs, stages).
std::string check_partition(const std::vector<double>& costs, int stages) {
  const std::string what = "partition_units(" + show(costs) + ", " + std::to_string(stages) + ")";
  const std::vector<UnitRange> got = partition_units(costs, stages);
  if (static_cast<int>(got.size()) != stages)
    return what + " returned " + std::to_string(got.size()) + " stages: " + show(got);
  int next = 0;
  double worst = 0;
  int worst_stage = 0;
  for (int s = 0; s < stages; ++s) {
    const UnitRange r = got[static_cast<std::size_t>(s)];
    if (r.count < 1) return what + " = " + show(got) + ": stage " + std::to_string(s) + " is empty";
    if (r.first != next)
      return what + " = " + show(got) + ": stage " + std::to_string(s) + " starts at unit " +
             std::to_string(r.first) + ", expected " + std::to_string(next) +
             " (stages are contiguous and in order, each where the previous ends)";
    double sum = 0;
    for (int u = r.first; u < r.first + r.count && u < static_cast<int>(costs.size()); ++u)
      sum += costs[static_cast<std::size_t>(u)];
    if (sum > worst) worst = sum, worst_stage = s;
    next = r.first + r.count;
  }
  if (next != static_cast<int>(costs.size()))
    return what + " = " + show(got) + ": the stages end at unit " + std::to_string(next) +
           " but there are " + std::to_string(costs.size()) + " units";
  const auto [best, ranges] = best_split(costs, stages);
  if (worst > best * (1 + 1e-12) + 1e-12)
    return what + " = " + show(got) + ": its slowest stage (stage " + std::to_string(worst_stage) +
           ") costs " + number(worst) + "; the best split's slowest costs " + number(best) +
           ", e.g. " + show(ranges);
  return "";
}

TEST(Puzzle5_1_partition, SplitsMakeTheSlowestStageAsCheapAsPossible) {
  std::vector<std::vector<double>> cases = {
      {1, 1, 1, 1},
      {5, 1, 1, 1, 1, 5},
      {1, 2, 3, 4, 5, 6, 7, 8},
      {10, 1, 1, 1, 1, 1, 1, 10},
      {0, 0, 3, 0, 0},
      {7},
      {2, 9, 2, 2, 9, 2, 2, 2, 9, 2},
  };
  // A GPT's own units by parameters: a light embedding, equal blocks, a heavy head.
  TrainConfig config = pipeline_config(6, 4);
  Trainer trainer(config);
  cases.push_back(unit_costs_by_parameters(trainer.model()));
  std::mt19937_64 rng(5);
  for (int i = 0; i < 6; ++i) {
    std::vector<double> random(static_cast<std::size_t>(3 + rng() % 8));
    for (double& c : random) c = static_cast<double>(1 + rng() % 20);
    cases.push_back(random);
  }
  int failures = 0;
  for (const auto& costs : cases)
    for (int stages = 1; stages <= static_cast<int>(costs.size()) && failures < 3; ++stages) {
      const std::string problem = check_partition(costs, stages);
      if (!problem.empty()) ADD_FAILURE() << problem, ++failures;
    }
}

TEST(Puzzle5_1_partition, BadRequestsAreErrorsThatSayWhy) {
  auto expect_error = [](const std::vector<double>& costs, int stages, const std::string& word) {
    const std::string what = "partition_units(" + show(costs) + ", " + std::to_string(stages) + ")";
    try {
      partition_units(costs, stages);
      ADD_FAILURE() << what << " returned; expected a dtp::Error";
    } catch (const dtp::NotSolved&) {
      throw;
    } catch (const dtp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos)
          << what << "'s error should name " << word << "; it says: " << e.what();
    }
  };
  expect_error({1, 1, 1, 1}, 5, "5");  // more stages than units: names the stages
  expect_error({1, 1, 1, 1}, 5, "4");  // ... and the units
  expect_error({1, 1, 1}, 0, "0");
  expect_error({1, -2, 1}, 2, "unit 1");
  expect_error({1, 2, NAN}, 2, "unit 2");
}

}  // namespace
}  // namespace dtp::testing::ch05
