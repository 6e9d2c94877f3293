// What reaches the router's probabilities in a MoE backward, shared by the
// one-rank layer and the expert-parallel one (both own all of their tokens'
// routing, wherever the experts run).
#pragma once

#include <vector>

#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

// d (coef * balance loss) / d probs, row-major [N, E]: coef * E f_e / N in
// every row (f counts choices, so only P carries a gradient).
inline std::vector<double> balance_loss_gradient(const MoeRouting& routing, double coef) {
  const auto E = static_cast<std::size_t>(routing.experts);
  std::vector<double> d_probs(static_cast<std::size_t>(routing.tokens) * E);
  for (std::size_t i = 0; i < d_probs.size(); ++i)
    d_probs[i] = coef * routing.balance_gradient(static_cast<int>(i % E));
  return d_probs;
}

// y[n] += p[n][e] * out_e[n] for the kept rows of expert e, so d p[n][e] =
// dy[n] . out_e[n]: @p d_out holds dy's rows of the expert, @p out its outputs.
inline void add_combine_weight_gradient(const MoeRouting& routing, int expert, const Tensor& d_out,
                                        const Tensor& out, std::vector<double>& d_probs) {
  const auto& rows = routing.rows[static_cast<std::size_t>(expert)];
  Tensor dots = Tensor::empty({static_cast<std::int64_t>(rows.size())}, d_out.dtype(),
                              d_out.device(), MemoryCategory::other);
  ops::row_dot(d_out, out, dots);
  const std::vector<double> host = dots.to_vector();
  for (std::size_t i = 0; i < rows.size(); ++i)
    d_probs[static_cast<std::size_t>(rows[i]) * static_cast<std::size_t>(routing.experts) +
            static_cast<std::size_t>(expert)] += host[i];
}

}  // namespace dtp::ch06
