// The mixture of experts: the routing rules on a hand-worked example, the
// capacity formula, MoeMlp against an independent host computation (with and
// without dropped tokens), and every gradient, the load-balancing loss's
// included, against finite differences in f64.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "dtp/error.h"
#include "dtp/nn.h"
#include "nn_test_helpers.h"
#include "support/harness.h"
#include "support/moe_reference.h"

namespace dtp {
namespace {

using testing::gradients_match;
using testing::numeric_gradient;
using testing::random_ids;
using testing::random_tensor;
using testing::weighted_sum;

GPTConfig moe_config(int experts, int top_k, double capacity_factor) {
  GPTConfig c = testing::tiny_f64_config();
  c.seed = 77;
  c.experts = experts;
  c.top_k = top_k;
  c.capacity_factor = capacity_factor;
  c.aux_loss_coef = 0.3;  // large, so that its gradient is visible next to the main one
  return c;
}

TEST(MoeRouting, TopKTiesCapacityAndDropOrderOnAWorkedExample) {
  // 4 tokens, 3 experts, top-2, capacity ceil(0.75 * 4 * 2 / 3) = 2.
  const std::vector<double> probs = {0.5, 0.3, 0.2,   // token 0: experts 0, 1
                                     0.4, 0.4, 0.2,   // token 1: a tie, the lower index first: 0, 1
                                     0.2, 0.3, 0.5,   // token 2: 2, 1
                                     0.6, 0.1, 0.3};  // token 3: 0, 2
  const MoeRouting r = moe_route(probs, 3, 2, 0.75);
  EXPECT_EQ(r.capacity, 2);
  EXPECT_EQ(r.choice, (std::vector<int>{0, 1, 0, 1, 2, 1, 0, 2}));
  // Round 1 (first choices, token order): 0 -> e0, 1 -> e0, 2 -> e2, 3 -> e0 is full: dropped.
  // Round 2 (second choices): 0 -> e1, 1 -> e1, 2 -> e1 is full: dropped, 3 -> e2.
  EXPECT_EQ(r.kept, (std::vector<char>{1, 1, 1, 1, 1, 0, 0, 1}));
  EXPECT_EQ(r.rows[0], (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(r.rows[1], (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(r.rows[2], (std::vector<std::int32_t>{2, 3}));
  EXPECT_EQ(r.weights[2], (std::vector<double>{0.5, 0.3}));
  EXPECT_EQ(r.dropped(), 2);
  // f = (3, 3, 2) / 8 choices; P = (0.425, 0.275, 0.3); 3 * sum f P = 1.0125.
  EXPECT_NEAR(r.balance_loss(), 1.0125, 1e-15);
  EXPECT_NEAR(r.balance_gradient(2), 3 * (2.0 / 8) / 4, 1e-15);
  EXPECT_EQ(r.describe(),
            "N 4, E 3, top-2, capacity 2: 2 of 8 choices dropped; tokens per expert 2 2 2");
}

TEST(MoeRouting, UniformRoutingHasBalanceLossOne) {
  // Token n prefers expert n % 4 a little; every expert gets a quarter of the tokens.
  std::vector<double> probs;
  for (int n = 0; n < 8; ++n)
    for (int e = 0; e < 4; ++e) probs.push_back(e == n % 4 ? 0.25 + 0.03 : 0.25 - 0.01);
  const MoeRouting r = moe_route(probs, 4, 1, 1.0);
  EXPECT_EQ(r.capacity, 2);
  EXPECT_EQ(r.dropped(), 0);
  EXPECT_NEAR(r.balance_loss(), 1.0, 1e-15);
}

TEST(MoeRouting, CapacityFormulaAndBadArguments) {
  EXPECT_EQ(moe_capacity(8, 4, 2, 1.0), 4);    // an even split, exactly
  EXPECT_EQ(moe_capacity(10, 1, 1, 1.1), 11);  // 1.1 * 10 is 11.000000000000002 in floating point
  EXPECT_EQ(moe_capacity(5, 2, 1, 1.0), 3);    // ceil(2.5)
  EXPECT_EQ(moe_capacity(6, 4, 2, 2.0), 6);    // E / k: room for every token
  EXPECT_NE(testing::error_of([] {
              moe_capacity(8, 4, 5, 1.0);
            }).find("top_k must be in [1, experts = 4], got 5"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              moe_capacity(8, 4, 1, 0.0);
            }).find("capacity_factor must be positive, got 0"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              moe_route({0.5, 0.5, 1.0}, 2, 1, 1.0);
            }).find("3 probabilities do not split into rows of E = 2 experts"),
            std::string::npos);
}

// MoeMlp's output and routing against the host computation in tests/support.
void expect_matches_host(int experts, int top_k, double capacity_factor, bool expect_drops) {
  SCOPED_TRACE("E " + std::to_string(experts) + ", top-" + std::to_string(top_k) +
               ", capacity factor " + std::to_string(capacity_factor));
  const GPTConfig config = moe_config(experts, top_k, capacity_factor);
  Block block(config, 0);
  Rng rng(31);
  Tensor x = random_tensor({3, 6, 8}, rng);
  MoeSaved saved;
  Tensor y = block.moe.forward(x, saved);
  const auto host =
      testing::host_moe_forward(testing::HostMoeWeights::from_unit(block, "moe", experts),
                                x.to_vector(), top_k, capacity_factor);
  EXPECT_EQ(saved.routing.capacity, host.capacity);
  std::set<std::pair<std::int64_t, int>> kept, dropped;
  for (std::int64_t n = 0; n < saved.routing.tokens; ++n)
    for (int j = 0; j < top_k; ++j) {
      const std::size_t at = static_cast<std::size_t>(n * top_k + j);
      (saved.routing.kept[at] ? kept : dropped).insert({n, saved.routing.choice[at]});
    }
  EXPECT_EQ(dropped, host.dropped) << "dropped: " << testing::describe_choices(dropped)
                                   << "\nexpected " << testing::describe_choices(host.dropped);
  EXPECT_EQ(kept, host.kept);
  EXPECT_EQ(!host.dropped.empty(), expect_drops) << "the case does not test what it says";
  double worst = 0;
  for (std::int64_t i = 0; i < y.numel(); ++i)
    worst = std::max(worst, std::abs(y.item(i) - host.y[i]));
  EXPECT_LE(worst, 1e-12);
  EXPECT_NEAR(saved.aux_loss, config.aux_loss_coef * host.balance_loss, 1e-14);
}

TEST(MoeMlp, EqualsTheDenseMixtureWhenNothingIsDropped) {
  expect_matches_host(4, 1, 4.0, false);  // capacity = N
  expect_matches_host(4, 2, 2.0, false);
}

TEST(MoeMlp, DropsExactlyTheTokensTheRulesDrop) {
  expect_matches_host(4, 1, 0.5, true);
  expect_matches_host(4, 2, 0.6, true);
  expect_matches_host(3, 3, 0.7, true);
}

// d(loss_scale * (sum(block(x) * R) + aux)) / d(x, every parameter), by finite differences.
void check_block_gradients(int experts, int top_k, double capacity_factor, double loss_scale,
                           bool main_loss, int groups = 1) {
  SCOPED_TRACE("E " + std::to_string(experts) + ", top-" + std::to_string(top_k) +
               ", capacity factor " + std::to_string(capacity_factor) + ", loss scale " +
               std::to_string(loss_scale) + (main_loss ? "" : ", the load-balancing loss alone") +
               ", " + std::to_string(groups) + " routing group(s)");
  GPTConfig config = moe_config(experts, top_k, capacity_factor);
  config.moe_groups = groups;
  Block block(config, 0);
  Rng init(8), rng(41);
  ops::fill_normal(block.params(), 0.1, 0.4, init);
  Tensor x = random_tensor({2, 5, 8}, rng);
  Tensor weights = random_tensor({2, 5, 8}, rng);
  if (!main_loss) weights.fill(0.0);
  auto loss = [&] {
    BlockSaved s;
    Tensor out = block.forward(x, s);
    return loss_scale * (weighted_sum(out, weights) + s.moe.aux_loss);
  };
  Tensor dy = weights.clone();
  ops::scale(dy, loss_scale);
  BlockSaved s;
  block.forward(x, s);
  if (capacity_factor < 1) {
    EXPECT_GT(s.moe.routing.dropped(), 0) << "the case should drop choices";
  }
  block.zero_grad();
  Tensor dx = block.backward(dy, s, WeightGrads::immediate, loss_scale);
  if (main_loss) {
    EXPECT_TRUE(gradients_match("MoE block input gradient", dx, numeric_gradient(x, loss)));
  }
  EXPECT_TRUE(gradients_match("MoE block parameter gradients", block.grads(),
                              numeric_gradient(block.params(), loss)));
}

TEST(MoeMlp, BlockGradientsByFiniteDifferences) {
  check_block_gradients(4, 1, 4.0, 1.0, true);
  check_block_gradients(4, 2, 0.6, 1.0, true);   // with dropped choices
  check_block_gradients(3, 2, 1.0, 0.25, true);  // a loss scale reaches the balance loss too
}

TEST(MoeMlp, RoutingGroupsEqualEachGroupRoutedAlone) {
  // 12 tokens in 2 groups of 6: each group has its own capacity (here 3 of
  // 6 x 2 / 4 choices, so both drop) and balance loss; the layer's balance
  // loss is their mean.
  GPTConfig grouped = moe_config(4, 2, 1.0);
  grouped.moe_groups = 2;
  Block block(grouped, 0), alone(moe_config(4, 2, 1.0), 0);
  Rng rng(52);
  Tensor x = random_tensor({2, 6, 8}, rng);
  MoeSaved saved;
  const std::vector<double> y = block.moe.forward(x, saved).to_vector();
  EXPECT_EQ(saved.routing.capacity, 3);
  double aux = 0;
  std::int64_t dropped = 0;
  const std::vector<double> xs = x.to_vector();
  for (int g = 0; g < 2; ++g) {
    Tensor half =
        Tensor::from_values(std::vector<double>(xs.begin() + g * 48, xs.begin() + (g + 1) * 48),
                            DType::f64)
            .view({6, 8});
    MoeSaved s;
    const std::vector<double> want = alone.moe.forward(half, s).to_vector();
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(y[static_cast<std::size_t>(g) * 48 + i], want[i], 1e-14)
          << "group " << g << " element " << i;
    aux += s.aux_loss / 2;
    dropped += s.routing.dropped();
  }
  EXPECT_GT(dropped, 0) << "the case should drop choices";
  EXPECT_EQ(saved.routing.dropped(), dropped);
  EXPECT_NEAR(saved.aux_loss, aux, 1e-15);
  GPTConfig bad = grouped;
  bad.moe_groups = 5;
  Block five(bad, 0);
  MoeSaved s5;
  EXPECT_NE(testing::error_of([&] {
              five.moe.forward(x, s5);
            }).find("12 tokens do not split into 5 equal routing groups"),
            std::string::npos);
  bad.moe_groups = 0;
  EXPECT_NE(testing::error_of([&] { bad.validate(); }).find("moe_groups must be at least 1"),
            std::string::npos);
}

TEST(MoeMlp, RoutingGroupsGradientsByFiniteDifferences) {
  check_block_gradients(4, 2, 1.0, 0.5, true, 2);
  check_block_gradients(4, 2, 2.0, 1.0, false, 5);  // the balance loss alone, 5 groups of 2
}

TEST(MoeMlp, LoadBalancingLossGradientByFiniteDifferences) {
  // With the main loss's weights at zero only the balance loss is left; its
  // gradient reaches the router alone (through P), which FD confirms.
  check_block_gradients(4, 2, 2.0, 1.0, false);
}

TEST(MoeMlp, WholeModelGradientsAndLossIncludeTheBalanceLoss) {
  GPT model(moe_config(3, 2, 1.0));
  Rng rng(24);
  Tensor tokens = random_ids({2, 5}, 7, rng), targets = random_ids({2, 5}, 7, rng);
  model.zero_grad();
  model.forward(tokens, targets);
  // Two blocks, each coef * E sum f P, which is about 1 for a fresh router.
  EXPECT_NEAR(model.aux_loss(), 2 * 0.3, 0.2);
  model.backward();
  testing::expect_model_gradients_match(model, tokens, targets, "MoE GPT");
  std::int64_t total = 0;
  for (const Unit* unit : model.units()) total += unit->numel();
  EXPECT_EQ(model.config().parameter_count(), total);
}

TEST(MoeMlp, ConfigErrorsNameTheField) {
  GPTConfig c = moe_config(4, 5, 1.0);
  EXPECT_NE(
      testing::error_of([&] { c.validate(); }).find("top_k must be in [1, experts = 4], got 5"),
      std::string::npos);
  c = moe_config(4, 1, 0.0);
  EXPECT_NE(testing::error_of([&] { c.validate(); }).find("capacity_factor must be positive"),
            std::string::npos);
  c = moe_config(-1, 1, 1.0);
  EXPECT_NE(testing::error_of([&] { c.validate(); }).find("experts must be >= 0"),
            std::string::npos);
  EXPECT_NE(moe_config(4, 2, 1.25).describe().find("4 experts top-2 capacity factor 1.25"),
            std::string::npos);
}

TEST(MoeMlp, ExpertShardsHoldTheirExpertsAsInTheWholeModel) {
  const GPTConfig whole_config = moe_config(4, 2, 1.0);
  const GPT whole(whole_config);
  for (int shard = 0; shard < 2; ++shard) {
    GPTConfig c = whole_config;
    c.expert_shards = 2;
    c.expert_shard = shard;
    GPT part(c);
    SCOPED_TRACE("expert_shard " + std::to_string(shard));
    for (std::size_t u = 0; u < part.units().size(); ++u) {
      const Unit& mine = *part.units()[u];
      const Unit& all = *whole.units()[u];
      std::int64_t held = 0;
      for (const ParamView& p : all.parameters()) {
        const auto at = p.name.find(".expert.");
        const int e = at == std::string::npos ? -1 : std::stoi(p.name.substr(at + 8));
        if (e >= 0 && e / 2 != shard) continue;  // experts 0, 1 on shard 0; 2, 3 on shard 1
        held += p.shape.numel();
        // The same weights as the whole model's, whatever was drawn before them.
        EXPECT_EQ(mine.parameter(p.name).value.to_vector(), p.value.to_vector())
            << "unit " << all.name() << " " << p.name;
      }
      EXPECT_EQ(mine.numel(), held)
          << "unit " << all.name() << ": only its experts, no memory for the others";
      for (const ParamView& p : mine.parameters()) {
        const auto at = p.name.find(".expert.");
        if (at != std::string::npos) {
          EXPECT_EQ(std::stoi(p.name.substr(at + 8)) / 2, shard) << p.name;
        }
      }
    }
    EXPECT_TRUE(part.block(0).moe.holds(2 * shard) && !part.block(0).moe.holds(2 - 2 * shard));
    Rng rng(5);
    Tensor tokens = random_ids({1, 4}, 7, rng), targets = random_ids({1, 4}, 7, rng);
    const std::string error = testing::error_of([&] { part.forward(tokens, targets); });
    EXPECT_NE(error.find("holds only experts " + std::to_string(2 * shard) + " to " +
                         std::to_string(2 * shard + 1) + " of 4"),
              std::string::npos)
        << error;
  }
}

TEST(MoeMlp, ExpertShardErrorsNameTheField) {
  GPTConfig c = moe_config(4, 2, 1.0);
  c.expert_shards = 3;
  EXPECT_NE(testing::error_of([&] {
              c.validate();
            }).find("expert_shards (3) must be at least 1 and divide experts (4)"),
            std::string::npos);
  c.expert_shards = 2;
  c.expert_shard = 2;
  EXPECT_NE(testing::error_of([&] { c.validate(); }).find("expert_shard must be in [0, 2), got 2"),
            std::string::npos);
  c = testing::tiny_f64_config();
  c.expert_shards = 2;
  EXPECT_NE(testing::error_of([&] { c.validate(); }).find("needs experts"), std::string::npos);
}

TEST(MoeOps, ScaleRowsAndRowDot) {
  Tensor x = Tensor::from_values({1, 2, 3, 4, 5, 6}).view({3, 2});
  Tensor w = Tensor::from_values({2, -1, 0.5});
  Tensor dot = Tensor::empty({3}, DType::f64);
  ops::row_dot(x, x, dot);
  EXPECT_EQ(dot.to_vector(), (std::vector<double>{5, 25, 61}));
  ops::scale_rows(x, w);
  EXPECT_EQ(x.to_vector(), (std::vector<double>{2, 4, -3, -4, 2.5, 3}));
  Tensor short_w = Tensor::from_values({1, 2});
  EXPECT_NE(testing::error_of([&] {
              ops::scale_rows(x, short_w);
            }).find("w must have 3 elements (one weight per row of x)"),
            std::string::npos);
}

}  // namespace
}  // namespace dtp
