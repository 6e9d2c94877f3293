// The GPT and its layers: every layer's and the whole model's gradients
// against finite differences (f64), naive vs flash attention, the unit
// layout, grad-ready hooks, deferred weight gradients, and memory accounting.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/nn.h"
#include "nn_test_helpers.h"
#include "support/harness.h"

namespace dtp {
namespace {

using testing::gradients_match;
using testing::max_difference;
using testing::numeric_gradient;
using testing::random_ids;
using testing::random_tensor;
using testing::weighted_sum;

// A tiny f64 model with a large init so that every path carries real gradient.
GPTConfig tiny_config(AttentionKind attention = AttentionKind::naive) {
  GPTConfig c = testing::tiny_f64_config();
  c.seed = 99;
  c.attention = attention;
  return c;
}

// A unit holding arbitrary layers, for checking one layer at a time.
class TestUnit : public Unit {
 public:
  TestUnit(const GPTConfig& config, std::vector<ParamSpec> layout,
           std::function<void(const Unit&)> binder)
      : Unit("test", 5, config, std::move(layout)), binder_(std::move(binder)) {
    finish_construction();
  }

 private:
  void bind() override { binder_(*this); }
  std::function<void(const Unit&)> binder_;
};

// Checks d(sum(forward(x) * R))/d(x and unit params) against finite differences.
// forward(x) returns y and fills its saved state; backward(R) returns dx.
void check_layer(const std::string& what, Unit& unit, Tensor x,
                 const std::function<Tensor(const Tensor&)>& forward_for_loss,
                 const std::function<Tensor(const Tensor&)>& forward_and_backward, Rng& rng) {
  Tensor probe_out = forward_for_loss(x);
  Tensor weights = random_tensor(probe_out.shape(), rng);
  auto loss = [&] { return weighted_sum(forward_for_loss(x), weights); };
  unit.zero_grad();
  Tensor dx = forward_and_backward(weights);
  EXPECT_TRUE(gradients_match(what + " input gradient", dx, numeric_gradient(x, loss)));
  EXPECT_TRUE(gradients_match(what + " parameter gradients", unit.grads(),
                              numeric_gradient(unit.params(), loss)));
}

TEST(NnLayers, LinearLayerNormGeluAndMlpGradientsByFiniteDifferences) {
  Rng rng(21);
  GPTConfig config = tiny_config();
  {
    Linear linear(8, 5, true);
    std::vector<ParamSpec> layout;
    linear.declare(layout, "fc", 0.5);
    TestUnit unit(config, layout, [&](const Unit& u) { linear.bind(u, "fc"); });
    Tensor x = random_tensor({2, 3, 8}, rng);
    check_layer(
        "Linear", unit, x,
        [&](const Tensor& in) {
          LinearSaved s;
          return linear.forward(in, s);
        },
        [&](const Tensor& dy) {
          LinearSaved s;
          linear.forward(x, s);
          return linear.backward(dy, s);
        },
        rng);
  }
  {
    LayerNorm ln(8, 1e-5);
    std::vector<ParamSpec> layout;
    ln.declare(layout, "ln");
    TestUnit unit(config, layout, [&](const Unit& u) { ln.bind(u, "ln"); });
    // Non-trivial weight and bias, so their gradients are exercised fully.
    Rng init(5);
    ops::fill_normal(unit.params(), 0.5, 0.5, init);
    Tensor x = random_tensor({2, 3, 8}, rng, 2.0);
    check_layer(
        "LayerNorm", unit, x,
        [&](const Tensor& in) {
          LayerNormSaved s;
          return ln.forward(in, s);
        },
        [&](const Tensor& dy) {
          LayerNormSaved s;
          ln.forward(x, s);
          return ln.backward(dy, s);
        },
        rng);
  }
  {
    Gelu gelu;
    Tensor x = random_tensor({2, 3, 4}, rng, 2.0);
    Tensor dy = random_tensor({2, 3, 4}, rng);
    auto loss = [&] {
      GeluSaved s;
      return weighted_sum(gelu.forward(x, s), dy);
    };
    GeluSaved s;
    gelu.forward(x, s);
    EXPECT_TRUE(
        gradients_match("Gelu input gradient", gelu.backward(dy, s), numeric_gradient(x, loss)));
  }
  {
    Mlp mlp(config);
    std::vector<ParamSpec> layout;
    mlp.declare(layout, "mlp");
    TestUnit unit(config, layout, [&](const Unit& u) { mlp.bind(u, "mlp"); });
    Rng init(6);
    ops::fill_normal(unit.params(), 0.0, 0.5, init);  // biases too
    Tensor x = random_tensor({2, 3, 8}, rng);
    check_layer(
        "Mlp", unit, x,
        [&](const Tensor& in) {
          MlpSaved s;
          return mlp.forward(in, s);
        },
        [&](const Tensor& dy) {
          MlpSaved s;
          mlp.forward(x, s);
          return mlp.backward(dy, s);
        },
        rng);
  }
}

TEST(NnLayers, AttentionGradientsByFiniteDifferences) {
  for (AttentionKind kind : {AttentionKind::naive, AttentionKind::flash}) {
    SCOPED_TRACE(attention_kind_name(kind));
    Rng rng(22);
    GPTConfig config = tiny_config(kind);
    CausalSelfAttention attn(config);
    std::vector<ParamSpec> layout;
    attn.declare(layout, "attn");
    TestUnit unit(config, layout, [&](const Unit& u) { attn.bind(u, "attn"); });
    Rng init(7);
    ops::fill_normal(unit.params(), 0.0, 0.5, init);
    Tensor x = random_tensor({2, 5, 8}, rng);
    check_layer(
        "CausalSelfAttention", unit, x,
        [&](const Tensor& in) {
          AttentionSaved s;
          return attn.forward(in, s);
        },
        [&](const Tensor& dy) {
          AttentionSaved s;
          attn.forward(x, s);
          return attn.backward(dy, s);
        },
        rng);
  }
}

TEST(NnLayers, UnitsGradientsByFiniteDifferences) {
  Rng rng(23);
  GPTConfig config = tiny_config();
  {
    Block block(config, 0);
    Rng init(8);
    ops::fill_normal(block.params(), 0.1, 0.4,
                     init);  // LayerNorm weights away from 1, biases nonzero
    Tensor x = random_tensor({2, 5, 8}, rng);
    check_layer(
        "Block", block, x,
        [&](const Tensor& in) {
          BlockSaved s;
          return block.forward(in, s);
        },
        [&](const Tensor& dy) {
          BlockSaved s;
          block.forward(x, s);
          return block.backward(dy, s);
        },
        rng);
  }
  {
    Embedding embedding(config);
    Tensor ids = random_ids({2, 5}, config.vocab_size, rng);
    Tensor dx = random_tensor({2, 5, 8}, rng);
    auto loss = [&] {
      EmbeddingSaved s;
      return weighted_sum(embedding.forward(ids, s), dx);
    };
    EmbeddingSaved s;
    embedding.forward(ids, s);
    embedding.zero_grad();
    embedding.backward(dx, s);
    EXPECT_TRUE(gradients_match("Embedding parameter gradients", embedding.grads(),
                                numeric_gradient(embedding.params(), loss)));
  }
  {
    Head head(config);
    Rng init(9);
    ops::fill_normal(head.params(), 0.2, 0.5, init);
    Tensor x = random_tensor({2, 5, 8}, rng);
    Tensor targets = random_ids({2, 5}, config.vocab_size, rng);
    const double scale = 0.75;
    auto loss = [&] {
      HeadSaved s;
      return scale * head.forward(x, targets, s);
    };
    HeadSaved s;
    head.forward(x, targets, s);
    head.zero_grad();
    Tensor dx = head.backward(s, scale);
    EXPECT_TRUE(gradients_match("Head input gradient", dx, numeric_gradient(x, loss)));
    EXPECT_TRUE(gradients_match("Head parameter gradients", head.grads(),
                                numeric_gradient(head.params(), loss)));
  }
}

TEST(NnModel, EmbeddingAtPositionRangesAddsThoseRowsOfThePositionTable) {
  // A zigzag rank's tokens: positions 0 and 4-5 of a context of 6.
  const GPTConfig config = tiny_config();
  Embedding embedding(config);
  Rng rng(61);
  Tensor ids = random_ids({2, 3}, config.vocab_size, rng);
  const std::vector<PositionRange> ranges = {{0, 1}, {4, 2}};
  const std::int64_t at[] = {0, 4, 5}, C = config.d_model;
  EmbeddingSaved saved;
  const std::vector<double> x = embedding.forward(ids, saved, ranges).to_vector();
  const std::vector<double> tokens = embedding.tokens.to_vector(),
                            positions = embedding.positions.to_vector();
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t t = 0; t < 3; ++t)
      for (std::int64_t c = 0; c < C; ++c) {
        const auto id = static_cast<std::int64_t>(ids.item(b * 3 + t));
        const double want = tokens[static_cast<std::size_t>(id * C + c)] +
                            positions[static_cast<std::size_t>(at[t] * C + c)];
        ASSERT_EQ(x[static_cast<std::size_t>((b * 3 + t) * C + c)], want)
            << "batch " << b << " token " << t << " channel " << c;
      }
  Tensor dx = random_tensor({2, 3, 8}, rng);
  auto loss = [&] {
    EmbeddingSaved s;
    return weighted_sum(embedding.forward(ids, s, ranges), dx);
  };
  embedding.zero_grad();
  embedding.backward(dx, saved);
  EXPECT_TRUE(gradients_match("Embedding gradients at position ranges", embedding.grads(),
                              numeric_gradient(embedding.params(), loss)));
  EmbeddingSaved s;
  EXPECT_NE(testing::error_of([&] {
              embedding.forward(ids, s, {{0, 1}, {5, 2}});
            }).find("positions [5, 7) are not inside the model's context [0, 6)"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              embedding.forward(ids, s, {{0, 2}});
            }).find("the position ranges hold 2 positions but the ids have T = 3"),
            std::string::npos);
}

