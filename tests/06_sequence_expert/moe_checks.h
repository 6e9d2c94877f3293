// What the chapter 06 mixture-of-experts checkers share: a small MoE (a
// Block's MoeMlp gives the weights), the routing rules worked out here
// (support/moe_reference.h: plain loops, no runtime or puzzle code) with the
// mistakes a wrong routing may look like, and comparisons that name the
// token, expert, parameter and element.
//
// Where they run: weights and tokens live on the rank's device
// (comm.device(); checker_device() outside ranks) in checker_dtype(): f64
// on the CPU, f32 under DTP_CHECK_DTYPE=f32 and on a GPU. The host layer
// (support/moe_reference) and the finite differences run in f64 on values
// read exactly from those tensors, so they are the exact answer in either
// dtype; the runtime's MoeMlp, 6.7's peer, runs in the checker's dtype like
// the puzzle. The host's routing is the answer in f32 too only when no two
// probabilities the rules compare lie within f32 rounding of each other:
// routing_well_posed() checks that of every case. Routing fields, drops,
// message counts and bytes (of the dtype's element size) are exact in both
// dtypes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "06_sequence_expert/sequence_expert.h"
#include "runtime/nn_test_helpers.h"
#include "sp_checks.h"  // degrees()
#include "support/checker_precision.h"
#include "support/moe_reference.h"
#include "support/training.h"

