// Checkers of the provided sequence- and expert-parallel drivers
// (drivers/06_sequence_expert/sp_strategy.cpp, ep_strategy.cpp), linked with
// the reference: the errors for sizes that do not split, and what `dtp train
// --strategy sp` and `--strategy ep` report (the single-device loss, the
// tokens of the step, every rank's positions, experts and bytes).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "06_sequence_expert/sequence_expert.h"
#include "dtp/dtp.h"
#include "support/checkpoints.h"
#include "support/training.h"

namespace dtp::ch06 {
namespace {

using dtp::testing::error_of;
using dtp::testing::tiny_config;

TEST(SequenceParallelDriver, ValidateNamesTheFlagOfEverySizeThatDoesNotSplit) {
  TrainConfig config = tiny_config(4, 2);  // heads 2, seq 8
  auto message = [&](SequenceParallelRunOptions o) { return error_of([&] { validate_sequence_parallel(config, o); }); };
  EXPECT_NE(message({.sp = 4}).find("sp: --heads 2 do not split over --sp 4"), std::string::npos);
  EXPECT_NE(message({.sp = 0}).find("--sp (ranks per sequence-parallel group) must be at least 1"), std::string::npos);
  EXPECT_NE(message({.sp = 3, .kind = SequenceParallelKind::ring}).find("--seq 8 does not split into --sp 3"),
            std::string::npos);
  EXPECT_NE(message({.sp = 8, .kind = SequenceParallelKind::zigzag}).find("2 x --sp = 16 zigzag chunks"),
            std::string::npos);
  EXPECT_NE(message({.sp = 4, .kind = SequenceParallelKind::hybrid, .ulysses = 3}).find("--sp-ulysses 3 does not divide"),
            std::string::npos);
  EXPECT_EQ(message({.sp = 4, .kind = SequenceParallelKind::ring}), "(no error)");
  EXPECT_EQ(message({.sp = 4, .kind = SequenceParallelKind::hybrid, .ulysses = 2}), "(no error)");
  config.model.experts = 2;
  EXPECT_NE(message({.sp = 2}).find("--moe-experts is not supported with --strategy sp"), std::string::npos);
  EXPECT_EQ(parse_sequence_parallel_kind("zigzag"), SequenceParallelKind::zigzag);
  EXPECT_NE(error_of([] { parse_sequence_parallel_kind("tree"); }).find("accepted: ulysses, ring, zigzag, hybrid"),
            std::string::npos);
}

TEST(SequenceParallelDriver, TrainReportsTheSingleDeviceLossPositionsAndBalancedZigzagBlocks) {
  TrainConfig config = tiny_config(4, 3);
  config.model.heads = 4;
  std::vector<double> single;
  for (const StepRecord& s : train_single(config).steps) single.push_back(s.loss);
  for (SequenceParallelKind kind : {SequenceParallelKind::ulysses, SequenceParallelKind::ring,
                                    SequenceParallelKind::zigzag, SequenceParallelKind::hybrid}) {
    SCOPED_TRACE(sequence_parallel_kind_name(kind));
    SequenceParallelRunOptions options{.sp = 4, .kind = kind, .ulysses = 2};
    std::vector<std::vector<RankSequenceParallelStep>> reports;
    options.on_ranks = [&](std::int64_t, const std::vector<RankSequenceParallelStep>& ranks) { reports.push_back(ranks); };
    register_sequence_parallel_strategy(options);
    config.strategy = "sp";
    const TrainResult result = train(config);
    ASSERT_EQ(result.steps.size(), 3u);
    for (std::size_t s = 0; s < 3; ++s) {
      EXPECT_NEAR(result.steps[s].loss, single[s], 1e-10) << "step " << s + 1;
      EXPECT_EQ(result.steps[s].tokens, config.batch * config.seq) << "the batch's tokens, once";
    }
    ASSERT_EQ(reports.size(), 3u);
    ASSERT_EQ(reports[0].size(), 4u);
    for (const RankSequenceParallelStep& r : reports[0]) {
      EXPECT_EQ(r.positions.size(), kind == SequenceParallelKind::zigzag ? 2u : 1u) << "rank " << r.rank;
      EXPECT_EQ(r.positions[0].start, kind == SequenceParallelKind::zigzag ? r.rank : 2 * r.rank) << "rank " << r.rank;
      EXPECT_GT(r.bytes_moved, 0) << "rank " << r.rank;
      EXPECT_GT(r.activation_peak, 0) << "rank " << r.rank;
      // 2 blocks, forward and backward: zigzag 2 n + 1 = 9 half-size blocks each way.
      if (kind == SequenceParallelKind::zigzag) EXPECT_EQ(r.attention_blocks, 2 * 2 * 9) << "rank " << r.rank;
      if (kind == SequenceParallelKind::ring) EXPECT_EQ(r.attention_blocks, 2 * 2 * (r.rank + 1)) << "rank " << r.rank;
    }
  }
}

TEST(ExpertParallelDriver, ValidateNamesTheFlagOfEverySizeThatDoesNotSplit) {
  TrainConfig config = tiny_config(8, 2);
  auto message = [&](ExpertParallelRunOptions o) { return error_of([&] { validate_expert_parallel(config, o); }); };
  EXPECT_NE(message({.world = 2}).find("give --moe-experts E (a multiple of --world 2)"), std::string::npos);
  config.model.experts = 6;
  EXPECT_NE(message({.world = 4}).find("--moe-experts 6 do not split over --world 4"), std::string::npos);
  EXPECT_EQ(message({.world = 2}), "(no error)");
  config.batch = 6;
  EXPECT_EQ(message({.world = 3}), "(no error)");
  EXPECT_NE(message({.world = 0}).find("--world (expert-parallel ranks) must be at least 1"), std::string::npos);
  config.batch = 3;
  EXPECT_NE(message({.world = 2}).find("the global batch (--batch 3) must split into --world 2"), std::string::npos);
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
  for (const StepRecord& s : train_single(grouped).steps) single.push_back(s.loss);
  ExpertParallelRunOptions options{.world = 2};
  std::vector<std::vector<RankExpertParallelStep>> reports;
  options.on_ranks = [&](std::int64_t, const std::vector<RankExpertParallelStep>& ranks) { reports.push_back(ranks); };
  register_expert_parallel_strategy(options);
  config.strategy = "ep";
  const TrainResult result = train(config);
  ASSERT_EQ(result.steps.size(), 3u);
  for (std::size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(result.steps[s].loss, single[s], 1e-10) << "step " << s + 1;
    EXPECT_EQ(result.steps[s].tokens, config.batch * config.seq) << "every rank's tokens";
  }
  ASSERT_EQ(reports.size(), 3u);
  ASSERT_EQ(reports[0].size(), 2u);
  for (const RankExpertParallelStep& r : reports[0]) {
    EXPECT_EQ(r.first_expert, 2 * r.rank);
    EXPECT_EQ(r.experts, 2);
    EXPECT_EQ(r.tokens, config.batch * config.seq / 2);
    EXPECT_GT(r.dropped, 0) << "rank " << r.rank << ": capacity factor 0.75 must drop choices";
    EXPECT_GT(r.bytes_moved, 0) << "rank " << r.rank;
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
    register_sequence_parallel_strategy({.sp = 4, .kind = kind, .ulysses = 2});
    testing::expect_slices_equal_straight_run(config, 3, folder,
                                              std::string("--sp 4 --sp-kind ") + sequence_parallel_kind_name(kind));
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
  register_expert_parallel_strategy({.world = 2});
  testing::expect_slices_equal_straight_run(config, 3, folder, "ep --world 2");
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
  register_expert_parallel_strategy({.world = 2});
  testing::expect_single_device_layout(testing::saved_checkpoint(single, folder),
                                       testing::saved_checkpoint(config, folder), "ep --world 2",
                                       "another rank's expert, or the wrong region?");
}

}  // namespace
}  // namespace dtp::ch06
