#include "support/moe_reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace dtp::testing {

namespace {
std::vector<double> values_of(const Unit& unit, const std::string& name) {
  return unit.parameter(name).value.to_vector();
}

double gelu(double v) {
  return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}
}  // namespace

HostRouting host_route(const std::vector<double>& probs, int experts, int top_k,
                       double capacity_factor, RoutingRule rule) {
  const int E = experts;
  const auto N = static_cast<std::int64_t>(probs.size()) / E;
  HostRouting r;
  r.choices.resize(static_cast<std::size_t>(N));
  r.rows.assign(static_cast<std::size_t>(E), {});
  r.load.assign(static_cast<std::size_t>(E), 0.0),
      r.importance.assign(static_cast<std::size_t>(E), 0.0);
  // Top-k by a stable sort on descending probability (ties: lower index first).
  for (std::int64_t n = 0; n < N; ++n) {
    std::vector<int> order(static_cast<std::size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    if (rule == RoutingRule::ties_to_higher_index) std::reverse(order.begin(), order.end());
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return probs[n * E + a] > probs[n * E + b]; });
    r.choices[n].assign(order.begin(), order.begin() + top_k);
    for (int e : r.choices[n]) r.load[e] += 1.0 / static_cast<double>(N * top_k);
    for (int e = 0; e < E; ++e) r.importance[e] += probs[n * E + e] / static_cast<double>(N);
  }
  for (int e = 0; e < E; ++e) r.balance_loss += E * r.load[e] * r.importance[e];
  // Capacity (the 1e-9 makes an exact even split exact in floating point).
  const double slots = capacity_factor * static_cast<double>(N * top_k) / E;
  r.capacity = rule == RoutingRule::unlimited_capacity ? N
               : rule == RoutingRule::capacity_rounded_down
                   ? static_cast<std::int64_t>(std::floor(slots + 1e-9))
                   : static_cast<std::int64_t>(std::ceil(slots - 1e-9));
  // Admission: round by round (or, for the mistake, token by token).
  auto admit = [&](std::int64_t n, int j) {
    const int e = r.choices[n][j];
    if (static_cast<std::int64_t>(r.rows[e].size()) < r.capacity) {
      r.rows[e].push_back(static_cast<std::int32_t>(n));
      r.kept.insert({n, e});
    } else {
      r.dropped.insert({n, e});
    }
  };
  if (rule == RoutingRule::token_by_token) {
    for (std::int64_t n = 0; n < N; ++n)
      for (int j = 0; j < top_k; ++j) admit(n, j);
  } else {
    for (int j = 0; j < top_k; ++j)
      for (std::int64_t n = 0; n < N; ++n) admit(n, j);
  }
  return r;
}

HostMoeWeights HostMoeWeights::from_unit(const Unit& unit, const std::string& prefix, int experts) {
  HostMoeWeights w;
  w.router = values_of(unit, prefix + ".router.weight");
  w.C = static_cast<std::int64_t>(w.router.size()) / experts;
  for (int e = 0; e < experts; ++e) {
    const std::string at = prefix + ".expert." + std::to_string(e);
    HostExpert ex{values_of(unit, at + ".fc.weight"), values_of(unit, at + ".fc.bias"),
                  values_of(unit, at + ".proj.weight"), values_of(unit, at + ".proj.bias")};
    w.H = static_cast<std::int64_t>(ex.fc_b.size());
    w.experts.push_back(std::move(ex));
  }
  return w;
}

HostMoeResult host_moe_forward(const HostMoeWeights& w, const std::vector<double>& x, int top_k,
                               double capacity_factor, RoutingRule rule) {
  const std::int64_t C = w.C, H = w.H, N = static_cast<std::int64_t>(x.size()) / C;
  const int E = static_cast<int>(w.experts.size());
  HostMoeResult r;
  r.y.assign(static_cast<std::size_t>(N * C), 0.0);
  r.probs.assign(static_cast<std::size_t>(N * E), 0.0);
  // Router softmax.
  for (std::int64_t n = 0; n < N; ++n) {
    std::vector<double> logit(E);
    for (int e = 0; e < E; ++e)
      for (std::int64_t c = 0; c < C; ++c) logit[e] += x[n * C + c] * w.router[e * C + c];
    const double top = *std::max_element(logit.begin(), logit.end());
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(logit[e] - top);
    for (int e = 0; e < E; ++e) r.probs[n * E + e] = std::exp(logit[e] - top) / sum;
  }
  const HostRouting routing = host_route(r.probs, E, top_k, capacity_factor, rule);
  r.kept = routing.kept, r.dropped = routing.dropped;
  r.balance_loss = routing.balance_loss, r.capacity = routing.capacity;
  // Each kept choice adds prob * expert(x[n]).
  for (const auto& [n, e] : r.kept) {
    const HostExpert& ex = w.experts[e];
    std::vector<double> hidden(H);
    for (std::int64_t h = 0; h < H; ++h) {
      double v = ex.fc_b[h];
      for (std::int64_t c = 0; c < C; ++c) v += x[n * C + c] * ex.fc_w[h * C + c];
      hidden[h] = gelu(v);
    }
    const double p = r.probs[n * E + e];
    for (std::int64_t c = 0; c < C; ++c) {
      double v = ex.proj_b[c];
      for (std::int64_t h = 0; h < H; ++h) v += hidden[h] * ex.proj_w[c * H + h];
      r.y[n * C + c] += p * v;
    }
  }
  return r;
}

std::string describe_choices(const std::set<std::pair<std::int64_t, int>>& set) {
  std::ostringstream out;
  int shown = 0;
  for (const auto& [n, e] : set) {
    if (shown == 6) {
      out << " and " << set.size() - 6 << " more";
      break;
    }
    out << (shown++ ? ", " : "") << "token " << n << " -> expert " << e;
  }
  if (set.empty()) out << "none";
  return out.str();
}

}  // namespace dtp::testing
