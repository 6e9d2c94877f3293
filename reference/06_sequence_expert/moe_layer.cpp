// Reference for puzzle 6.6: the routing rules, then a mixture of experts on
// one rank. Routing is a few integers per token, decided on the host; the
// experts see only their own rows, so an expert's cost follows its load.
#include <algorithm>
#include <numeric>

#include "06_sequence_expert/sequence_expert.h"
#include "moe_gradients.h"

namespace dtp::ch06 {

MoeRouting route_tokens(const std::vector<double>& probs, int experts, int top_k,
                        double capacity_factor) {
  DTP_CHECK(experts >= 1 && probs.size() % static_cast<std::size_t>(experts) == 0,
            "route_tokens: ", probs.size(),
            " probabilities do not split into rows of E = ", experts, " experts");
  const auto N = static_cast<std::int64_t>(probs.size()) / experts;
  const auto E = static_cast<std::size_t>(experts), k = static_cast<std::size_t>(top_k);
  MoeRouting r;
  r.tokens = N, r.experts = experts, r.top_k = top_k;
  r.capacity =
      moe_capacity(N, experts, top_k, capacity_factor);  // also checks top_k and the factor
  r.choice.resize(static_cast<std::size_t>(N) * k), r.weight.resize(r.choice.size());
  r.kept.assign(r.choice.size(), 0);
  r.rows.assign(E, {}), r.weights.assign(E, {});
  r.load.assign(E, 0.0), r.importance.assign(E, 0.0);

  // Top-k per token: a stable sort by probability keeps the lower index first on ties.
  std::vector<int> order(E);
  for (std::int64_t n = 0; n < N; ++n) {
    const double* p = probs.data() + static_cast<std::size_t>(n) * E;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t at = static_cast<std::size_t>(n) * k + j;
      r.choice[at] = order[j];
      r.weight[at] = p[order[j]];
      r.load[static_cast<std::size_t>(order[j])] += 1.0 / static_cast<double>(N * top_k);
    }
    for (std::size_t e = 0; e < E; ++e) r.importance[e] += p[e] / static_cast<double>(N);
  }
  // Admission round by round, so that no second choice takes a first choice's slot.
  for (std::size_t j = 0; j < k; ++j)
    for (std::int64_t n = 0; n < N; ++n) {
      const std::size_t at = static_cast<std::size_t>(n) * k + j;
      const auto e = static_cast<std::size_t>(r.choice[at]);
      if (static_cast<std::int64_t>(r.rows[e].size()) >= r.capacity) continue;  // full: dropped
      r.kept[at] = 1;
      r.rows[e].push_back(static_cast<std::int32_t>(n));
      r.weights[e].push_back(r.weight[at]);
    }
  return r;
}

Tensor MoeLayer::forward(const Tensor& x) {
  probs_ = router_probabilities(w_, x, router_saved_);
  routing_ = route_tokens(probs_.to_vector(), static_cast<int>(w_.experts.size()), w_.top_k,
                          w_.capacity_factor);
  aux_loss_ = w_.aux_loss_coef * routing_.balance_loss();
  Tensor y = Tensor::zeros(x.shape(), x.dtype(), x.device(), MemoryCategory::activations);
  outputs_.assign(w_.experts.size(), Tensor());
  saved_.assign(w_.experts.size(), MlpSaved{});
  for (std::size_t e = 0; e < w_.experts.size(); ++e) {
    const auto& rows = routing_.rows[e];
    if (rows.empty()) continue;  // an idle expert: no work
    outputs_[e] = w_.experts[e].forward(gather_rows(x, rows), saved_[e]);
    Tensor weighted = outputs_[e].clone();
    ops::scale_rows(weighted, Tensor::from_values(routing_.weights[e], x.dtype(), x.device()));
    scatter_add_rows(weighted, rows, y);
  }
  return y;
}

Tensor MoeLayer::backward(const Tensor& dy) {
  DTP_CHECK(probs_.defined(),
            "MoeLayer backward: no forward to go back through (or backward already ran)");
  std::vector<double> d_probs = balance_loss_gradient(routing_, w_.aux_loss_coef);
  Tensor dx = Tensor::zeros(dy.shape(), dy.dtype(), dy.device(), MemoryCategory::other);
  for (std::size_t e = 0; e < w_.experts.size(); ++e) {
    const auto& rows = routing_.rows[e];
    if (rows.empty()) continue;
    Tensor d_out = gather_rows(dy, rows);  // the rows of dy expert e wrote into
    add_combine_weight_gradient(routing_, static_cast<int>(e), d_out, outputs_[e], d_probs);
    ops::scale_rows(d_out, Tensor::from_values(routing_.weights[e], dy.dtype(), dy.device()));
    scatter_add_rows(w_.experts[e].backward(d_out, saved_[e]), rows, dx);
  }
  ops::axpy(dx, 1.0, router_backward(w_, probs_, d_probs, router_saved_));
  probs_ = Tensor();
  outputs_.clear();
  return dx;
}

}  // namespace dtp::ch06
