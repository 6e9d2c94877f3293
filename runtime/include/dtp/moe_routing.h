/// @file moe_routing.h
/// @brief Where a mixture of experts sends each token: top-k choice,
/// capacity, the drop order, combine weights and the load-balancing loss.
///
/// The routing of one batch is a handful of small integers per token, so it
/// is decided on the host from the router's probabilities (N x E numbers)
/// and the result is plain vectors. The rules, in full (chapter 06 teaches
/// them and its puzzles and checkers follow them exactly):
///
/// - **Top-k.** Token n picks the k experts with the largest probability,
///   most probable first; equal probabilities go to the lower expert index.
/// - **Capacity.** Expert e takes at most ceil(capacity_factor * N * k / E)
///   tokens. capacity_factor = 1 is exactly enough for a perfectly even
///   split; E / k is enough for any split (capacity N).
/// - **Drop order.** Choices are admitted round by round: every token's
///   first choice in token order, then every token's second choice, and so
///   on. A choice that finds its expert full is dropped: that expert adds
///   nothing to the token (the residual stream still carries it). So a first
///   choice is never displaced by anyone's second choice, and within a round
///   earlier tokens win.
/// - **Combine weights.** A kept choice contributes its router probability
///   times the expert's output; the probabilities of the k choices are not
///   renormalized to sum to 1.
/// - **Load-balancing loss** (Switch Transformer): E * sum_e f_e P_e, with
///   f_e the fraction of the N k choices that picked e (before drops) and
///   P_e the mean probability of e over the N tokens. It is 1 when both are
///   uniform and grows as the router favours some experts. f is a count, so
///   the gradient flows only through P: d/d probs[n][e] = E f_e / N.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtp {

/// The routing of one batch of N tokens over E experts with k choices each.
struct MoeRouting {
  std::int64_t tokens = 0;    ///< N
  int experts = 0;            ///< E
  int top_k = 0;              ///< k
  std::int64_t capacity = 0;  ///< the most tokens one expert takes
  /// choice[n * k + j]: the expert of token n's j-th choice (j = 0 the most probable).
  std::vector<int> choice;
  /// weight[n * k + j]: that expert's router probability for token n (the combine weight).
  std::vector<double> weight;
  /// kept[n * k + j]: 1 when the choice got a slot, 0 when its expert was full.
  std::vector<char> kept;
  /// rows[e]: the tokens expert e takes, in the order they were admitted.
  std::vector<std::vector<std::int32_t>> rows;
  /// weights[e][i]: the combine weight of token rows[e][i] for expert e.
  std::vector<std::vector<double>> weights;
  /// load[e] = f_e: the fraction of the N k choices that picked e, before drops.
  std::vector<double> load;
  /// importance[e] = P_e: the mean router probability of e over the N tokens.
  std::vector<double> importance;

  /// Choices dropped because their expert was full.
  std::int64_t dropped() const;
  /// E * sum_e f_e P_e: 1 when perfectly balanced (multiply by the coefficient).
  double balance_loss() const;
  /// d balance_loss / d probs[n][e] = E f_e / N (the same for every token n).
  double balance_gradient(int expert) const;
  /// "N 32, E 4, top-2, capacity 20: 3 of 64 choices dropped; load 0.31 0.22 ...".
  std::string describe() const;
};

/// ceil(capacity_factor * tokens * top_k / experts), computed so that
/// capacity_factor 1 with an even split is exact; dtp::Error for
/// capacity_factor <= 0, experts < 1 or top_k outside [1, experts].
std::int64_t moe_capacity(std::int64_t tokens, int experts, int top_k, double capacity_factor);

/// Routes N = probs.size() / experts tokens (probs row-major [N, E], each row
/// a probability distribution) by the rules of this file's comment. Throws
/// dtp::Error naming the argument for a size that does not divide, a bad
/// top_k or a non-positive capacity factor.
MoeRouting moe_route(const std::vector<double>& probs, int experts, int top_k,
                     double capacity_factor);

}  // namespace dtp
