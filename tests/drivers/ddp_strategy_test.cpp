// Checkers of the provided ddp driver (drivers/02_ddp/ddp_strategy.cpp),
// linked with the reference: option checks, the default bucket plan, what
// `dtp train --strategy ddp` reports (loss, tokens, tokens/s, and its table
// per rank), and its checkpoints (a run trained in slices equals the run
// never stopped).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "02_ddp/ddp.h"
#include "02_ddp/ddp_checks.h"
#include "drivers/02_ddp/ddp_strategy.h"
#include "dtp/dtp.h"
#include "support/checkpoints.h"
#include "support/harness.h"

namespace dtp::ch02 {
namespace {

using testing::error_of;

// A tiny f64 run (SGD, no clipping): the distributed losses must equal the
// single-device ones up to the order of partial sums.
// (chapter 02's checkers' tiny model, with the ddp strategy named).
TrainConfig tiny_config(std::int64_t batch, std::int64_t steps) {
  TrainConfig config = testing::tiny_config(batch, steps);
  config.seed = 77;
  config.strategy = "ddp";
  return config;
}

TEST(DdpDriverOptions, RejectsBadWorldAccumulateAndBucketWithClearErrors) {
  TrainConfig config = tiny_config(16, 1);
  struct Case {
    int world;
    std::int64_t accumulate;
    std::int64_t bucket;
    std::int64_t batch;
    const char* expected;  // a piece of the message
  };
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max();
  const Case cases[] = {
      {0, 1, kAutoBucketBytes, 16, "--world (ranks) must be at least 1, got 0"},
      {-3, 1, kAutoBucketBytes, 16, "--world (ranks) must be at least 1, got -3"},
      {2, 0, kAutoBucketBytes, 16, "--accumulate (K) must be at least 1, got 0"},
      {2, 1, -5, 16, "bucket bytes must be >= 0"},
      {4, 1, kAutoBucketBytes, 3, "smaller than the world size (--world 4)"},
      // world x K overflows an int64: must be an error, not a wrapped product.
      {2, huge, kAutoBucketBytes, 16, "must hold at least --world x --accumulate"},
      {3, 1, kAutoBucketBytes, 16, "must divide evenly by --world x --accumulate = 3 x 1 = 3"},
      {2, 3, kAutoBucketBytes, 16, "2 x 3 = 6"},
  };
  for (const Case& c : cases) {
    DdpOptions options;
    options.world = c.world;
    options.accumulate = c.accumulate;
    options.bucket_bytes = c.bucket;
    config.batch = c.batch;
    const std::string message = error_of([&] { validate_ddp(config, options); });
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << "world " << c.world << ", accumulate " << c.accumulate << ", bucket " << c.bucket
        << ", batch " << c.batch << ": expected an error containing '" << c.expected << "', got '"
        << message << "'";
  }
  DdpOptions fine;
  fine.world = 4;
  fine.accumulate = 2;
  config.batch = 8;
  EXPECT_NO_THROW(validate_ddp(config, fine)) << "batch 8 = world 4 x K 2 is valid";
}

TEST(DdpDriverOptions, TheDefaultModelsDefaultBucketPlanHasSeveralBuckets) {
  // The default model of `dtp train` (TrainConfig{}): its default bucket must
  // split the gradients into several buckets, or the default run shows no
  // overlap of communication with backward.
  const TrainConfig defaults;
  const DdpOptions options;
  ASSERT_EQ(options.bucket_bytes, kAutoBucketBytes)
      << "the default bucket is chosen from the model";
  std::int64_t buckets = 0, bytes = 0, gradient_bytes = 0;
  dtp::testing::run_ranks(1, [&](Comm& comm) {
    GPT model(defaults.model);
    for (const Unit* unit : model.units())
      gradient_bytes += static_cast<std::int64_t>(unit->grads().nbytes());
    bytes = resolve_bucket_bytes(options, model);
    BucketedAllReduce plan(comm, model, bytes);
    buckets = plan.bucket_count();
  });
  EXPECT_EQ(bytes, gradient_bytes / kDefaultBucketCount)
      << "the default bucket is the gradient bytes (" << gradient_bytes << ") / "
      << kDefaultBucketCount;
  EXPECT_GE(buckets, 3) << "default model: " << gradient_bytes << " gradient bytes, bucket "
                        << bytes << " bytes gave " << buckets << " bucket(s); expected about "
                        << kDefaultBucketCount;
  EXPECT_LE(buckets, kDefaultBucketCount + 1)
      << "bucket " << bytes << " bytes gave " << buckets << " buckets";
}

struct Reported {
  std::vector<StepRecord> steps;
  std::vector<drivers::ReportTable> ranks;  // per step
};

Reported run_strategy(const TrainConfig& config, const DdpOptions& options) {
  Reported out;
  const DdpStrategy strategy(options);
  TrainResult result = drivers::run_strategy(config, strategy, [&](const drivers::StepReport& r) {
    out.steps.push_back(r.record);
    out.ranks.push_back(r.ranks);
  });
  EXPECT_EQ(result.steps.size(), out.steps.size());
  return out;
}

// The strategy with @p options, as the checkpoint checks run it.
testing::RunFn run_with(const DdpOptions& options) {
  return [options](const TrainConfig& c) { return drivers::run_strategy(c, DdpStrategy(options)); };
}

void expect_matches_single_device(const TrainConfig& config, int world, std::int64_t accumulate,
                                  DdpMode mode) {
  TrainConfig single = config;
  single.strategy = "single";
  const TrainResult expected = train(single);
  DdpOptions options;
  options.world = world;
  options.accumulate = accumulate;
  options.mode = mode;
  const Reported got = run_strategy(config, options);
  const std::string where =
      "world " + std::to_string(world) + ", accumulate " + std::to_string(accumulate);
  ASSERT_EQ(got.steps.size(), expected.steps.size()) << where;
  ASSERT_EQ(got.ranks.size(), expected.steps.size()) << where << ": one report per step";
  for (std::size_t s = 0; s < got.steps.size(); ++s) {
    const StepRecord& r = got.steps[s];
    EXPECT_EQ(r.step, static_cast<std::int64_t>(s) + 1) << where;
    EXPECT_NEAR(r.loss, expected.steps[s].loss, 1e-9)
        << where << ", step " << s + 1
        << ": the reported loss must be the global batch's mean loss (single device: "
        << expected.steps[s].loss << ")";
    double mean = 0;
    ASSERT_EQ(got.ranks[s].rows.size(), static_cast<std::size_t>(world))
        << where << ": a row per rank";
    for (int rank = 0; rank < world; ++rank) mean += got.ranks[s].at(rank, "loss") / world;
    EXPECT_NEAR(r.loss, mean, 1e-12)
        << where << ": the reported loss is the mean of the ranks' losses";
    EXPECT_EQ(r.tokens, config.batch * config.seq)
        << where << ": tokens must count every rank's tokens (the global batch), got " << r.tokens;
    ASSERT_GT(r.seconds, 0) << where;
    EXPECT_NEAR(r.tokens_per_second, static_cast<double>(r.tokens) / r.seconds,
                1e-6 * r.tokens_per_second)
        << where << ": tokens/s is the global tokens over the slowest rank's step time";
    EXPECT_EQ(r.lr, expected.steps[s].lr) << where;
  }
}

TEST(DdpDriverReports, GlobalLossAndTokensOnTwoRanks) {
  expect_matches_single_device(tiny_config(8, 3), 2, 1, DdpMode::bucketed);
}

TEST(DdpDriverReports, GlobalLossWithAccumulation) {
  expect_matches_single_device(tiny_config(8, 3), 2, 2, DdpMode::flat);
}

TEST(DdpDriverReports, OddWorldAndOneSequencePerRank) {
  expect_matches_single_device(tiny_config(3, 2), 3, 1, DdpMode::naive);
}

TEST(DdpDriverReports, WorldOfOneIsTheSingleDeviceRun) {
  expect_matches_single_device(tiny_config(4, 2), 1, 1, DdpMode::bucketed);
}

TEST(DdpDriverReports, CommunicationPerStepIsReportedPerRank) {
  TrainConfig config = tiny_config(8, 2);
  DdpOptions options;
  options.world = 2;
  options.mode = DdpMode::flat;
  const Reported got = run_strategy(config, options);
  std::int64_t gradient_bytes = 0, units = 0;
  {
    GPT model(config.model);
    for (const Unit* unit : model.units()) {
      gradient_bytes += static_cast<std::int64_t>(unit->grads().nbytes());
      ++units;
    }
  }
  for (const drivers::ReportTable& step : got.ranks)
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(step.at(rank, "all-reduces"), units)
          << "rank " << rank << ": flat mode is one all-reduce per unit";
      EXPECT_EQ(step.at(rank, "all-reduced"), gradient_bytes)
          << "rank " << rank << ": flat mode moves the gradient bytes";
      EXPECT_GE(step.at(rank, "exposed"), 0) << "rank " << rank;
    }
  ASSERT_FALSE(got.ranks.empty());
  const std::string printed = got.ranks.front().str();
  EXPECT_NE(printed.find("rank    loss  all-reduces  all-reduced MiB  exposed ms"),
            std::string::npos)
      << "the table dtp train prints:\n"
      << printed;
  EXPECT_NE(printed.find("\n    1  "), std::string::npos) << "a row for rank 1:\n" << printed;
}

TEST(DdpDriverReports, BadOptionsFailBeforeLaunching) {
  TrainConfig config = tiny_config(8, 1);
  DdpOptions options;
  options.world = 0;  // was a division by zero (SIGFPE) inside the driver
  const std::string message =
      error_of([&] { drivers::run_strategy(config, DdpStrategy(options)); });
  EXPECT_NE(message.find("--world (ranks) must be at least 1, got 0"), std::string::npos)
      << message;
}

// --- checkpoints: --save, --resume, --stop-after under ddp -------------------------------

TrainConfig adamw_run(std::int64_t steps) {
  TrainConfig config = tiny_config(8, steps);
  config.optimizer = "adamw";  // state to carry over: m, v and the step count
  config.warmup = 2;
  return config;
}

TEST(DdpDriverCheckpoints, ThreeStepsThenResumingEqualsEightStepsBitForBit) {
  testing::TempFolder folder;
  for (const std::int64_t accumulate : {1, 2}) {
    DdpOptions options;
    options.world = 2;
    options.accumulate = accumulate;
    testing::expect_slices_equal_straight_run(adamw_run(8), 3, folder,
                                              "world 2, accumulate " + std::to_string(accumulate),
                                              run_with(options));
  }
}

TEST(DdpDriverCheckpoints, ResumingOnAnotherWorldOrModeNamesTheSetting) {
  testing::TempFolder folder;
  DdpOptions options;
  options.world = 2;
  TrainConfig first = adamw_run(4);
  first.stop_after = 2;
  first.save_path = folder.file("run.ckpt");
  run_strategy(first, options);
  TrainConfig second = adamw_run(4);
  second.resume_path = first.save_path;
  options.world = 4;
  options.mode = DdpMode::flat;
  const std::string message = error_of([&] { run_with(options)(second); });
  EXPECT_NE(message.find("strategy_settings.--world \"2\" in the saved run, \"4\" in this one"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(
                "strategy_settings.--ddp-mode \"bucketed\" in the saved run, \"flat\" in this one"),
            std::string::npos)
      << message;
  TrainConfig single = adamw_run(4);
  single.strategy = "single";
  single.resume_path = first.save_path;
  const std::string from_single = error_of([&] { train(single); });
  EXPECT_NE(from_single.find("strategy \"ddp\" in the saved run, \"single\" in this one"),
            std::string::npos)
      << from_single;
}

}  // namespace
}  // namespace dtp::ch02
