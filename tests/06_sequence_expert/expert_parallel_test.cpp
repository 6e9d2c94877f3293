// Puzzle 6.7: expert parallelism. On m ranks, each with its own tokens,
// ExpertParallelMoe must give every rank the output, routing and input
// gradient of the one-rank layer on its tokens alone, the router the
// gradient of its own tokens, and each expert (on its owner only) the sum of
// its gradients over every rank's tokens; the peer is the runtime's finished
// MoeMlp (itself checked against host loops and finite differences), run
// in the same dtype on the same device. The communication is two
// all_to_all_v each way, carrying kept choices only.
#include "moe_checks.h"

namespace dtp::testing::ch06 {
namespace {

constexpr std::int64_t kTokens = 16;  // per rank

// Rank @p rank's tokens and output gradient, on @p on in checker_dtype(on).
Tensor tokens_of(int rank, std::int64_t C, Device on) {
  return random_tokens(kTokens, C, 100 + static_cast<std::uint64_t>(rank), on);
}
Tensor dy_of(int rank, std::int64_t C, Device on) {
  return random_tokens(kTokens, C, 200 + static_cast<std::uint64_t>(rank), on);
}

// The gradient of the loss sum_r (sum(y_r * dy_r) + aux_r) that rank r's
// unit must hold: router from rank r's tokens; expert e, on its owner, from
// every rank's tokens; other experts zero. Computed with MoeMlp, rank by
// rank, in the config's dtype on its device.
std::vector<double> expected_gradients(const GPTConfig& config, int m, int r, int first,
                                       int local) {
  Block all(config, 0), own(config, 0);
  all.zero_grad(), own.zero_grad();
  for (int i = 0; i < m; ++i) {
    for (Block* block : {&all, &own}) {
      if (block == &own && i != r) continue;
      MoeSaved saved;
      block->moe.forward(tokens_of(i, config.d_model, config.device), saved);
      block->moe.backward(dy_of(i, config.d_model, config.device), saved);
    }
  }
  std::vector<double> expected(static_cast<std::size_t>(all.numel()), 0.0);
  const std::vector<double> g_all = all.grads().to_vector(), g_own = own.grads().to_vector();
  for (const ParamView& p : all.parameters()) {
    const bool router = p.name.find(".router.") != std::string::npos;
    bool mine = false;
    for (int e = first; e < first + local; ++e)
      mine = mine || p.name.find(".expert." + std::to_string(e) + ".") != std::string::npos;
    for (std::int64_t i = 0; i < p.value.numel(); ++i) {
      const auto at = static_cast<std::size_t>(p.offset + i);
      expected[at] = router ? g_own[at] : mine ? g_all[at] : 0.0;
    }
  }
  return expected;
}

// One rank's whole check: routing, output, aux loss, dx and gradients.
std::string run_rank(Comm& ep, int E, int k, double cf) {
  const int m = ep.size(), r = ep.rank();
  const Device on = ep.device();
  const GPTConfig config = moe_config(E, k, cf, on);
  const Closeness rows = moe_row_tolerance(config.dtype);
  const std::int64_t C = config.d_model;
  Block block(config, 0);
  block.zero_grad();
  ExpertParallelMoe layer(ep, block.moe);
  const std::string who =
      "rank " + std::to_string(r) + " of " + std::to_string(m) + " (" + case_name(E, k, cf) +
      ", experts " + std::to_string(layer.first_expert()) + ".." +
      std::to_string(layer.first_expert() + layer.local_experts() - 1) + " here)";
  const Tensor x = tokens_of(r, C, on);
  const Tensor y = layer.forward(x);

  // The one-rank answer for this rank's tokens.
  Block peer(config, 0);
  MoeSaved saved;
  const Tensor y_peer = peer.moe.forward(x, saved);
  const HostMoeResult host =
      host_moe_forward(HostMoeWeights::from_unit(block, "moe", E), x.to_vector(), k, cf);
  const std::string posed =
      routing_well_posed(who, host.probs, saved.probs.to_vector(), config.dtype, E, k, cf);
  if (!posed.empty()) return posed;
  std::string failure = compare_drops(who + "'s routing()", layer.routing(), host.probs, E, k, cf);
  if (!failure.empty())
    return failure + "\n    every rank routes its own tokens, as the one-rank layer would";
  failure = compare_token_rows(who + "'s output y", y_peer.to_vector(), y, C, rows);
  if (!failure.empty() && m > 1)
    failure +=
        "\n    (the one-rank case may pass while this fails: the receive buffer is rank-major, all "
        "of rank 0's "
        "rows by expert, then rank 1's, ...; recv_rows_[l] must pick expert l's rows out of every "
        "rank's "
        "block, and the outputs must go back in the order they came)";
  if (!failure.empty()) return failure;
  // Both route the same probabilities (router_probabilities is the
  // runtime's router), bitwise in either dtype, and sum the loss in double.
  if (std::abs(layer.aux_loss() - saved.aux_loss) > tolerance(config.dtype, 1e-13, 1e-13))
    return who + ": aux_loss() must be this rank's own balance loss x coef, " +
           number(saved.aux_loss) + ", got " + number(layer.aux_loss());

  const Tensor dx = layer.backward(dy_of(r, C, on));
  const Tensor dx_peer = peer.moe.backward(dy_of(r, C, on), saved);
  failure = compare_token_rows(who + "'s dx", dx_peer.to_vector(), dx, C, rows);
  if (!failure.empty())
    return failure +
           "\n    dx[n] = the router's share + for each kept choice (n, e): expert e's input "
           "gradient for "
           "weight x dy[n], computed on e's rank and sent home";
  const std::vector<double> expected =
      expected_gradients(config, m, r, layer.first_expert(), layer.local_experts());
  const std::vector<double> got = block.grads().to_vector();
  for (const ParamView& p : block.parameters()) {
    const int e = expert_of(p.name);
    if (e < 0 || (e >= layer.first_expert() && e < layer.first_expert() + layer.local_experts()))
      continue;
    for (std::int64_t i = 0; i < p.value.numel(); ++i)
      if (got[static_cast<std::size_t>(p.offset + i)] != 0.0)
        return who + ": " + p.name + " has a gradient, but expert " + std::to_string(e) +
               " lives on rank " + std::to_string(e / layer.local_experts()) +
               ": this rank ran an expert it does not own";
  }
  failure = compare_unit_gradients(who, block, expected, peer_gradient_tolerance(config.dtype));
  if (!failure.empty() && failure.find(".expert.") != std::string::npos)
    failure +=
        "\n    an expert's gradient sums its rows from every rank: each local expert runs backward "
        "once on "
        "every row it received";
  return failure;
}

TEST(Puzzle6_7_expert_parallel, OutputAndGradientsEqualTheOneRankLayerOnEachRanksTokens) {
  for (int m : degrees({1, 2, 4}))
    for (const auto& [E, k, cf] :
         {std::tuple<int, int, double>{4, 2, 2.0}, {4, 2, 0.6}, {8, 1, 0.75}, {4, 1, 4.0}}) {
      run_and_report("expert parallelism, " + case_name(E, k, cf), m,
                     [&, E = E, k = k, cf = cf](Comm& ep) { return run_rank(ep, E, k, cf); });
      if (HasFailure()) return;  // the first failing case says it all
    }
  // Experts that do not split over the ranks are refused (provided constructor).
  if (world_fits(2)) {
    const std::string error = error_of([] {
      run_ranks(2, [](Comm& ep) {
        Block block(moe_config(3, 1, 1.0, ep.device()), 0);
        ExpertParallelMoe(ep, block.moe);
      });
    });
    EXPECT_NE(error.find("E = 3 experts do not split over m = 2 ranks"), std::string::npos)
        << error;
  }
}

// Rows this rank's experts receive: kept choices of every rank's tokens for
// experts [first, first + local). @p ill_posed says why not when a rank's
// routing in the config's dtype differs from the host's (routing_well_posed).
std::int64_t rows_received(const GPTConfig& config, int m, int first, int local,
                           std::string& ill_posed) {
  Block block(config, 0);
  const HostMoeWeights weights = HostMoeWeights::from_unit(block, "moe", config.experts);
  std::int64_t rows = 0;
  for (int i = 0; i < m; ++i) {
    const Tensor x = tokens_of(i, config.d_model, config.device);
    const HostMoeResult host =
        host_moe_forward(weights, x.to_vector(), config.top_k, config.capacity_factor);
    MoeSaved saved;
    block.moe.forward(x, saved);
    if (ill_posed.empty())
      ill_posed = routing_well_posed("rank " + std::to_string(i) + "'s tokens", host.probs,
                                     saved.probs.to_vector(), config.dtype, config.experts,
                                     config.top_k, config.capacity_factor);
    for (const auto& [n, e] : host.kept) rows += e >= first && e < first + local;
  }
  return rows;
}

TEST(Puzzle6_7_expert_parallel, TwoAllToAllVEachWayCarryingKeptChoicesOnly) {
  const int E = 4, k = 2;
  const double cf = 0.6;  // drops: dropped choices must not travel
  for (int m : degrees({2, 4}))
    run_and_report("expert parallelism's communication", m, [&](Comm& ep) -> std::string {
      const GPTConfig config = moe_config(E, k, cf, ep.device());
      const std::int64_t C = config.d_model;
      Block block(config, 0);
      ExpertParallelMoe layer(ep, block.moe);
      const std::string who = "rank " + std::to_string(ep.rank()) + " of " + std::to_string(m);
      ep.reset_stats();
      const Tensor x = tokens_of(ep.rank(), C, ep.device());
      layer.forward(x);
      const CommStats forward = ep.stats();
      MoeSaved saved;  // the probabilities the routing was decided from, by the finished layer
      block.moe.forward(x, saved);
      const std::string routing =
          compare_routing(layer.routing(), saved.probs.to_vector(), E, k, cf);
      if (!routing.empty())
        return who + "'s routing is wrong (fix 6.6a first); first:\n    " + routing;
      ep.reset_stats();
      layer.backward(dy_of(ep.rank(), C, ep.device()));
      const CommStats backward = ep.stats();
      auto calls = [](const CommStats& s, const std::string& kind) {
        const auto it = s.collective_calls.find(kind);
        return it == s.collective_calls.end() ? std::int64_t{0} : it->second;
      };
      if (calls(forward, "all_to_all_v") != 2 || forward.total_collective_calls() > 3 ||
          forward.messages_sent != 0)
        return who +
               "'s forward must make 2 all_to_all_v (dispatch, combine) and one small collective "
               "for the "
               "counts; got " +
               std::to_string(calls(forward, "all_to_all_v")) + " all_to_all_v, " +
               std::to_string(forward.total_collective_calls()) + " collectives and " +
               std::to_string(forward.messages_sent) + " point-to-point sends";
      if (calls(backward, "all_to_all_v") != 2 || backward.total_collective_calls() != 2 ||
          backward.messages_sent != 0)
        return who +
               "'s backward must make exactly 2 all_to_all_v (dy to the experts, dx home) and "
               "nothing else "
               "(the counts are the forward's); got " +
               std::to_string(calls(backward, "all_to_all_v")) + " all_to_all_v, " +
               std::to_string(backward.total_collective_calls()) + " collectives and " +
               std::to_string(backward.messages_sent) + " sends";
      // Each all_to_all_v counts its input: this rank's kept choices (dy's
      // rows), then the rows its experts received (their input gradients).
      const std::int64_t kept = layer.routing().tokens * k - layer.routing().dropped();
      std::string ill_posed;
      const std::int64_t received =
          rows_received(config, m, layer.first_expert(), layer.local_experts(), ill_posed);
      if (!ill_posed.empty()) return ill_posed;
      const std::int64_t expected = (kept + received) * C * element_bytes(ep);
      if (backward.collective_bytes != expected)
        return who + "'s backward all_to_all_v carry " + std::to_string(backward.collective_bytes) +
               " bytes; the " + std::to_string(kept) + " kept choices out and the " +
               std::to_string(received) + " rows its experts received back, " + std::to_string(C) +
               " " + dtype_name(config.dtype) + " each, are " + std::to_string(expected) +
               (backward.collective_bytes > expected ? ": dropped choices (or padding) travel too"
                                                     : "");
      return "";
    });
}

}  // namespace
}  // namespace dtp::testing::ch06
