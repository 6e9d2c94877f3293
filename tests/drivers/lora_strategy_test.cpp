// Checkers of the provided LoRA driver (drivers/08_lora/lora_strategy.cpp),
// linked with the reference: its checkpoints. --save writes the adapters and
// their optimizer state only (the frozen base comes from --load again), a
// run trained in slices equals the run never stopped, bit for bit, on one
// rank and on two, and --save-merged writes a whole model for --load.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "08_lora/lora.h"
#include "drivers/08_lora/lora_strategy.h"
#include "dtp/checkpoint.h"
#include "dtp/dtp.h"
#include "dtp/train_checkpoint.h"
#include "support/checkpoints.h"
#include "support/harness.h"
#include "support/training.h"

namespace dtp::ch08 {
namespace {

using testing::error_of;
using testing::TempFolder;

TrainConfig base_run(std::int64_t steps) {
  TrainConfig config = testing::tiny_config(8, steps);
  config.seed = 5;
  config.optimizer = "adamw";  // state to carry over: m, v and the step count
  config.warmup = 2;
  return config;
}

LoraRunOptions lora_options(int world) {
  LoraRunOptions options;
  options.lora.rank = 2;
  options.lora.alpha = 4;
  options.lora.seed = 9;
  options.world = world;
  return options;
}

// The strategy with @p options, as `dtp train --lora-rank` runs it.
testing::RunFn run_with(const LoraRunOptions& options) {
  return
      [options](const TrainConfig& c) { return drivers::run_strategy(c, LoraStrategy(options)); };
}

// A LoRA run on @p base: its step losses.
std::vector<double> train_lora(const TrainConfig& config, const LoraRunOptions& options) {
  std::vector<double> losses;
  for (const StepRecord& r : run_with(options)(config).steps) losses.push_back(r.loss);
  return losses;
}

class LoraDriverCheckpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    TrainConfig pretrain = base_run(3);
    pretrain.save_path = base_path();
    train(pretrain);  // the base every run below starts from (--load)
  }
  std::string base_path() const { return folder_.file("base.ckpt"); }
  std::string file(const std::string& name) const { return folder_.file(name); }
  TrainConfig from_base(std::int64_t steps) const {
    TrainConfig config = base_run(steps);
    config.seed = 6;  // another run on other batches
    config.load_path = base_path();
    return config;
  }
  TempFolder folder_;  // the base and every run's files
};

TEST_F(LoraDriverCheckpoints, SaveHoldsTheAdaptersAndTheirOptimizerStateNotTheBase) {
  TrainConfig config = from_base(2);
  config.save_path = file("adapters.ckpt");
  train_lora(config, lora_options(1));
  const Checkpoint saved = read_checkpoint(config.save_path);
  EXPECT_EQ(saved.kind, "training");
  EXPECT_EQ(saved.step, 2);
  GPT model(TrainConfig(config).resolved_model());
  const std::int64_t blocks = model.config().layers;
  std::vector<std::string> names;
  for (const NamedTensor& t : saved.tensors) names.push_back(t.name);
  for (const std::string& name : names)
    EXPECT_NE(name.rfind("params/", 0), 0u)
        << "the frozen base must not be saved (--load gives it), found " << name;
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::string adapter = "extra/block." + std::to_string(b) + ".lora";
    EXPECT_TRUE(saved.has(adapter))
        << "block " << b << "'s adapters are the run's trained parameters: " << adapter;
  }
  const JsonValue* settings = saved.config.find("strategy_settings");
  ASSERT_NE(settings, nullptr) << "the file records the LoRA settings";
  EXPECT_EQ(settings->at("--lora-rank").as_string("rank"), "2");
  EXPECT_EQ(settings->at("--load").as_string("base"), base_path());
  const std::string message = error_of([&] {
    GPT into(model.config());
    load_parameters(into, saved, config.save_path);
  });
  EXPECT_NE(message.find("it is a LoRA run's checkpoint"), std::string::npos)
      << "--load of an adapter file must say what it is:\n"
      << message;
}

TEST_F(LoraDriverCheckpoints, ThreeStepsThenResumingEqualsSevenStepsBitForBit) {
  for (const int world : {1, 2}) {
    TrainConfig config = from_base(7);  // resumed with the base from --load again
    config.strategy = "lora";
    testing::expect_slices_equal_straight_run(
        config, 3, folder_, "LoRA, world " + std::to_string(world), run_with(lora_options(world)));
  }
}

TEST_F(LoraDriverCheckpoints, ResumingWithAnotherRankOrBaseNamesTheSetting) {
  TrainConfig first = from_base(4);
  first.stop_after = 2;
  first.save_path = file("run.ckpt");
  train_lora(first, lora_options(1));
  TrainConfig second = from_base(4);
  second.resume_path = first.save_path;
  LoraRunOptions other = lora_options(1);
  other.lora.rank = 3;
  const std::string message = error_of([&] { train_lora(second, other); });
  EXPECT_NE(message.find("strategy_settings.--lora-rank \"2\" in the saved run, \"3\" in this one"),
            std::string::npos)
      << message;
  TrainConfig moved = from_base(4);
  moved.resume_path = first.save_path;
  moved.load_path = file("copy.ckpt");
  std::filesystem::copy_file(base_path(), moved.load_path);
  const std::string base = error_of([&] { train_lora(moved, lora_options(1)); });
  EXPECT_NE(base.find("strategy_settings.--load"), std::string::npos)
      << "the base a run resumes on must be the one it was saved on:\n"
      << base;
}

TEST_F(LoraDriverCheckpoints, SaveMergedWritesAWholeModelForLoad) {
  TrainConfig config = from_base(2);
  LoraRunOptions options = lora_options(1);
  options.save_merged_path = file("merged.ckpt");
  train_lora(config, options);
  const Checkpoint merged = read_checkpoint(options.save_merged_path);
  EXPECT_EQ(merged.kind, "model");
  GPT model(TrainConfig(config).resolved_model());
  load_parameters(model, merged, options.save_merged_path);  // throws if a parameter is missing
  const Checkpoint base = read_checkpoint(base_path());
  const Tensor& q_base = base.tensor("params/block.0.attn.q.weight");
  const Tensor& q_merged = merged.tensor("params/block.0.attn.q.weight");
  EXPECT_NE(std::memcmp(q_base.raw(), q_merged.raw(), q_base.nbytes()), 0)
      << "an adapted weight of the merged model must differ from the base's (B is no longer 0 "
         "after 2 steps)";
}

}  // namespace
}  // namespace dtp::ch08
