// What sharded optimizers (ZeRO, offload) plug into: make_optimizer, the
// virtual clip_gradients that Trainer::step calls, and a Trainer that builds
// its optimizer only when first needed, so set_optimizer() before the first
// step never allocates full-size state.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/trainer.h"
#include "support/harness.h"

namespace dtp {
namespace {

using testing::ScopedTracker;

TrainConfig tiny_run() {
  TrainConfig config;
  config.model.d_model = 32;
  config.model.heads = 2;
  config.model.layers = 1;
  config.steps = 3;
  config.batch = 4;
  config.seq = 8;
  config.synthetic.length = 1 << 12;
  return config;
}

std::int64_t f32_bytes(std::int64_t elements) { return elements * 4; }

TEST(NnOptimizerPlumbing, TrainerBuildsItsOptimizerOnFirstUse) {
  ScopedTracker scope;
  Trainer trainer(tiny_run());
  EXPECT_EQ(scope.tracker->live(MemoryCategory::optimizer), 0)
      << "no optimizer state before it is needed";
  Optimizer& optimizer = trainer.optimizer();
  EXPECT_EQ(optimizer.name(), "adamw");
  EXPECT_EQ(scope.tracker->live(MemoryCategory::optimizer),
            2 * f32_bytes(trainer.model().parameter_count()));  // m and v
  EXPECT_EQ(&trainer.optimizer(), &optimizer) << "built once";
}

TEST(NnOptimizerPlumbing, SetOptimizerBeforeTheFirstStepNeverChargesFullSizeState) {
  ScopedTracker scope;
  MemoryTracker& tracker = *scope.tracker;
  Trainer trainer(tiny_run());
  // Rank 0's shards under ZeRO-1 on two ranks: the first half of every unit.
  std::vector<ParamBuffer> shards;
  std::vector<Tensor> second_halves;
  std::int64_t shard_elements = 0;
  for (Unit* unit : trainer.model().units()) {
    const std::int64_t half = unit->numel() / 2;
    shards.push_back({unit->name(), unit->params().slice(0, half), unit->grads().slice(0, half)});
    second_halves.push_back(unit->params().slice(half, unit->numel() - half).clone());
    shard_elements += half;
  }
  trainer.set_optimizer(make_optimizer(trainer.config(), shards));
  EXPECT_EQ(tracker.live(MemoryCategory::optimizer), 2 * f32_bytes(shard_elements));
  // The peak since the tracker was installed covers the Trainer's construction.
  EXPECT_EQ(tracker.peak(MemoryCategory::optimizer), 2 * f32_bytes(shard_elements));
  for (int s = 0; s < 2; ++s) {
    trainer.step();  // resets the peaks first, so a full-size build inside would show
    EXPECT_EQ(tracker.peak(MemoryCategory::optimizer), 2 * f32_bytes(shard_elements))
        << "step " << s + 1;
  }
  EXPECT_EQ(trainer.optimizer().buffers().size(), shards.size());
  EXPECT_EQ(trainer.optimizer().steps(), 2);
  // Only the shards were updated.
  std::vector<Unit*> units = trainer.model().units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::int64_t half = units[u]->numel() / 2;
    EXPECT_TRUE(
        ops::equal(units[u]->params().slice(half, units[u]->numel() - half), second_halves[u]))
        << units[u]->name();
  }
  EXPECT_THROW(trainer.set_optimizer(nullptr), Error);
}

TEST(NnOptimizerPlumbing, MakeOptimizerFollowsTheConfig) {
  TrainConfig config = tiny_run();
  GPTConfig model_config = config.model;
  model_config.vocab_size = 64;
  GPT model(model_config);
  EXPECT_EQ(make_optimizer(config, param_buffers(model))->name(), "adamw");
  config.optimizer = "sgd";
  config.momentum = 0.5;
  std::unique_ptr<Optimizer> sgd = make_optimizer(config, param_buffers(model));
  ASSERT_EQ(sgd->name(), "sgd");
  EXPECT_EQ(dynamic_cast<SGD&>(*sgd).config().momentum, 0.5);
  config.optimizer = "lion";
  EXPECT_THROW(make_optimizer(config, param_buffers(model)), Error);
}

// A sharded optimizer would all-reduce the squared norm here; this one only
// marks that Trainer::step asked it rather than clipping on its own.
class MarkedClipping : public AdamW {
 public:
  using AdamW::AdamW;
  double clip_gradients(double max_norm) override {
    ++calls;
    return AdamW::clip_gradients(max_norm) + 1000.0;
  }
  int calls = 0;
};

TEST(NnOptimizerPlumbing, TrainerStepClipsThroughTheOptimizer) {
  TrainConfig config = tiny_run();
  Trainer reference(config), trainer(config);
  auto marked = std::make_unique<MarkedClipping>(
      param_buffers(trainer.model()),
      AdamWConfig{config.beta1, config.beta2, 1e-8, config.weight_decay});
  MarkedClipping* seen = marked.get();
  trainer.set_optimizer(std::move(marked));
  for (int s = 0; s < 2; ++s) {
    StepRecord expected = reference.step(), got = trainer.step();
    EXPECT_EQ(got.grad_norm, expected.grad_norm + 1000.0);
    EXPECT_EQ(got.loss, expected.loss) << "the same optimizer, so the same run";
  }
  EXPECT_EQ(seen->calls, 2);
  // The default is clip_grad_norm over the optimizer's buffers.
  std::vector<Tensor> grads = grad_tensors(reference.optimizer().buffers());
  const double norm = global_grad_norm(grads);
  EXPECT_EQ(reference.optimizer().clip_gradients(0.0), norm);
}

}  // namespace
}  // namespace dtp