namespace dtp::testing::ch06 {

using namespace dtp::ch06;

// A tiny model config with E experts, top-k and a capacity factor, on @p on
// (a rank's comm.device()) in checker_dtype(on).
inline GPTConfig moe_config(int experts, int top_k, double capacity_factor,
                            Device on = checker_device()) {
  GPTConfig c = tiny_f64_config();
  c.dtype = checker_dtype(on);
  c.device = on;
  c.seed = 606;
  c.experts = experts;
  c.top_k = top_k;
  c.capacity_factor = capacity_factor;
  c.aux_loss_coef = 0.3;  // large, so its gradient shows next to the main loss's
  return c;
}

/// The expert a parameter belongs to ("...expert.<e>...."), or -1 for one
/// every rank holds (router, attention, norms).
inline int expert_of(const std::string& name) {
  const auto at = name.find(".expert.");
  return at == std::string::npos ? -1 : std::stoi(name.substr(at + 8));
}

inline std::string case_name(int experts, int top_k, double capacity_factor) {
  return "E " + std::to_string(experts) + ", top-" + std::to_string(top_k) + ", capacity factor " +
         number(capacity_factor);
}

// N tokens x [N, C], uniform in [-1, 1), seeded, on @p on in checker_dtype(on).
inline Tensor random_tokens(std::int64_t N, std::int64_t C, std::uint64_t seed,
                            Device on = checker_device()) {
  return Tensor::random_uniform({N, C}, seed, -1.0, 1.0, checker_dtype(on), on);
}

// --- Tolerances ---------------------------------------------------------------------------
// In f64 each keeps the number it always had. In f32 each is n roundings of
// 2^-24 (6e-8) x the magnitude, checked against the worst difference
// measured on the reference over every case.

// A layer's output y or input gradient dx, token by token, against the host
// layer (exact) or the runtime's MoeMlp in the same dtype. A row sums k <= 3
// experts' outputs, each 16 products of GELU'd sums of 8 products, scaled
// by a router probability: ~80 roundings of 6e-8 of values up to ~1 is 5e-6.
// Measured at most 1.3e-7 (y against the host; against the runtime's
// MoeMlp, y and dx agree bit for bit on the CPU). A dropped choice still
// added, or a row left out, moves a token's row by 1e-2 or more.
inline Closeness moe_row_tolerance(DType dtype) {
  return tolerance(dtype, {1e-10, 1e-9}, {5e-6, 5e-6});
}

// aux_loss() against the host's balance loss from f64 probabilities:
// coef 0.3 x E sum_e f_e P_e (about 1), where f_e counts choices (exact)
// and P_e averages probabilities that each carry ~16 roundings of the f32
// router (8 products, exp, sum, divide) of 6e-8: 1e-6 relative, so at most
// 3e-7 of the loss; 1e-6 bounds it. Measured at most 1.9e-9. A wrong f_e or
// P_e moves the loss by 1e-2 or more.
inline double aux_loss_tolerance(DType dtype) { return tolerance(dtype, 1e-13, 1e-6); }

// Gradients and dx of MoeLayer against central differences of the runtime's
// layer in f64 (an f64 twin with the same weights, step 1e-5, whose own
// error is ~1e-8). In f32 the puzzle's backward rounds: a weight gradient
// sums 12 tokens' terms through the expert MLP and the softmax, ~20
// roundings each: ~250 roundings of 6e-8 of values up to ~0.5 is 1e-5,
// absolute and relative. Measured at most 2.3e-7 (dx of magnitude 0.26;
// weights 2.2e-7). A missing balance-loss share or a lost expert term moves
// a gradient by 1e-3 or more.
inline Closeness finite_difference_tolerance(DType dtype) {
  return tolerance(dtype, {1e-8, 1e-6}, {1e-5, 1e-5});
}

// Expert-parallel gradients against the runtime's MoeMlp run rank by rank
// in the same dtype: an expert's sum over every rank's tokens may be added
// in another order (one batch of gathered rows instead of m batches): up to
// 4 x 16 tokens' terms of magnitude up to ~3, 64 roundings x 6e-8 x 3 is
// 1.2e-5; 1e-5 absolute and relative. Measured 0: on the CPU both add in the
// same order. An expert missing one rank's rows is off by a quarter or more.
inline Closeness peer_gradient_tolerance(DType dtype) {
  return tolerance(dtype, {1e-11, 1e-9}, {1e-5, 1e-5});
}

// "" when routing the runtime's probabilities @p probs (the dtype the puzzle
// computes in) chooses, keeps and drops the same as routing the host's f64
// @p host_probs: no two probabilities the rules compare lie within the
// dtype's rounding of each other, so the host's routing is the answer in
// this dtype too. Otherwise a message that the case itself does not fit the
// dtype (not the puzzle's mistake).
inline std::string routing_well_posed(const std::string& who, const std::vector<double>& host_probs,
                                      const std::vector<double>& probs, DType dtype, int E, int k,
                                      double cf) {
  const HostRouting exact = host_route(host_probs, E, k, cf), rounded = host_route(probs, E, k, cf);
  if (exact.choices == rounded.choices && exact.kept == rounded.kept &&
      exact.dropped == rounded.dropped)
    return "";
  std::set<std::pair<std::int64_t, int>> moved;
  std::set_symmetric_difference(exact.kept.begin(), exact.kept.end(), rounded.kept.begin(),
                                rounded.kept.end(), std::inserter(moved, moved.end()));
  return "the checker's case (" + who + ") does not fit " + dtype_name(dtype) +
         ": routing its probabilities in " + dtype_name(dtype) +
         " chooses or keeps other experts than routing them in f64 (" + describe_choices(moved) +
         "): two probabilities lie within rounding of each other. This is the checker's fault, "
         "not the puzzle's: the case needs another seed";
}

// The (token, expert) choices a MoeRouting kept and dropped.
inline std::pair<std::set<std::pair<std::int64_t, int>>, std::set<std::pair<std::int64_t, int>>>
choice_sets(const MoeRouting& r) {
  std::set<std::pair<std::int64_t, int>> kept, dropped;
  for (std::int64_t n = 0; n < r.tokens; ++n)
    for (int j = 0; j < r.top_k; ++j) {
      const auto at = static_cast<std::size_t>(n * r.top_k + j);
      if (at < r.kept.size() && at < r.choice.size())
        (r.kept[at] ? kept : dropped).insert({n, r.choice[at]});
    }
  return {kept, dropped};
}

// A failure unless `failure` is "" (the checkers build messages as strings).
inline void expect_pass(const std::string& failure) {
  if (!failure.empty()) ADD_FAILURE() << failure;
}

// "" or what is wrong with the kept/dropped split of `got`, with the mistake it looks like.
inline std::string compare_drops(const std::string& who, const MoeRouting& got,
                                 const std::vector<double>& probs, int E, int k, double cf) {
  const HostRouting rules = host_route(probs, E, k, cf);
  const auto [kept, dropped] = choice_sets(got);
  if (dropped == rules.dropped && kept == rules.kept) return "";
  std::set<std::pair<std::int64_t, int>> wrongly_dropped, wrongly_kept;
  std::set_difference(dropped.begin(), dropped.end(), rules.dropped.begin(), rules.dropped.end(),
                      std::inserter(wrongly_dropped, wrongly_dropped.end()));
  std::set_difference(kept.begin(), kept.end(), rules.kept.begin(), rules.kept.end(),
                      std::inserter(wrongly_kept, wrongly_kept.end()));
  std::string message = who + " keeps and drops the wrong choices (capacity " +
                        std::to_string(rules.capacity) +
                        "): dropped but the rules keep: " + describe_choices(wrongly_dropped) +
                        "; kept but the rules drop: " + describe_choices(wrongly_kept) +
                        "\n    the rules drop: " + describe_choices(rules.dropped);
  const std::pair<RoutingRule, const char*> mistakes[] = {
      {RoutingRule::token_by_token,
       "admission token by token (all of token 0's choices, then token 1's, ...); the rules admit "
       "round by "
       "round: every token's first choice in token order, then every second choice"},
      {RoutingRule::ties_to_higher_index,
       "ties given to the HIGHER expert index; they go to the lower one"},
      {RoutingRule::capacity_rounded_down, "a capacity rounded down; it is ceil(cf N k / E)"},
      {RoutingRule::unlimited_capacity,
       "no capacity limit at all; an expert takes at most the capacity"}};
  for (const auto& [rule, mistake] : mistakes) {
    const HostRouting alike = host_route(probs, E, k, cf, rule);
    if (alike.dropped == dropped && alike.kept == kept && alike.dropped != rules.dropped)
      return message + "\n    it looks like " + std::string(mistake);
  }
  return message;
}

// "" or the first field of `got` that breaks the rules, for probs [N, E].
inline std::string compare_routing(const MoeRouting& got, const std::vector<double>& probs, int E,
                                   int k, double cf) {
  const std::string who = "route_tokens (" + case_name(E, k, cf) + ", N " +
                          std::to_string(probs.size() / static_cast<std::size_t>(E)) + ")";
  const HostRouting rules = host_route(probs, E, k, cf);
  const auto N = static_cast<std::int64_t>(probs.size()) / E;
  const auto Nk = static_cast<std::size_t>(N * k);
  if (got.tokens != N || got.experts != E || got.top_k != k)
    return who + ": tokens, experts, top_k must be " + std::to_string(N) + ", " +
           std::to_string(E) + ", " + std::to_string(k) + "; got " + std::to_string(got.tokens) +
           ", " + std::to_string(got.experts) + ", " + std::to_string(got.top_k);
  if (got.capacity != rules.capacity)
    return who + ": capacity must be ceil(" + number(cf) + " x " + std::to_string(N) + " x " +
           std::to_string(k) + " / " + std::to_string(E) + ") = " + std::to_string(rules.capacity) +
           " (moe_capacity), got " + std::to_string(got.capacity);
  if (got.choice.size() != Nk || got.weight.size() != Nk || got.kept.size() != Nk)
    return who + ": choice, weight and kept must have N k = " + std::to_string(Nk) +
           " entries (token n's j-th at n k + j); got " + std::to_string(got.choice.size()) + ", " +
           std::to_string(got.weight.size()) + ", " + std::to_string(got.kept.size());
  for (std::int64_t n = 0; n < N; ++n)
    for (int j = 0; j < k; ++j) {
      const auto at = static_cast<std::size_t>(n * k + j);
      const int want = rules.choices[static_cast<std::size_t>(n)][static_cast<std::size_t>(j)],
                had = got.choice[at];
      if (had == want) continue;
      std::string message = who + ": token " + std::to_string(n) + "'s choice " +
                            std::to_string(j) + " must be expert " + std::to_string(want) +
                            " (p = " + number(probs[n * E + want]) + "), got " +
                            std::to_string(had);
      if (had >= 0 && had < E && probs[n * E + had] == probs[n * E + want])
        message += "\n    experts " + std::to_string(want) + " and " + std::to_string(had) +
                   " have the same probability: ties go to the lower index";
      else if (had >= 0 && had < E && probs[n * E + had] < probs[n * E + want])
        message += "\n    a token's choices are its most probable experts, most probable first";
      return message;
    }
  for (std::size_t at = 0; at < Nk; ++at)
    if (got.weight[at] != probs[at / static_cast<std::size_t>(k) * static_cast<std::size_t>(E) +
                                static_cast<std::size_t>(got.choice[at])])
      return who + ": weight[" + std::to_string(at) + "] (token " + std::to_string(at / k) +
             ", expert " + std::to_string(got.choice[at]) +
             ") must be that expert's probability, " + number(probs[at / k * E + got.choice[at]]) +
             " (not renormalized), got " + number(got.weight[at]);
  std::string drops = compare_drops(who, got, probs, E, k, cf);
  if (!drops.empty()) return drops;
  if (got.rows.size() != static_cast<std::size_t>(E) ||
      got.weights.size() != static_cast<std::size_t>(E))
    return who + ": rows and weights must have one entry per expert (" + std::to_string(E) +
           "), got " + std::to_string(got.rows.size()) + " and " +
           std::to_string(got.weights.size());
  for (int e = 0; e < E; ++e) {
    const auto& want = rules.rows[static_cast<std::size_t>(e)];
    const auto& had = got.rows[static_cast<std::size_t>(e)];
    if (had != want) {
      std::ostringstream out;
      out << who << ": rows[" << e << "] must list expert " << e
          << "'s tokens in the order they were admitted:";
      for (auto n : want) out << ' ' << n;
      out << "; got";
      for (auto n : had) out << ' ' << n;
      out << "\n    admission goes round by round: every token's first choice in token order, then "
             "every second "
             "choice, ...";
      return out.str();
    }
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double p = probs[static_cast<std::size_t>(want[i]) * static_cast<std::size_t>(E) +
                             static_cast<std::size_t>(e)];
      if (got.weights[static_cast<std::size_t>(e)].size() != want.size() ||
          got.weights[static_cast<std::size_t>(e)][i] != p)
        return who + ": weights[" + std::to_string(e) + "] must hold the probabilities of rows[" +
               std::to_string(e) + "], in the same order (token " + std::to_string(want[i]) + ": " +
               number(p) + ")";
    }
  }
  if (got.load.size() != static_cast<std::size_t>(E) ||
      got.importance.size() != static_cast<std::size_t>(E))
    return who + ": load and importance must have one entry per expert (" + std::to_string(E) + ")";
  for (int e = 0; e < E; ++e) {
    const auto se = static_cast<std::size_t>(e);
    if (std::abs(got.load[se] - rules.load[se]) > 1e-14)
      return who + ": load[" + std::to_string(e) +
             "] must be the share of the N k choices that picked expert " + std::to_string(e) +
             ", dropped ones included: " + number(rules.load[se]) + ", got " + number(got.load[se]);
    if (std::abs(got.importance[se] - rules.importance[se]) > 1e-14)
      return who + ": importance[" + std::to_string(e) + "] must be expert " + std::to_string(e) +
             "'s mean probability over the N tokens: " + number(rules.importance[se]) + ", got " +
             number(got.importance[se]);
  }
  return "";
}

