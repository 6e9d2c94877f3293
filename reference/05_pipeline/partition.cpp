// Puzzle 5.1: split the units into p contiguous stages so that the slowest
// stage is as fast as it can be (the pipeline runs at its pace).
//
// best[k][i] = the cheapest "most expensive stage" when the first i units
// form k stages; the last of them is units [j, i) for some j. O(p n^2) on a
// model of n units, nothing next to one training step.
#include <cmath>
#include <limits>

#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {

std::vector<UnitRange> partition_units(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  DTP_CHECK(stages >= 1, "partition_units: stages must be at least 1, got ", stages);
  DTP_CHECK(stages <= n, "partition_units: ", stages, " stages but only ", n,
            " units: each stage needs at least one");
  for (int u = 0; u < n; ++u)
    DTP_CHECK(std::isfinite(costs[static_cast<std::size_t>(u)]) &&
                  costs[static_cast<std::size_t>(u)] >= 0,
              "partition_units: unit ", u, "'s cost is ", costs[static_cast<std::size_t>(u)],
              "; costs must be finite and >= 0");
  std::vector<double> prefix(static_cast<std::size_t>(n) + 1, 0.0);
  for (int u = 0; u < n; ++u)
    prefix[static_cast<std::size_t>(u) + 1] =
        prefix[static_cast<std::size_t>(u)] + costs[static_cast<std::size_t>(u)];
  const auto sum = [&](int from, int to) {
    return prefix[static_cast<std::size_t>(to)] - prefix[static_cast<std::size_t>(from)];
  };
  const double inf = std::numeric_limits<double>::infinity();
  const auto at = [&](int k, int i) {
    return static_cast<std::size_t>(k) * static_cast<std::size_t>(n + 1) +
           static_cast<std::size_t>(i);
  };
  std::vector<double> best(at(stages + 1, 0), inf);
  std::vector<int> cut(best.size(), 0);
  best[at(0, 0)] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int i = k; i <= n - (stages - k); ++i)
      for (int j = k - 1; j < i; ++j) {
        const double worst = std::max(best[at(k - 1, j)], sum(j, i));
        if (worst < best[at(k, i)]) {
          best[at(k, i)] = worst;
          cut[at(k, i)] = j;
        }
      }
  std::vector<UnitRange> ranges(static_cast<std::size_t>(stages));
  for (int k = stages, i = n; k >= 1; --k) {
    const int j = cut[at(k, i)];
    ranges[static_cast<std::size_t>(k) - 1] = UnitRange{j, i - j};
    i = j;
  }
  return ranges;
}

}  // namespace dtp::ch05
