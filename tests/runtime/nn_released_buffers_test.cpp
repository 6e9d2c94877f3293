// Releasable unit buffers (FSDP frees a unit's gathered parameters between
// its forward and its backward): the memory really goes, nothing else keeps
// it alive, re-installed parameters give the same gradients bit for bit, and
// using a released unit is a clear error.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/nn.h"
#include "nn_test_helpers.h"
#include "support/harness.h"

namespace dtp {
namespace {

using testing::ScopedTracker;

TEST(NnReleasedBuffers, ReleasingBetweenForwardAndBackwardFreesExactlyTheParameters) {
  ScopedTracker scope;
  MemoryTracker& tracker = *scope.tracker;
  Rng rng(41);
  Tensor tokens = testing::random_ids({2, 6}, 7, rng),
         targets = testing::random_ids({2, 6}, 7, rng);
  GPT never_released(testing::tiny_f64_config()), model(testing::tiny_f64_config());
  never_released.zero_grad();
  never_released.forward(tokens, targets);
  never_released.backward();

  model.zero_grad();
  model.forward(tokens, targets);
  Block& block = model.block(0);
  // What an all-gather would bring back later, made before measuring.
  Tensor gathered = block.params().clone();
  const std::int64_t before = tracker.live(MemoryCategory::params);
  block.set_buffers(Tensor(), block.grads());
  EXPECT_FALSE(block.has_params());
  EXPECT_TRUE(block.has_grads());
  // Saved activations, layers and views must not keep the old storage alive.
  EXPECT_EQ(before - tracker.live(MemoryCategory::params),
            block.numel() * static_cast<std::int64_t>(dtype_size(DType::f64)));
  EXPECT_FALSE(block.attn.q.weight.defined());
  EXPECT_FALSE(block.parameter("mlp.fc.weight").value.defined());
  EXPECT_TRUE(block.attn.q.weight_grad.defined());

  block.set_buffers(gathered, block.grads());
  EXPECT_TRUE(block.has_params());
  model.backward();
  for (std::size_t u = 0; u < model.units().size(); ++u)
    EXPECT_TRUE(ops::equal(model.units()[u]->grads(), never_released.units()[u]->grads()))
        << model.units()[u]->name()
        << ": gradients after re-installing differ from a run that never released";
}

TEST(NnReleasedBuffers, ReleasingBothBuffersLeavesTheUnitHoldingNothing) {
  ScopedTracker scope;
  MemoryTracker& tracker = *scope.tracker;
  GPT model(testing::tiny_f64_config());
  Unit& head = model.head();
  const std::int64_t bytes = head.numel() * static_cast<std::int64_t>(dtype_size(DType::f64));
  const std::int64_t params = tracker.live(MemoryCategory::params),
                     grads = tracker.live(MemoryCategory::grads);
  head.set_buffers(Tensor(), Tensor());
  EXPECT_EQ(params - tracker.live(MemoryCategory::params), bytes);
  EXPECT_EQ(grads - tracker.live(MemoryCategory::grads), bytes);
  EXPECT_FALSE(head.has_params());
  EXPECT_FALSE(head.has_grads());
  EXPECT_NO_THROW(model.zero_grad());  // skips the released gradients
}

TEST(NnReleasedBuffers, RunningAUnitWithoutParametersSaysToGatherThem) {
  GPT model(testing::tiny_f64_config());
  Rng rng(42);
  Tensor tokens = testing::random_ids({1, 4}, 7, rng),
         targets = testing::random_ids({1, 4}, 7, rng);
  Tensor kept = model.block(0).params();
  model.block(0).set_buffers(Tensor(), model.block(0).grads());
  try {
    model.forward(tokens, targets);
    ADD_FAILURE() << "forward through a unit without parameters must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "unit 'block.0' has no parameters: all-gather them before its forward (FSDP)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(model.logits(tokens), Error);
  // Forward with them, release, then backward: the backward needs them too.
  model.block(0).set_buffers(kept, model.block(0).grads());
  model.forward(tokens, targets);
  model.block(0).set_buffers(Tensor(), model.block(0).grads());
  try {
    model.backward();
    ADD_FAILURE() << "backward through a unit without parameters must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "unit 'block.0' has no parameters: all-gather them before its backward"),
              std::string::npos)
        << e.what();
  }
  model.block(0).set_buffers(kept, model.block(0).grads());
  Tensor wrong = Tensor::zeros({model.block(0).numel() + 1}, DType::f64);
  EXPECT_THROW(model.block(0).set_buffers(wrong, Tensor()), Error);
  EXPECT_THROW(model.block(0).set_buffers(Tensor(), wrong), Error);
}

}  // namespace
}  // namespace dtp
