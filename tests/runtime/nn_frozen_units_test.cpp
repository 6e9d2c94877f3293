// Frozen units and Linear adapters (what LoRA, chapter 08, stands on): a
// frozen unit keeps no gradient buffer and computes no parameter gradient,
// yet passes gradients on; an adapter on one of its Linears trains.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/nn.h"
#include "nn_test_helpers.h"

namespace dtp {
namespace {

GPTConfig tiny_model() { return testing::tiny_f64_config(); }

Tensor ids(std::uint64_t seed) {
  Tensor t = Tensor::empty({2, 6}, DType::i32);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<std::int32_t>()[i] = static_cast<std::int32_t>((i * 5 + seed) % 7);
  return t;
}

/// y += x M^T with its own M [out, in] and gradient: shaped like the Linear's
/// own weight, so with M = 0 its gradient must equal the weight's, bit for bit.
class ExtraWeight : public LinearAdapter {
 public:
  ExtraWeight(std::int64_t out, std::int64_t in)
      : m(Tensor::zeros({out, in}, DType::f64)), m_grad(Tensor::zeros({out, in}, DType::f64)) {}
  Tensor forward(const Tensor& x, Tensor& y) const override {
    ops::matmul(x, m, y, false, true, 1.0, 1.0);
    return Tensor();
  }
  void backward_input(const Tensor& dy, Tensor& dx) const override {
    ops::matmul(dy, m, dx, false, false, 1.0, 1.0);
  }
  void backward_weight(const Tensor& dy, const Tensor& x, const Tensor&) const override {
    Tensor g = m_grad;
    ops::matmul(dy, x, g, true, false, 1.0, 1.0);
  }
  Tensor m, m_grad;
};

TEST(NnFrozenUnits, AFrozenModelKeepsNoGradientsAndItsAdapterGetsTheWeightsGradient) {
  const GPTConfig config = tiny_model();
  GPT trained(config), frozen(config);
  trained.zero_grad();
  const double loss = trained.forward(ids(1), ids(2));
  trained.backward();

  std::vector<Tensor> before;
  const std::int64_t grads_before = current_memory_tracker()->live(MemoryCategory::grads);
  for (Unit* unit : frozen.units()) {
    unit->freeze();
    EXPECT_TRUE(unit->frozen());
    EXPECT_FALSE(unit->has_grads()) << unit->name() << " keeps a gradient buffer after freeze()";
    before.push_back(unit->params().clone());
  }
  EXPECT_EQ(grads_before - current_memory_tracker()->live(MemoryCategory::grads),
            frozen.parameter_count() * static_cast<std::int64_t>(sizeof(double)))
      << "frozen units must release all of their gradient memory";
  Linear& q = frozen.block(1).attn.q;
  ExtraWeight extra(q.out_features, q.in_features);
  q.adapter = &extra;
  EXPECT_EQ(frozen.forward(ids(1), ids(2)), loss)
      << "an adapter with M = 0 must not change the loss";
  frozen.backward();
  const Tensor& expected = trained.block(1).attn.q.weight_grad;
  ASSERT_EQ(std::memcmp(extra.m_grad.raw(), expected.raw(), expected.nbytes()), 0)
      << "the adapter's gradient must equal what the unfrozen Linear's weight gets";
  const auto units = frozen.units();
  for (std::size_t u = 0; u < units.size(); ++u)
    EXPECT_EQ(std::memcmp(units[u]->params().raw(), before[u].raw(), before[u].nbytes()), 0)
        << units[u]->name() << "'s parameters changed";
  q.adapter = nullptr;
}

TEST(NnFrozenUnits, GradientsFlowThroughFrozenBlocksToAnEarlierAdapter) {
  const GPTConfig config = tiny_model();
  GPT trained(config), frozen(config);
  trained.zero_grad();
  trained.forward(ids(3), ids(4));
  trained.backward();
  for (Unit* unit : frozen.units()) unit->freeze();
  Linear& fc = frozen.block(0).mlp.fc;
  ExtraWeight extra(fc.out_features, fc.in_features);
  fc.adapter = &extra;
  frozen.forward(ids(3), ids(4));
  frozen.backward();
  const Tensor& expected = trained.block(0).mlp.fc.weight_grad;
  EXPECT_EQ(std::memcmp(extra.m_grad.raw(), expected.raw(), expected.nbytes()), 0)
      << "block 0's adapter must get the gradient that passed through frozen block 1 and the head";
}

TEST(NnFrozenUnits, AFrozenUnitRefusesAGradientBuffer) {
  GPT model(tiny_model());
  Unit& head = model.head();
  head.freeze();
  try {
    head.set_buffers(head.params(), Tensor::zeros({head.numel()}, DType::f64));
    ADD_FAILURE() << "a frozen unit must refuse a gradient buffer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'head' is frozen"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dtp
