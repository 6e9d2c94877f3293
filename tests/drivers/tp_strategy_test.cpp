// Checkers of the provided tensor-parallel driver and slicing code
// (drivers/04_tensor_parallel/), linked with the reference: the errors for
// sizes that do not split, which parameters are replicated, and what
// `dtp train --strategy tp` reports (the global loss of single-device
// training, every DP group's tokens, per-rank bytes).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "04_tensor_parallel/tensor_parallel.h"
#include "drivers/04_tensor_parallel/tp_strategy.h"
#include "dtp/dtp.h"
#include "support/checkpoints.h"
#include "support/training.h"

namespace dtp::ch04 {
namespace {

using dtp::testing::error_of;
using dtp::testing::tiny_config;

// The strategy with @p options, as the checkpoint checks run it.
testing::RunFn run_with(const TensorParallelRunOptions& options) {
  return [options](const TrainConfig& c) {
    return drivers::run_strategy(c, TensorParallelStrategy(options));
  };
}

TEST(TensorParallelDriver, EvenSplitGivesEqualPartsAndNamesWhatDoesNotSplit) {
  const ChunkRange r = even_split("heads", 12, 4, 3);
  EXPECT_EQ(r.offset, 9);
  EXPECT_EQ(r.length, 3);
  const std::string e = error_of([] { even_split("attention heads", 6, 4, 0); });
  EXPECT_NE(e.find("attention heads: 6 do not split over 4 tensor-parallel ranks"),
            std::string::npos)
      << e;
  EXPECT_NE(error_of([] { even_split("x", 8, 4, 4); }).find("rank 4 is outside the group of 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { even_split("x", 8, 0, 0); }).find("at least 1 rank"), std::string::npos);
}

TEST(TensorParallelDriver, ReplicatedParametersAreTheLayerNormsPositionsAndRowParallelBiases) {
  for (const char* name :
       {"ln1.weight", "ln2.bias", "ln.weight", "positions", "attn.proj.bias", "mlp.proj.bias"})
    EXPECT_TRUE(is_replicated(name)) << name;
  for (const char* name :
       {"tokens", "lm.weight", "attn.q.weight", "attn.v.bias", "attn.proj.weight", "mlp.fc.bias"})
    EXPECT_FALSE(is_replicated(name)) << name;
}

TEST(TensorParallelDriver, ValidateNamesTheFlagOfEverySizeThatDoesNotSplit) {
  TrainConfig config = tiny_config(8, 2);  // heads 2, vocab 32, d_model 16
  auto message = [&](TensorParallelRunOptions o) {
    return error_of([&] { validate_tensor_parallel(config, o); });
  };
  EXPECT_NE(message({.tp = 4}).find("--heads 2 do not split over --tp 4"), std::string::npos);
  EXPECT_NE(message({.tp = 0}).find("--tp"), std::string::npos);
  EXPECT_NE(message({.tp = 2, .dp = 3}).find("--dp 3"), std::string::npos);
  EXPECT_EQ(message({.tp = 2, .dp = 2}), "(no error)");
  config.seq = 3;
  config.batch = 1;
  EXPECT_NE(message({.tp = 2, .dp = 1, .sequence_parallel = true}).find("--sequence-parallel"),
            std::string::npos);
}

TEST(TensorParallelDriver, TrainReportsTheSingleDeviceLossAndEveryRanksBytes) {
  TrainConfig config = tiny_config(8, 3);
  config.model.heads = 4;
  std::vector<double> single;
  for (const StepRecord& s : train(config).steps) single.push_back(s.loss);
  const TensorParallelRunOptions options{.tp = 2, .dp = 2, .sequence_parallel = true};
  std::vector<drivers::ReportTable> reports;
  TrainResult result =
      drivers::run_strategy(config, TensorParallelStrategy(options),
                            [&](const drivers::StepReport& r) { reports.push_back(r.ranks); });
  ASSERT_EQ(result.steps.size(), 3u);
  for (std::size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(result.steps[s].loss, single[s], 1e-10) << "step " << s + 1;
    EXPECT_EQ(result.steps[s].tokens, config.batch * config.seq)
        << "every DP group's tokens, each TP group once";
  }
  ASSERT_EQ(reports.size(), 3u);
  ASSERT_EQ(reports[0].rows.size(), 4u) << "a row per rank";
  for (std::size_t rank = 0; rank < 4; ++rank) {
    const std::string label = std::to_string(rank) + " (tp " + std::to_string(rank % 2) + ", dp " +
                              std::to_string(rank / 2) + ")";
    EXPECT_EQ(reports[0].rows[rank].label, label) << "TP groups are consecutive ranks";
    EXPECT_GT(reports[0].at(rank, "params"), 0) << "rank " << rank;
    EXPECT_GT(reports[0].at(rank, "activation peak"), 0) << "rank " << rank;
    EXPECT_GT(reports[0].at(rank, "moved"), 0) << "rank " << rank;
  }
}

// --- checkpoints: --save, --resume, --stop-after under tp -------------------------------

TrainConfig tp_run(std::int64_t steps) {
  TrainConfig config = tiny_config(8, steps);
  config.strategy = "tp";
  config.optimizer = "adamw";  // state to carry over, sliced: m, v and the step count
  config.warmup = 2;
  return config;
}

const TensorParallelRunOptions kTpVariants[] = {
    {.tp = 2, .dp = 1, .sequence_parallel = false},
    {.tp = 2, .dp = 2, .sequence_parallel = true},
};

std::string flags(const TensorParallelRunOptions& o) {
  return "--tp " + std::to_string(o.tp) + " --dp " + std::to_string(o.dp) +
         (o.sequence_parallel ? " --sequence-parallel" : "");
}

// Each rank holds rows or columns of most weights: world rank 0 puts them
// back together, and on --resume each rank cuts its own out again.
TEST(TensorParallelDriverCheckpoints, ThreeStepsThenResumingEqualsEightStepsBitForBit) {
  testing::TempFolder folder;
  for (const TensorParallelRunOptions& o : kTpVariants) {
    testing::expect_slices_equal_straight_run(tp_run(8), 3, folder, flags(o), run_with(o));
  }
}

// The file is a single-device run's: every parameter whole (rows
// concatenated, columns interleaved back), the optimizer state in the serial
// units' layout, with the values the single-device run trains (to rounding).
TEST(TensorParallelDriverCheckpoints, AConsolidatedCheckpointHasTheSingleDeviceLayoutAndValues) {
  testing::TempFolder folder;
  TrainConfig single = tp_run(2);
  single.strategy = "single";
  const Checkpoint expected = testing::saved_checkpoint(single, folder);
  for (const TensorParallelRunOptions& o : kTpVariants) {
    testing::expect_single_device_layout(
        expected, testing::saved_checkpoint(tp_run(2), folder, run_with(o)), flags(o),
        "a slice put back in the wrong rows or columns?");
  }
}

}  // namespace
}  // namespace dtp::ch04
