// The routing rules of dtp/moe_routing.h, on the host: top-k per token, then
// admission round by round (all first choices in token order, then all
// second choices) until each expert's capacity is reached.
#include "dtp/moe_routing.h"

#include <cmath>
#include <sstream>

#include "dtp/error.h"

namespace dtp {

std::int64_t moe_capacity(std::int64_t tokens, int experts, int top_k, double capacity_factor) {
  DTP_CHECK(experts >= 1, "MoE routing: experts must be at least 1, got ", experts);
  DTP_CHECK(top_k >= 1 && top_k <= experts, "MoE routing: top_k must be in [1, experts = ", experts,
            "], got ", top_k);
  DTP_CHECK(capacity_factor > 0 && std::isfinite(capacity_factor),
            "MoE routing: capacity_factor must be positive, got ", capacity_factor);
  DTP_CHECK(tokens >= 0, "MoE routing: tokens must be >= 0, got ", tokens);
  // Exact for the even case: tokens * k / E slots when the factor is 1,
  // without a 1e-16 excess rounding up to one more slot.
  const double slots = capacity_factor * static_cast<double>(tokens * top_k) / experts;
  const double rounded = std::round(slots);
  return static_cast<std::int64_t>(
      std::abs(slots - rounded) < 1e-9 * std::max(1.0, slots) ? rounded : std::ceil(slots));
}

MoeRouting moe_route(const std::vector<double>& probs, int experts, int top_k,
                     double capacity_factor) {
  DTP_CHECK(experts >= 1, "MoE routing: experts must be at least 1, got ", experts);
  DTP_CHECK(probs.size() % static_cast<std::size_t>(experts) == 0, "MoE routing: ", probs.size(),
            " probabilities do not split into rows of E = ", experts, " experts");
  MoeRouting r;
  r.tokens = static_cast<std::int64_t>(probs.size()) / experts;
  r.experts = experts;
  r.top_k = top_k;
  r.capacity = moe_capacity(r.tokens, experts, top_k, capacity_factor);
  const std::size_t N = static_cast<std::size_t>(r.tokens), E = static_cast<std::size_t>(experts),
                    k = static_cast<std::size_t>(top_k);
  r.choice.resize(N * k);
  r.weight.resize(N * k);
  r.kept.assign(N * k, 0);
  r.rows.resize(E);
  r.weights.resize(E);
  r.load.assign(E, 0.0);
  r.importance.assign(E, 0.0);

  // Top-k: k passes of "largest not yet taken"; strict > keeps the lower index on a tie.
  for (std::size_t n = 0; n < N; ++n) {
    const double* row = &probs[n * E];
    std::vector<char> taken(E, 0);
    for (std::size_t j = 0; j < k; ++j) {
      std::size_t best = E;
      for (std::size_t e = 0; e < E; ++e)
        if (!taken[e] && (best == E || row[e] > row[best])) best = e;
      taken[best] = 1;
      r.choice[n * k + j] = static_cast<int>(best);
      r.weight[n * k + j] = row[best];
      r.load[best] += 1.0;
    }
    for (std::size_t e = 0; e < E; ++e) r.importance[e] += row[e];
  }
  for (std::size_t e = 0; e < E; ++e) {
    r.load[e] /= N == 0 ? 1.0 : static_cast<double>(N * k);
    r.importance[e] /= N == 0 ? 1.0 : static_cast<double>(N);
  }

  // Admission: round j admits every token's j-th choice, in token order.
  for (std::size_t j = 0; j < k; ++j)
    for (std::size_t n = 0; n < N; ++n) {
      const std::size_t at = n * k + j;
      auto& taken_by = r.rows[static_cast<std::size_t>(r.choice[at])];
      if (static_cast<std::int64_t>(taken_by.size()) >= r.capacity) continue;
      r.kept[at] = 1;
      taken_by.push_back(static_cast<std::int32_t>(n));
      r.weights[static_cast<std::size_t>(r.choice[at])].push_back(r.weight[at]);
    }
  return r;
}

std::int64_t MoeRouting::dropped() const {
  std::int64_t count = 0;
  for (char k : kept) count += k ? 0 : 1;
  return count;
}

double MoeRouting::balance_loss() const {
  double total = 0;
  for (int e = 0; e < experts; ++e)
    total += load[static_cast<std::size_t>(e)] * importance[static_cast<std::size_t>(e)];
  return experts * total;
}

double MoeRouting::balance_gradient(int expert) const {
  DTP_CHECK(expert >= 0 && expert < experts, "MoeRouting::balance_gradient: expert ", expert,
            " is not in [0, ", experts, ")");
  return tokens == 0
             ? 0.0
             : experts * load[static_cast<std::size_t>(expert)] / static_cast<double>(tokens);
}

std::string MoeRouting::describe() const {
  std::ostringstream out;
  out << "N " << tokens << ", E " << experts << ", top-" << top_k << ", capacity " << capacity
      << ": " << dropped() << " of " << tokens * top_k << " choices dropped; tokens per expert";
  for (const auto& taken : rows) out << ' ' << taken.size();
  return out.str();
}

}  // namespace dtp