// "" or where rows x C values `got` first differ from `expected` (row r =
// token r) by more than @p within.
inline std::string compare_token_rows(const std::string& what, const std::vector<double>& expected,
                                      const Tensor& got_tensor, std::int64_t C,
                                      const Closeness& within) {
  if (!got_tensor.defined() || got_tensor.numel() != static_cast<std::int64_t>(expected.size()))
    return what + " must have " + std::to_string(expected.size() / static_cast<std::size_t>(C)) +
           " rows of " + std::to_string(C) + ", got " +
           (got_tensor.defined() ? got_tensor.describe() : std::string("an undefined tensor"));
  const std::vector<double> got = got_tensor.to_vector();
  std::int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!within.holds(expected[i], got[i]) && wrong++ == 0) first = static_cast<std::int64_t>(i);
  if (wrong == 0) return "";
  bool row_zero = true;
  for (std::int64_t c = 0; c < C; ++c)
    row_zero = row_zero && got[static_cast<std::size_t>(first / C * C + c)] == 0.0;
  return what + " differs" + tolerance_note(got_tensor.dtype(), within) + " in " +
         std::to_string(wrong) + " of " + std::to_string(got.size()) +
         " elements; first at token " + std::to_string(first / C) + ", channel " +
         std::to_string(first % C) + ": expected " + number(expected[first]) + ", got " +
         number(got[first]) +
         (row_zero ? " (that token's whole row is 0: nothing was added back to it)" : "");
}