TEST(NnModel, WholeModelGradientsByFiniteDifferences) {
  for (AttentionKind kind : {AttentionKind::naive, AttentionKind::flash}) {
    SCOPED_TRACE(attention_kind_name(kind));
    GPT model(tiny_config(kind));
    Rng rng(24);
    Tensor tokens = random_ids({2, 5}, 7, rng), targets = random_ids({2, 5}, 7, rng);
    model.zero_grad();
    model.forward(tokens, targets);
    model.backward();
    testing::expect_model_gradients_match(model, tokens, targets, "GPT");
  }
}

TEST(NnModel, FlashAndNaiveAttentionGiveTheSameModel) {
  GPT naive(tiny_config(AttentionKind::naive));
  GPT flash(tiny_config(AttentionKind::flash));
  Rng rng(25);
  Tensor tokens = random_ids({3, 6}, 7, rng), targets = random_ids({3, 6}, 7, rng);
  const double a = naive.forward(tokens, targets), b = flash.forward(tokens, targets);
  EXPECT_NEAR(a, b, 1e-13);
  naive.backward();
  flash.backward();
  for (int u = 0; u < 4; ++u)
    EXPECT_LT(max_difference(naive.units()[u]->grads(), flash.units()[u]->grads()), 1e-12)
        << naive.units()[u]->name();
}

