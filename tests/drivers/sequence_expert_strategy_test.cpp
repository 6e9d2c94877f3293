// Checkers of the provided sequence- and expert-parallel drivers
// (drivers/06_sequence_expert/sp_strategy.cpp, ep_strategy.cpp), linked with
// the reference: the errors for sizes that do not split, and what `dtp train
// --strategy sp` and `--strategy ep` report (the single-device loss, the
// tokens of the step, every rank's positions, experts and bytes).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "06_sequence_expert/sequence_expert.h"
#include "drivers/06_sequence_expert/ep_strategy.h"
#include "drivers/06_sequence_expert/sp_strategy.h"
#include "dtp/dtp.h"
#include "support/checkpoints.h"
#include "support/training.h"

namespace dtp::ch06 {
namespace {

using dtp::testing::error_of;
using dtp::testing::tiny_config;

// A strategy as the checkpoint checks run it.
template <class Strategy, class Options>
testing::RunFn run_with(const Options& options) {
  return [options](const TrainConfig& c) { return drivers::run_strategy(c, Strategy(options)); };
}

TEST(SequenceParallelDriver, ValidateNamesTheFlagOfEverySizeThatDoesNotSplit) {
  TrainConfig config = tiny_config(4, 2);  // heads 2, seq 8
  auto message = [&](SequenceParallelRunOptions o) {
    return error_of([&] { validate_sequence_parallel(config, o); });
  };
  EXPECT_NE(message({.sp = 4}).find("sp: --heads 2 do not split over --sp 4"), std::string::npos);
  EXPECT_NE(message({.sp = 0}).find("--sp (ranks per sequence-parallel group) must be at least 1"),
            std::string::npos);
  EXPECT_NE(message({.sp = 3, .kind = SequenceParallelKind::ring})
                .find("--seq 8 does not split into --sp 3"),
            std::string::npos);
  EXPECT_NE(
      message({.sp = 8, .kind = SequenceParallelKind::zigzag}).find("2 x --sp = 16 zigzag chunks"),
      std::string::npos);
  EXPECT_NE(message({.sp = 4, .kind = SequenceParallelKind::hybrid, .ulysses = 3})
                .find("--sp-ulysses 3 does not divide"),
            std::string::npos);
  EXPECT_EQ(message({.sp = 4, .kind = SequenceParallelKind::ring}), "(no error)");
  EXPECT_EQ(message({.sp = 4, .kind = SequenceParallelKind::hybrid, .ulysses = 2}), "(no error)");
  config.model.experts = 2;
  EXPECT_NE(message({.sp = 2}).find("--moe-experts is not supported with --strategy sp"),
            std::string::npos);
  EXPECT_EQ(parse_sequence_parallel_kind("zigzag"), SequenceParallelKind::zigzag);
  EXPECT_NE(error_of([] {
              parse_sequence_parallel_kind("tree");
            }).find("accepted: ulysses, ring, zigzag, hybrid"),
            std::string::npos);
}

TEST(SequenceParallelDriver, TrainReportsTheSingleDeviceLossPositionsAndBalancedZigzagBlocks) {
  TrainConfig config = tiny_config(4, 3);
  config.model.heads = 4;
  std::vector<double> single;
  for (const StepRecord& s : train(config).steps) single.push_back(s.loss);
  for (SequenceParallelKind kind : {SequenceParallelKind::ulysses, SequenceParallelKind::ring,
                                    SequenceParallelKind::zigzag, SequenceParallelKind::hybrid}) {
    SCOPED_TRACE(sequence_parallel_kind_name(kind));
    const SequenceParallelRunOptions options{.sp = 4, .kind = kind, .ulysses = 2};
    std::vector<drivers::ReportTable> reports;
    const TrainResult result =
        drivers::run_strategy(config, SequenceParallelStrategy(options),
                              [&](const drivers::StepReport& r) { reports.push_back(r.ranks); });
    ASSERT_EQ(result.steps.size(), 3u);
    for (std::size_t s = 0; s < 3; ++s) {
      EXPECT_NEAR(result.steps[s].loss, single[s], 1e-10) << "step " << s + 1;
      EXPECT_EQ(result.steps[s].tokens, config.batch * config.seq) << "the batch's tokens, once";
    }
    ASSERT_EQ(reports.size(), 3u);
    const drivers::ReportTable& table = reports[0];
    ASSERT_EQ(table.rows.size(), 4u) << "a row per rank";
    for (int r = 0; r < 4; ++r) {
      // seq 8 on 4 ranks: [2r, 2r + 2); zigzag: [r, r + 1) and its mirror [7 - r, 8 - r).
      const std::string positions =
          kind == SequenceParallelKind::zigzag
              ? "[" + std::to_string(r) + ", " + std::to_string(r + 1) + ") [" +
                    std::to_string(7 - r) + ", " + std::to_string(8 - r) + ")"
              : "[" + std::to_string(2 * r) + ", " + std::to_string(2 * r + 2) + ")";
      EXPECT_EQ(table.rows[static_cast<std::size_t>(r)].label, std::to_string(r) + " " + positions);
      EXPECT_GT(table.at(r, "moved"), 0) << "rank " << r;
      EXPECT_GT(table.at(r, "activation peak"), 0) << "rank " << r;
      // 2 blocks, forward and backward: zigzag 2 n + 1 = 9 half-size blocks each way.
      if (kind == SequenceParallelKind::zigzag) {
        EXPECT_EQ(table.at(r, "attention blocks"), 2 * 2 * 9) << "rank " << r;
      }
      if (kind == SequenceParallelKind::ring) {
        EXPECT_EQ(table.at(r, "attention blocks"), 2 * 2 * (r + 1)) << "rank " << r;
      }
    }
    if (kind == SequenceParallelKind::ulysses) {
      EXPECT_EQ(table.columns.size(), 2u) << "Ulysses computes no attention blocks: no such column";
    }
  }
}

TEST(ExpertParallelDriver, ValidateNamesTheFlagOfEverySizeThatDoesNotSplit) {
  TrainConfig config = tiny_config(8, 2);
  auto message = [&](ExpertParallelRunOptions o) {
    return error_of([&] { validate_expert_parallel(config, o); });
  };
  EXPECT_NE(message({.world = 2}).find("give --moe-experts E (a multiple of --world 2)"),
            std::string::npos);
  config.model.experts = 6;
  EXPECT_NE(message({.world = 4}).find("--moe-experts 6 do not split over --world 4"),
            std::string::npos);
  EXPECT_EQ(message({.world = 2}), "(no error)");
  config.batch = 6;
  EXPECT_EQ(message({.world = 3}), "(no error)");
  EXPECT_NE(message({.world = 0}).find("--world (expert-parallel ranks) must be at least 1"),
            std::string::npos);
  config.batch = 3;
  EXPECT_NE(message({.world = 2}).find("the global batch (--batch 3) must split into --world 2"),
            std::string::npos);
  config.batch = 8;
  config.model.moe_groups = 2;
  EXPECT_NE(message({.world = 2}).find("--moe-groups 2 is not supported"), std::string::npos);
}

TEST(ExpertParallelDriver, TrainReportsTheLossOfOneDeviceRoutingInGroupsAndEveryRanksExperts) {
  TrainConfig config = tiny_config(8, 3);
  config.model.experts = 4;
  config.model.top_k = 2;
  config.model.capacity_factor = 0.75;  // drops choices
  TrainConfig grouped = config;
  grouped.model.moe_groups = 2;
  std::vector<double> single;
  for (const StepRecord& s : train(grouped).steps) single.push_back(s.loss);
  std::vector<drivers::ReportTable> reports;
  const TrainResult result =
      drivers::run_strategy(config, ExpertParallelStrategy({.world = 2}),
                            [&](const drivers::StepReport& r) { reports.push_back(r.ranks); });
  ASSERT_EQ(result.steps.size(), 3u);
  for (std::size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(result.steps[s].loss, single[s], 1e-10) << "step " << s + 1;
    EXPECT_EQ(result.steps[s].tokens, config.batch * config.seq) << "every rank's tokens";
  }
  ASSERT_EQ(reports.size(), 3u);
  ASSERT_EQ(reports[0].rows.size(), 2u) << "a row per rank";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(reports[0].rows[static_cast<std::size_t>(r)].label,
              std::to_string(r) + " (experts " + std::to_string(2 * r) + "-" +
                  std::to_string(2 * r + 1) + ")");
    EXPECT_EQ(reports[0].at(r, "tokens"), config.batch * config.seq / 2);
    EXPECT_GT(reports[0].at(r, "dropped"), 0)
        << "rank " << r << ": capacity factor 0.75 must drop choices";
    EXPECT_GT(reports[0].at(r, "moved"), 0) << "rank " << r;
  }
}

// --- checkpoints: --save, --resume, --stop-after ----------------------------------------

TrainConfig adamw_run(TrainConfig config) {
  config.optimizer = "adamw";  // state to carry over: m, v and the step count
  config.warmup = 2;
  return config;
}

// Every rank holds the whole model: rank 0's trainer saves it, as under DDP.
TEST(SequenceParallelDriverCheckpoints, ThreeStepsThenResumingEqualsEightStepsBitForBit) {
  testing::TempFolder folder;
  TrainConfig config = adamw_run(tiny_config(4, 8));
  config.model.heads = 4;
  config.strategy = "sp";
  for (SequenceParallelKind kind : {SequenceParallelKind::ring, SequenceParallelKind::hybrid}) {
    testing::expect_slices_equal_straight_run(
        config, 3, folder, std::string("--sp 4 --sp-kind ") + sequence_parallel_kind_name(kind),
        run_with<SequenceParallelStrategy>(
            SequenceParallelRunOptions{.sp = 4, .kind = kind, .ulysses = 2}));
  }
}

TrainConfig moe_run(std::int64_t steps) {
  TrainConfig config = adamw_run(tiny_config(8, steps));
  config.model.experts = 4;
  config.model.top_k = 2;
  config.model.capacity_factor = 0.75;  // drops choices
  return config;
}

// Each rank holds two of the four experts: rank 0 gathers them, and on
// --resume each rank takes its own back.
TEST(ExpertParallelDriverCheckpoints, ThreeStepsThenResumingEqualsEightStepsBitForBit) {
  testing::TempFolder folder;
  TrainConfig config = moe_run(8);
  config.strategy = "ep";
  testing::expect_slices_equal_straight_run(
      config, 3, folder, "ep --world 2",
      run_with<ExpertParallelStrategy>(ExpertParallelRunOptions{.world = 2}));
}

// The file is a single-device run's: every expert of every block, named and
// laid out as one device names them, with the values the single-device run
// (routing in 2 groups, as 2 ranks route) trains, to rounding.
TEST(ExpertParallelDriverCheckpoints, AConsolidatedCheckpointHasTheSingleDeviceLayoutAndValues) {
  testing::TempFolder folder;
  TrainConfig single = moe_run(2);
  single.model.moe_groups = 2;
  TrainConfig config = moe_run(2);
  config.strategy = "ep";
  testing::expect_single_device_layout(
      testing::saved_checkpoint(single, folder),
      testing::saved_checkpoint(
          config, folder, run_with<ExpertParallelStrategy>(ExpertParallelRunOptions{.world = 2})),
      "ep --world 2", "another rank's expert, or the wrong region?");
}

}  // namespace
}  // namespace dtp::ch06
