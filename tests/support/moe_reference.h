// An independent mixture of experts for the checkers: plain loops in double
// over plain vectors, written from the rules in dtp/moe_routing.h and sharing
// no code with the runtime's MoeMlp or any puzzle. The runtime tests check
// MoeMlp against it; chapter 06's checkers check the puzzles against it.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dtp/nn.h"

namespace dtp::testing {

/// One expert's MLP weights, row-major like the runtime's Linear.
struct HostExpert {
  std::vector<double> fc_w, fc_b;      ///< [H, C], [H]
  std::vector<double> proj_w, proj_b;  ///< [C, H], [C]
};

/// A whole MoE layer's weights.
struct HostMoeWeights {
  std::int64_t C = 0, H = 0;        ///< width and expert hidden width
  std::vector<double> router;       ///< [E, C]
  std::vector<HostExpert> experts;  ///< E of them
  /// Reads them from the "<prefix>.router.weight", "<prefix>.expert.<e>...."
  /// parameters of @p unit (a Block built with config.experts > 0).
  static HostMoeWeights from_unit(const Unit& unit, const std::string& prefix, int experts);
};

/// The routing rules of dtp/moe_routing.h, and mistakes a checker may name
/// when a routing looks like one of them.
enum class RoutingRule {
  rules,                  ///< the rules
  token_by_token,         ///< admits all of token 0's choices, then token 1's, ...
  ties_to_higher_index,   ///< equal probabilities go to the higher expert index
  capacity_rounded_down,  ///< floor(cf N k / E) instead of the ceiling
  unlimited_capacity,     ///< nothing is ever dropped
};

/// One batch's routing, by @p rule.
struct HostRouting {
  std::int64_t capacity = 0;                    ///< slots per expert
  std::vector<std::vector<int>> choices;        ///< per token: its k experts, most probable first
  std::set<std::pair<std::int64_t, int>> kept;  ///< (token, expert) choices that got a slot
  std::set<std::pair<std::int64_t, int>> dropped;  ///< (token, expert) choices dropped
  std::vector<std::vector<std::int32_t>> rows;     ///< per expert: its tokens, in admission order
  std::vector<double> load, importance;            ///< f_e and P_e
  double balance_loss = 0;                         ///< E sum_e f_e P_e
};

/// Routes probs [N, E] (row-major) over E experts, top-k, by @p rule.
HostRouting host_route(const std::vector<double>& probs, int experts, int top_k,
                       double capacity_factor, RoutingRule rule = RoutingRule::rules);

/// What the checkers compare.
struct HostMoeResult {
  std::vector<double> y;                           ///< [N, C]
  std::vector<double> probs;                       ///< [N, E]
  std::set<std::pair<std::int64_t, int>> kept;     ///< (token, expert) choices that got a slot
  std::set<std::pair<std::int64_t, int>> dropped;  ///< (token, expert) choices dropped
  double balance_loss = 0;                         ///< E sum_e f_e P_e
  std::int64_t capacity = 0;                       ///< slots per expert
};

/// The layer on rows x [N, C] (row-major), by the rules of dtp/moe_routing.h
/// (or, to name a mistake, by another @p rule).
HostMoeResult host_moe_forward(const HostMoeWeights& w, const std::vector<double>& x, int top_k,
                               double capacity_factor, RoutingRule rule = RoutingRule::rules);

/// "token 3's choice of expert 1" lists for a message: the first few of @p set.
std::string describe_choices(const std::set<std::pair<std::int64_t, int>>& set);

}  // namespace dtp::testing
