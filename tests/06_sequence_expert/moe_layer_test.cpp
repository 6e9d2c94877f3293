// Puzzle 6.6: a mixture of experts on one rank. route_tokens must follow
// the rules of dtp/moe_routing.h field by field (on the lesson's worked
// example, then on random batches with ties); MoeLayer's output must equal
// the host computation of support/moe_reference (the dense mixture when
// nothing is dropped, exactly the defined drops otherwise); its gradients,
// the load-balancing loss's included, must equal finite differences of the
// runtime's finished MoeMlp, taken in f64 on the same weights whatever dtype
// the layer runs in.
#include "moe_checks.h"

namespace dtp::testing::ch06 {
namespace {

TEST(Puzzle6_6_moe_layer, RouteTokensFollowsTheRulesOnTheLessonsExample) {
  // The lesson's table: 4 tokens, 3 experts, top-2, capacity ceil(0.75 * 8 / 3) = 2.
  const std::vector<double> probs = {0.5, 0.3, 0.2, 0.4, 0.4, 0.2, 0.2, 0.5, 0.3, 0.6, 0.1, 0.3};
  const MoeRouting got = route_tokens(probs, 3, 2, 0.75);
  const std::string failure = compare_routing(got, probs, 3, 2, 0.75);
  expect_pass(failure);
  if (!failure.empty()) return;
  // The lesson's numbers, once more, written out: t3 -> e0 and t1 -> e1 dropped, loss 1.03125.
  EXPECT_EQ(got.dropped(), 2)
      << "the lesson drops token 3's first choice (expert 0) and token 1's second (expert 1)";
  EXPECT_NEAR(got.balance_loss(), 1.03125, 1e-15)
      << "3 x (0.375 x 0.425 + 0.375 x 0.325 + 0.25 x 0.25)";
}

// probs [N, E] with some exact ties: rows drawn from a few values.
std::vector<double> tied_probs(std::int64_t N, int E, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<double> probs;
  for (std::int64_t n = 0; n < N; ++n) {
    std::vector<double> row(static_cast<std::size_t>(E));
    double sum = 0;
    for (double& p : row)
      sum += p = 1.0 + std::floor(4.0 * rng.uniform());  // 1..4: ties are common
    for (double p : row) probs.push_back(p / sum);
  }
  return probs;
}

TEST(Puzzle6_6_moe_layer, RouteTokensOnRandomBatchesWithTies) {
  struct Case {
    std::int64_t N;
    int E, k;
    double cf;
  };
  const Case cases[] = {{40, 4, 1, 1.0}, {40, 4, 2, 0.5}, {37, 8, 2, 1.25},
                        {24, 4, 3, 0.8}, {16, 4, 2, 2.0}, {30, 6, 1, 0.3}};
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    const std::vector<double> probs = tied_probs(c.N, c.E, seed++);
    expect_pass(compare_routing(route_tokens(probs, c.E, c.k, c.cf), probs, c.E, c.k, c.cf));
  }
  // Bad sizes are refused with a message naming them.
  const std::string error = error_of([] { route_tokens({0.5, 0.5, 1.0}, 2, 1, 1.0); });
  EXPECT_NE(error.find("3"), std::string::npos)
      << "route_tokens of 3 probabilities over E = 2 experts should be a "
         "dtp::Error naming the 3; got: "
      << error;
  const std::string top_k = error_of([] { route_tokens({0.5, 0.5}, 2, 3, 1.0); });
  EXPECT_NE(top_k.find("3"), std::string::npos)
      << "top_k = 3 of E = 2 experts should be a dtp::Error naming the 3 (moe_capacity checks "
         "it); got: "
      << top_k;
  const std::string factor = error_of([] { route_tokens({0.5, 0.5}, 2, 1, -0.5); });
  EXPECT_NE(factor.find("-0.5"), std::string::npos)
      << "a capacity factor of -0.5 should be a dtp::Error naming the -0.5 (moe_capacity checks "
         "it); got: "
      << factor;
}

// Runs MoeLayer on N tokens and compares output, routing and aux loss with the host.
void expect_forward_matches_host(int E, int k, double cf, bool expect_drops) {
  const GPTConfig config = moe_config(E, k, cf);
  const Closeness within = moe_row_tolerance(config.dtype);
  Block block(config, 0);
  const Tensor x = random_tokens(24, config.d_model, 7);
  MoeLayer layer(block.moe);
  const Tensor y = layer.forward(x);
  const HostMoeResult host =
      host_moe_forward(HostMoeWeights::from_unit(block, "moe", E), x.to_vector(), k, cf);
  ASSERT_EQ(!host.dropped.empty(), expect_drops) << "the case does not test what it says";
  const std::string who = "MoeLayer (" + case_name(E, k, cf) + ", N 24)";
  {
    MoeSaved saved;  // the probabilities in the layer's dtype, by the finished layer
    block.moe.forward(x, saved);
    const std::string posed =
        routing_well_posed(who, host.probs, saved.probs.to_vector(), config.dtype, E, k, cf);
    ASSERT_TRUE(posed.empty()) << posed;
  }
  std::string failure = compare_drops(who + "'s routing()", layer.routing(), host.probs, E, k, cf);
  if (failure.empty()) {
    failure = compare_token_rows(who + "'s output y", host.y, y, config.d_model, within);
    const HostMoeResult undropped =
        host_moe_forward(HostMoeWeights::from_unit(block, "moe", E), x.to_vector(), k, cf,
                         RoutingRule::unlimited_capacity);
    if (!failure.empty() && expect_drops &&
        compare_token_rows("", undropped.y, y, config.d_model, within).empty())
      failure +=
          "\n    it equals the output with nothing dropped: dropped choices were still added to y";
  }
  expect_pass(failure);
  if (!failure.empty()) return;
  EXPECT_NEAR(layer.aux_loss(), config.aux_loss_coef * host.balance_loss,
              aux_loss_tolerance(config.dtype))
      << who << ": aux_loss() must be aux_loss_coef (" << config.aux_loss_coef
      << ") x E sum_e f_e P_e = " << config.aux_loss_coef << " x " << host.balance_loss;
}

TEST(Puzzle6_6_moe_layer, ForwardEqualsTheDenseMixtureWhenNothingIsDropped) {
  // gather_rows (provided) refuses a row outside the batch, naming it.
  const std::string row = error_of([] {
    gather_rows(Tensor::zeros({4, 2}, checker_dtype(), checker_device()), {1, 4});
  });
  EXPECT_NE(row.find("is 4, outside the batch's 4 rows"), std::string::npos) << row;
  expect_forward_matches_host(4, 1, 4.0, false);  // capacity = N: room for everything
  expect_forward_matches_host(4, 2, 2.0, false);
}

TEST(Puzzle6_6_moe_layer, ForwardDropsExactlyTheDefinedChoices) {
  expect_forward_matches_host(4, 1, 0.5, true);
  expect_forward_matches_host(4, 2, 0.6, true);
  expect_forward_matches_host(3, 3, 0.7, true);
}

// The loss "sum(y * dy) + aux" of the runtime's finished MoeMlp, the checker's peer.
double runtime_loss(const MoeMlp& moe, const Tensor& x, const Tensor& dy) {
  MoeSaved saved;
  const Tensor y = moe.forward(x, saved);
  return weighted_sum(y, dy) + saved.aux_loss;
}

// @p config in f64 on the CPU: the finite differences' twin of a layer.
GPTConfig f64_cpu(GPTConfig config) {
  config.dtype = DType::f64;
  config.device = Device::cpu();
  return config;
}

// The values of @p t (exact in f64) as an f64 tensor on the CPU, shaped alike.
Tensor f64_copy(const Tensor& t) {
  return Tensor::from_values(t.to_vector(), DType::f64).view(t.shape());
}

// MoeLayer's dx and parameter gradients against central differences.
void expect_gradients_match(int E, int k, double cf, bool main_loss) {
  const GPTConfig config = moe_config(E, k, cf);
  Block block(config, 0);
  Rng init(5);
  ops::fill_normal(block.params(), 0.1, 0.4, init);
  const Tensor x = random_tokens(12, config.d_model, 21);
  Tensor dy = random_tokens(12, config.d_model, 22);
  if (!main_loss) dy.fill(0.0);
  const std::string who =
      "MoeLayer (" + case_name(E, k, cf) + (main_loss ? "" : ", the balance loss alone") + ")";

  block.zero_grad();
  MoeLayer layer(block.moe);
  layer.forward(x);
  if (cf < 1) {
    EXPECT_GT(layer.routing().dropped(), 0) << "the case should drop choices";
  }
  // The expected gradients: central differences of the runtime's layer in
  // f64 on the CPU, on a twin holding the same weights, tokens and dy.
  Block twin(f64_cpu(config), 0);
  twin.params().copy_from(f64_copy(block.params()));
  const Tensor x64 = f64_copy(x), dy64 = f64_copy(dy);
  {
    MoeSaved saved;  // the probabilities the routing was decided from, by the finished layer
    block.moe.forward(x, saved);
    const std::string routing = compare_routing(layer.routing(), saved.probs.to_vector(), E, k, cf);
    if (!routing.empty())
      return expect_pass(
          who + "'s routing is wrong, so its gradients cannot be right; first:\n    " + routing);
    MoeSaved exact;
    twin.moe.forward(x64, exact);
    const std::string posed = routing_well_posed(who, exact.probs.to_vector(),
                                                 saved.probs.to_vector(), config.dtype, E, k, cf);
    if (!posed.empty()) return expect_pass(posed);
  }
  const Tensor dx = layer.backward(dy);
  const Closeness within = finite_difference_tolerance(config.dtype);
  auto loss = [&] { return runtime_loss(twin.moe, x64, dy64); };
  const std::vector<double> expected = numeric_gradient(twin.params(), loss);
  std::string failure = compare_unit_gradients(who, block, expected, within);
  if (!failure.empty() && failure.find("router") != std::string::npos) {
    // Name the router's two sources when one of them is missing.
    Block plain(f64_cpu(config), 0);
    plain.params().copy_from(twin.params());
    const std::vector<double> without_aux = numeric_gradient(plain.params(), [&] {
      MoeSaved saved;
      return weighted_sum(plain.moe.forward(x64, saved), dy64);
    });
    std::vector<double> got = block.grads().to_vector();
    bool same = true;
    for (const ParamView& p : block.parameters())
      if (p.name.find("router") != std::string::npos)
        for (std::int64_t i = 0; i < p.value.numel(); ++i)
          same =
              same && std::abs(got[p.offset + i] - without_aux[p.offset + i]) <=
                          within.relative * std::abs(without_aux[p.offset + i]) + within.absolute;
    if (same)
      failure +=
          "\n    the router's gradient equals the main loss's alone: the balance loss's share "
          "(aux_loss_coef x E f_e / N for every token) never reached d probs";
  }
  if (failure.empty())
    failure =
        compare_token_rows(who + "'s dx", numeric_gradient(x64, loss), dx, config.d_model, within);
  expect_pass(failure);
}

TEST(Puzzle6_6_moe_layer, BackwardMatchesFiniteDifferences) {
  expect_gradients_match(4, 1, 4.0, true);
  expect_gradients_match(4, 2, 0.6, true);  // with dropped choices
}

TEST(Puzzle6_6_moe_layer, BalanceLossGradientMatchesFiniteDifferences) {
  // dy = 0: only the balance loss is left, and only the router feels it.
  expect_gradients_match(4, 2, 2.0, false);
}

}  // namespace
}  // namespace dtp::testing::ch06
