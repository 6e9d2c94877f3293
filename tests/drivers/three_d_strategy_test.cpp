// Checkers of the provided 3D driver (drivers/12_3d_parallelism/), linked
// with the reference: the model's partition and refusals, the strategy's
// flag checks, and what `dtp train --strategy 3d` reports (single-device
// training's loss, every replica's tokens once, a row per rank).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "12_3d_parallelism/three_d.h"
#include "drivers/12_3d_parallelism/three_d_strategy.h"
#include "dtp/dtp.h"
#include "support/harness.h"
#include "support/training.h"

namespace dtp::ch12 {
namespace {

using dtp::testing::error_of;
using dtp::testing::tiny_config;
using K = ch05::ScheduleKind;

TEST(ThreeDDriver, PartitionGivesEachVirtualStageEqualLayersEmbeddingFirstHeadLast) {
  using R = ch05::UnitRange;
  EXPECT_EQ(three_d_partition(4, 2), (std::vector<R>{{0, 3}, {3, 3}}));
  EXPECT_EQ(three_d_partition(4, 4), (std::vector<R>{{0, 2}, {2, 1}, {3, 1}, {4, 2}}));
  EXPECT_EQ(three_d_partition(2, 1), (std::vector<R>{{0, 4}}));
  EXPECT_NE(
      error_of([] { three_d_partition(4, 3); }).find("4 layers do not split into 3 virtual stages"),
      std::string::npos);
}

TEST(ThreeDDriver, TheModelRefusesWhatItCannotCut) {
  struct Case {
    MeshShape shape;
    ThreeDOptions options;
    int heads;
    const char* expected;
  };
  const Case cases[] = {
      {{1, 1, 4}, {}, 2, "2 heads do not split over tp 4"},
      {{1, 2, 1}, {K::zb_h1, 2, 1, false}, 2, "zb-h1 splits the backward"},
      {{1, 2, 1}, {K::interleaved, 2, 1, false}, 2, "needs chunks >= 2"},
      {{1, 2, 1}, {K::interleaved, 3, 2, false}, 2, "multiple of pp 2"},
      {{1, 2, 1}, {K::one_f_one_b, 2, 2, false}, 2, "runs one chunk per rank"},
      {{1, 4, 1}, {K::interleaved, 4, 2, false}, 2, "4 layers do not split into 8 virtual"},
  };
  for (const Case& c : cases) {
    const int world = c.shape.dp * c.shape.pp * c.shape.tp;
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    dtp::testing::run_ranks(world, [&](Comm& comm) {
      GPTConfig model = tiny_config().model;
      model.layers = 4;
      model.heads = c.heads;
      const GPT full(model);
      errors[static_cast<std::size_t>(comm.rank())] = error_of([&] {
        Mesh mesh = make_mesh(comm, c.shape);
        ThreeDModel three_d(mesh, full, c.options);
      });
    });
    EXPECT_NE(errors[0].find(c.expected), std::string::npos)
        << "expected an error saying \"" << c.expected << "\"; got: " << errors[0];
  }
}

TEST(ThreeDDriver, ValidateNamesTheFlagOfEverySettingThatDoesNotFit) {
  TrainConfig config = tiny_config(8, 2);  // heads 2, vocab 32, 2 layers, seq 8
  auto message = [&](ThreeDRunOptions o) { return error_of([&] { validate_three_d(config, o); }); };
  auto with = [](MeshShape s, K kind = K::one_f_one_b, int chunks = 1, int m = 2) {
    return ThreeDRunOptions{s, ThreeDOptions{kind, m, chunks, true}};
  };
  EXPECT_EQ(message(with({2, 2, 2})), "(no error)");
  EXPECT_NE(message(with({3, 1, 1})).find("--dp 3"), std::string::npos);
  EXPECT_NE(message(with({1, 1, 4})).find("over --tp 4"), std::string::npos);
  EXPECT_NE(message(with({1, 3, 1})).find("--pp 3"), std::string::npos);
  EXPECT_NE(message(with({1, 2, 1}, K::zb_h1)).find("zb-h1"), std::string::npos);
  EXPECT_NE(message(with({1, 1, 1}, K::one_f_one_b, 2)).find("--chunks 2 needs --schedule"),
            std::string::npos);
  EXPECT_NE(message(with({1, 2, 1}, K::interleaved, 2, 3)).find("--microbatches"),
            std::string::npos);
  config.save_path = "run.ckpt";
  EXPECT_NE(message(with({2, 2, 2})).find("--save and --resume are not supported"),
            std::string::npos);
}

TEST(ThreeDDriver, TrainReportsTheSingleDeviceLossAndEveryRanksGroups) {
  TrainConfig config = tiny_config(8, 3);
  config.model.layers = 4;
  std::vector<double> single;
  for (const StepRecord& s : train(config).steps) single.push_back(s.loss);
  const ThreeDRunOptions options{{2, 2, 2}, ThreeDOptions{K::one_f_one_b, 2, 1, true}};
  std::vector<drivers::ReportTable> reports;
  TrainResult result =
      drivers::run_strategy(config, ThreeDStrategy(options),
                            [&](const drivers::StepReport& r) { reports.push_back(r.ranks); });
  ASSERT_EQ(result.steps.size(), 3u);
  for (std::size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(result.steps[s].loss, single[s], 1e-10) << "step " << s + 1;
    EXPECT_EQ(result.steps[s].tokens, config.batch * config.seq)
        << "every replica's tokens, once each";
  }
  ASSERT_EQ(reports.size(), 3u);
  ASSERT_EQ(reports[0].rows.size(), 8u) << "a row per rank";
  EXPECT_EQ(reports[0].rows[5].label, "5 (dp 1, pp 0, tp 1)") << "tiers first";
  for (std::size_t rank = 0; rank < 8; ++rank)
    for (const char* column : {"params", "tp moved", "pp sent", "dp moved"})
      EXPECT_GT(reports[0].at(rank, column), 0) << "rank " << rank << " " << column;
}

}  // namespace
}  // namespace dtp::ch12