// "" or the first parameter of `unit` (named, with its element) whose gradient
// differs from `expected` (flat, the unit's layout) by more than @p within's
// absolute + relative x the larger of the two magnitudes.
inline std::string compare_unit_gradients(const std::string& who, const Unit& unit,
                                          const std::vector<double>& expected,
                                          const Closeness& within) {
  const double rtol = within.relative, atol = within.absolute;
  const std::vector<double> got = unit.grads().to_vector();
  for (const ParamView& p : unit.parameters()) {
    const std::int64_t n = p.value.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      const auto at = static_cast<std::size_t>(p.offset + i);
      const double a = got[at], b = expected[at];
      if (std::abs(a - b) <= rtol * std::max(std::abs(a), std::abs(b)) + atol) continue;
      std::int64_t bad = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const auto aj = static_cast<std::size_t>(p.offset + j);
        bad += !(std::abs(got[aj] - expected[aj]) <=
                 rtol * std::max(std::abs(got[aj]), std::abs(expected[aj])) + atol);
      }
      std::string note;
      if (unit.grads().dtype() != DType::f64) {
        // within.str() ends in |expected|; this comparison scales by the larger magnitude.
        std::string bound = within.str();
        bound.replace(bound.rfind("|expected|"), 10, "max(|expected|, |got|)");
        note = std::string(" (") + dtype_name(unit.grads().dtype()) + ", tolerance " + bound + ")";
      }
      return who + ": the gradient of " + p.name + " differs" + note + " in " +
             std::to_string(bad) + " of " + std::to_string(n) + " elements; first at element " +
             std::to_string(i) + ": expected " + number(b) + ", got " + number(a) +
             (a == 0 ? " (0: no gradient reached it)" : "");
    }
  }
  return "";
}

}  // namespace dtp::testing::ch06