TEST(NnModel, UnitsAreFlatBuffersWithNamedViews) {
  GPTConfig config = tiny_config();
  GPT model(config);
  std::vector<Unit*> units = model.units();
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[0]->name(), "embedding");
  EXPECT_EQ(units[1]->name(), "block.0");
  EXPECT_EQ(units[2]->name(), "block.1");
  EXPECT_EQ(units[3]->name(), "head");
  EXPECT_EQ(model.parameter_count(), config.parameter_count());
  for (Unit* unit : units) {
    EXPECT_EQ(unit->params().ndim(), 1);
    EXPECT_EQ(unit->params().category(), MemoryCategory::params);
    EXPECT_EQ(unit->grads().category(), MemoryCategory::grads);
    std::int64_t offset = 0;
    for (const ParamView& view : unit->parameters()) {
      EXPECT_EQ(view.offset, offset) << unit->name() << " " << view.name;
      EXPECT_TRUE(view.value.shares_storage_with(unit->params()));
      EXPECT_TRUE(view.grad.shares_storage_with(unit->grads()));
      offset += view.shape.numel();
    }
    EXPECT_EQ(offset, unit->numel());
  }
  Block& block = model.block(1);
  const ParamView& q = block.parameter("attn.q.weight");
  EXPECT_EQ(q.shape, (Shape{8, 8}));
  // Writing through the flat buffer is seen by the layer.
  block.params().set_item(q.offset + 3, 42.0);
  EXPECT_EQ(block.attn.q.weight.item(3), 42.0);
  try {
    block.parameter("attn.qkv.weight");
    FAIL() << "an unknown parameter name must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn.q.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.block(2), Error);
}

TEST(NnModel, InitializationIsSeededPerUnit) {
  GPTConfig config = tiny_config();
  GPT a(config), b(config);
  for (int u = 0; u < 4; ++u)
    EXPECT_TRUE(ops::equal(a.units()[u]->params(), b.units()[u]->params()));
  // A block built alone (a pipeline stage) starts like the same block in the model.
  Block alone(config, 1);
  EXPECT_TRUE(ops::equal(alone.params(), a.block(1).params()));
  config.seed = 100;
  GPT c(config);
  EXPECT_FALSE(ops::equal(a.block(0).params(), c.block(0).params()));
  // f32 and f64 models start from the same values, up to rounding.
  config.seed = 99;
  config.dtype = DType::f32;
  GPT f32(config);
  EXPECT_LT(max_difference(a.block(0).params(), f32.block(0).params()), 1e-7);
  // LayerNorm weights start at 1, biases at 0.
  EXPECT_EQ(a.block(0).ln1.weight.item(0), 1.0);
  EXPECT_EQ(a.block(0).attn.q.bias.item(0), 0.0);
}

TEST(NnModel, GradReadyHooksRunInReverseWithFinalGradients) {
  GPT model(tiny_config());
  Rng rng(26);
  Tensor tokens = random_ids({2, 6}, 7, rng), targets = random_ids({2, 6}, 7, rng);
  std::vector<std::string> order;
  std::vector<Tensor> at_hook(4);
  model.on_grad_ready([&](Unit& unit) {
    order.push_back(unit.name());
    at_hook[static_cast<std::size_t>(unit.index())] = unit.grads().clone();
  });
  model.zero_grad();
  model.forward(tokens, targets);
  model.backward();
  EXPECT_EQ(order, (std::vector<std::string>{"head", "block.1", "block.0", "embedding"}));
  for (int u = 0; u < 4; ++u)
    EXPECT_TRUE(ops::equal(at_hook[u], model.units()[u]->grads())) << model.units()[u]->name();
  // Backward without a forward is an error; gradients accumulate across backwards.
  EXPECT_THROW(model.backward(), Error);
  model.clear_grad_ready_hooks();
  model.forward(tokens, targets);
  model.backward(0.5);
  for (int u = 0; u < 4; ++u)
    for (std::int64_t i = 0; i < at_hook[u].numel(); i += 7)
      EXPECT_NEAR(model.units()[u]->grads().item(i), 1.5 * at_hook[u].item(i), 1e-12);
}

TEST(NnModel, DeferredWeightGradientsMatchImmediateOnes) {
  GPTConfig config = tiny_config();
  Block immediate(config, 0), deferred(config, 0);
  Rng rng(27);
  Tensor x = random_tensor({2, 5, 8}, rng), dy = random_tensor({2, 5, 8}, rng);
  BlockSaved s1, s2;
  immediate.forward(x, s1);
  deferred.forward(x, s2);
  Tensor dx1 = immediate.backward(dy, s1);
  Tensor dx2 = deferred.backward(dy, s2, WeightGrads::deferred);
  EXPECT_LT(max_difference(dx1, dx2), 1e-15);
  EXPECT_FALSE(s2.pending.empty());
  EXPECT_EQ(ops::sum_squares(deferred.attn.q.weight_grad), 0.0);  // not yet
  deferred.backward_weight(s2);
  EXPECT_TRUE(s2.pending.empty());
  EXPECT_LT(max_difference(immediate.grads(), deferred.grads()), 1e-15);
}

TEST(NnModel, SetBuffersRepointsEveryLayer) {
  GPTConfig config = tiny_config();
  GPT model(config);
  Rng rng(28);
  Tensor tokens = random_ids({2, 6}, 7, rng), targets = random_ids({2, 6}, 7, rng);
  const double before = model.forward(tokens, targets);
  model.release_activations();
  // FSDP-style: a fresh buffer holding the same values, then changed.
  Block& block = model.block(0);
  Tensor fresh = Tensor::empty({block.numel()}, DType::f64, Device::cpu(), MemoryCategory::params);
  fresh.copy_from(block.params());
  Tensor fresh_grads =
      Tensor::zeros({block.numel()}, DType::f64, Device::cpu(), MemoryCategory::grads);
  block.set_buffers(fresh, fresh_grads);
  EXPECT_TRUE(block.attn.proj.weight.shares_storage_with(fresh));
  EXPECT_EQ(model.forward(tokens, targets), before);
  model.backward();
  EXPECT_GT(ops::sum_squares(fresh_grads), 0.0);
  ops::scale(fresh, 0.5);
  EXPECT_NE(model.forward(tokens, targets), before);
  model.release_activations();
  Tensor wrong = Tensor::zeros({block.numel() - 1}, DType::f64);
  EXPECT_THROW(block.set_buffers(wrong, Tensor()), Error);
}

TEST(NnModel, MemoryIsChargedToItsCategories) {
  auto tracker = std::make_shared<MemoryTracker>();
  set_current_memory_tracker(tracker);
  for (AttentionKind kind : {AttentionKind::naive, AttentionKind::flash}) {
    SCOPED_TRACE(attention_kind_name(kind));
    GPTConfig config = tiny_config(kind);
    config.dtype = DType::f32;
    const std::int64_t B = 3, T = 6, C = 8, H = 2, V = 7, L = 2, R = 2;  // R: mlp ratio
    {
      GPT model(config);
      EXPECT_EQ(tracker->live(MemoryCategory::params), model.parameter_count() * 4);
      EXPECT_EQ(tracker->live(MemoryCategory::grads), model.parameter_count() * 4);
      EXPECT_EQ(tracker->live(MemoryCategory::activations), 0);
      Rng rng(29);
      Tensor tokens = random_ids({B, T}, 7, rng), targets = random_ids({B, T}, 7, rng);
      model.forward(tokens, targets);
      // Kept for backward, in elements: the embedding output; per block
      // 2 LayerNorm inputs are block input / mid (counted where made), their
      // outputs, mean and rstd, q, k, v, the attention output, the residual
      // mid, the MLP hidden and GELU output, the block output; then the
      // head's LayerNorm and logits.
      const std::int64_t attention_state =
          kind == AttentionKind::naive ? B * H * T * T : 2 * B * H * T;
      const std::int64_t per_block = 2 * (B * T * C + 2 * B * T)    // ln1, ln2: output, mean, rstd
                                     + 3 * B * T * C                // q, k, v
                                     + B * T * C + attention_state  // attention output, probs/stats
                                     + B * T * C                    // mid = x + attn
                                     + 2 * B * T * R * C            // fc output, GELU output
                                     + B * T * C;                   // block output
      const std::int64_t expected = B * T * C + L * per_block + (B * T * C + 2 * B * T) + B * T * V;
      EXPECT_EQ(tracker->live(MemoryCategory::activations), expected * 4);
      model.backward();
      EXPECT_EQ(tracker->live(MemoryCategory::activations), 0);
      EXPECT_EQ(tracker->live(MemoryCategory::other), 2 * B * T * 4);  // tokens and targets
    }
    EXPECT_EQ(tracker->live(MemoryCategory::params), 0);
    EXPECT_EQ(tracker->live(MemoryCategory::grads), 0);
  }
  set_current_memory_tracker(nullptr);
}

TEST(NnModel, ConfigAndInputErrorsAreClear) {
  GPTConfig config = tiny_config();
  config.heads = 3;
  try {
    GPT model(config);
    FAIL() << "d_model 8 with 3 heads must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("divide by heads"), std::string::npos) << e.what();
  }
  config = tiny_config();
  config.dtype = DType::i32;
  try {
    GPT model(config);
    FAIL() << "an i32 model must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dtype must be f64, f32, bf16 or f16, got i32"),
              std::string::npos)
        << e.what();
  }
  config = tiny_config();
  config.device = Device::cuda(0);
  // Without a GPU the parameters cannot be allocated; with one, the ops that
  // have no CUDA kernel yet say so. Either way: a clear error, not a crash.
  EXPECT_THROW(
      {
        GPT on_gpu(config);
        Tensor ids = Tensor::zeros({1, 4}, DType::i32).to(Device::cuda(0));
        on_gpu.forward(ids, ids);
      },
      Error);

  GPT model(tiny_config());
  Tensor too_long = Tensor::zeros({1, 7}, DType::i32);
  try {
    model.forward(too_long, too_long);
    FAIL() << "T = 7 with context 6 must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context = 6"), std::string::npos) << e.what();
  }
  Tensor floats = Tensor::zeros({1, 4}, DType::f32);
  EXPECT_THROW(model.forward(floats, floats), Error);
  Tensor bad_ids = Tensor::full({1, 4}, 7, DType::i32);
  EXPECT_THROW(model.forward(bad_ids, bad_ids), Error);
}

TEST(NnModel, LogitsMatchTheTrainingForward) {
  GPT model(tiny_config());
  Rng rng(30);
  Tensor tokens = random_ids({2, 6}, 7, rng), targets = random_ids({2, 6}, 7, rng);
  Tensor logits = model.logits(tokens);
  EXPECT_EQ(logits.shape(), (Shape{2, 6, 7}));
  Tensor none;
  EXPECT_NEAR(ops::cross_entropy_forward(logits, targets, none), model.forward(tokens, targets),
              1e-13);
}

}  // namespace
}  // namespace dtp
