// Checkers of the provided zero driver (drivers/03_zero_fsdp/zero_strategy.cpp),
// linked with the reference: option checks, and what `dtp train --strategy
// zero` reports per step (global loss and tokens, as the single-device run)
// and per rank (memory peaks per category next to DDP's, bytes moved). The
// expected numbers come from the shard lengths (chunk_range), never from the
// code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "03_zero_fsdp/zero.h"
#include "dtp/dtp.h"
#include "support/checkpoints.h"
#include "support/training.h"

namespace dtp::ch03 {
namespace {

using dtp::testing::error_of;
using dtp::testing::tiny_config;

ZeroOptions zero_options(int world, int stage, bool prefetch = false, bool offload = false) {
  ZeroOptions options;
  options.world = world;
  options.stage = stage;
  options.prefetch = prefetch;
  options.offload = offload;
  return options;
}

// Every stage the driver can select, as `dtp train` flags name it.
struct Variant {
  int stage;
  bool prefetch;
  bool offload;
  const char* flags;
};
const Variant kVariants[] = {
    {1, false, false, "--stage 1"},
    {2, false, false, "--stage 2"},
    {3, false, false, "--stage 3"},
    {3, true, false, "--stage 3 --prefetch"},
    {1, false, true, "--stage 1 --offload"},
};

TEST(ZeroDriverOptions, RejectsBadStageFlagsAndBatchesWithClearErrors) {
  TrainConfig config = tiny_config(12, 1);
  struct Case {
    int world;
    int stage;
    bool prefetch;
    bool offload;
    std::int64_t batch;
    const char* expected;  // a piece of the message
  };
  const Case cases[] = {
      {0, 1, false, false, 12, "--world (ranks) must be at least 1, got 0"},
      {-2, 1, false, false, 12, "--world (ranks) must be at least 1, got -2"},
      {2, 0, false, false, 12, "--stage must be 1, 2 or 3, got 0"},
      {2, 4, false, false, 12, "--stage must be 1, 2 or 3, got 4"},
      {2, 1, true, false, 12, "--prefetch is implemented for --stage 3 (puzzle 3.4), got --stage 1"},
      {2, 2, true, false, 12, "--prefetch is implemented for --stage 3 (puzzle 3.4), got --stage 2"},
      {2, 2, false, true, 12, "--offload is implemented for --stage 1 (puzzle 3.5), got --stage 2"},
      {2, 3, true, true, 12, "--offload is implemented for --stage 1 (puzzle 3.5), got --stage 3"},
      {4, 1, false, false, 3, "smaller than the world size (--world 4)"},
      {5, 3, false, false, 12, "(--batch 12) must divide evenly by --world 5"},
  };
  for (const Case& c : cases) {
    ZeroOptions options = zero_options(c.world, c.stage, c.prefetch, c.offload);
    config.batch = c.batch;
    const std::string message = error_of([&] { validate_zero(config, options); });
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << "world " << c.world << ", stage " << c.stage << (c.prefetch ? ", prefetch" : "")
        << (c.offload ? ", offload" : "") << ", batch " << c.batch << ": expected an error containing '"
        << c.expected << "', got '" << message << "'";
  }
  config.batch = 12;
  for (const Variant& v : kVariants)
    EXPECT_NO_THROW(validate_zero(config, zero_options(3, v.stage, v.prefetch, v.offload)))
        << v.flags << " --world 3 --batch 12 is valid";
}

TEST(ZeroDriverOptions, NamesTheStageAndItsPuzzle) {
  const char* names[] = {"zero1", "zero2", "zero3", "zero3-prefetch", "zero1-offload"};
  const char* puzzles[] = {"3.1", "3.2", "3.3", "3.4", "3.5"};
  for (std::size_t i = 0; i < std::size(kVariants); ++i) {
    const Variant& v = kVariants[i];
    const ZeroOptions options = zero_options(2, v.stage, v.prefetch, v.offload);
    EXPECT_EQ(zero_stage_name(options), names[i]) << v.flags;
    EXPECT_EQ(zero_puzzle(options), puzzles[i]) << v.flags;
  }
}

TEST(ZeroDriverReports, BadOptionsFailBeforeLaunching) {
  TrainConfig config = tiny_config(8, 1);
  config.strategy = "zero";
  register_zero_strategy(zero_options(2, 2, true, false));
  const std::string message = error_of([&] { train(config); });
  EXPECT_NE(message.find("--prefetch is implemented for --stage 3"), std::string::npos) << message;
}

struct Reported {
  std::vector<StepRecord> steps;
  std::vector<std::vector<RankMemoryStep>> ranks;  // per step
};

Reported run_strategy(TrainConfig config, ZeroOptions options) {
  Reported out;
  config.strategy = "zero";
  options.on_memory = [&](std::int64_t, const std::vector<RankMemoryStep>& ranks) { out.ranks.push_back(ranks); };
  register_zero_strategy(options);
  TrainResult result = train(config, [&](const StepRecord& r) { out.steps.push_back(r); });
  EXPECT_EQ(result.steps.size(), out.steps.size());
  return out;
}

std::string describe(const Variant& v, int world) {
  return std::string(v.flags) + " --world " + std::to_string(world);
}

// Global loss, tokens and tokens/s equal what the single-device run of the
// same global batch reports; every stage, on 1 to 3 ranks.
TEST(ZeroDriverReports, GlobalLossAndTokensAsTheSingleDeviceRun) {
  const TrainConfig config = tiny_config(6, 3);  // 6 sequences: equal slices on 1, 2 and 3 ranks
  TrainConfig single = config;
  single.strategy = "single";
  const TrainResult expected = train(single);
  for (const Variant& v : kVariants) {
    for (int world : {1, 2, 3}) {
      const std::string where = describe(v, world);
      const Reported got = run_strategy(config, zero_options(world, v.stage, v.prefetch, v.offload));
      ASSERT_EQ(got.steps.size(), expected.steps.size()) << where;
      ASSERT_EQ(got.ranks.size(), expected.steps.size()) << where << ": one on_memory call per step";
      for (std::size_t s = 0; s < got.steps.size(); ++s) {
        const StepRecord& r = got.steps[s];
        EXPECT_EQ(r.step, static_cast<std::int64_t>(s) + 1) << where;
        EXPECT_TRUE(dtp::testing::close_enough(expected.steps[s].loss, r.loss))
            << where << ", step " << s + 1 << ": the reported loss must be the global batch's mean loss "
            << "(single device " << expected.steps[s].loss << "), got " << r.loss;
        ASSERT_EQ(got.ranks[s].size(), static_cast<std::size_t>(world)) << where;
        double mean = 0;
        for (const RankMemoryStep& rank : got.ranks[s]) mean += rank.loss / world;
        EXPECT_NEAR(r.loss, mean, 1e-12) << where << ": the reported loss is the mean of the ranks' losses";
        EXPECT_EQ(r.tokens, config.batch * config.seq)
            << where << ": tokens must count every rank's tokens (the global batch), got " << r.tokens;
        ASSERT_GT(r.seconds, 0) << where;
        EXPECT_NEAR(r.tokens_per_second, static_cast<double>(r.tokens) / r.seconds, 1e-6 * r.tokens_per_second)
            << where << ": tokens/s is the global tokens over the slowest rank's step time";
        EXPECT_EQ(r.lr, expected.steps[s].lr) << where;
      }
    }
  }
}

// The lesson's numbers for one rank, in elements, from the shard lengths.
struct Sizes {
  std::int64_t total = 0;         // Psi
  std::int64_t shards = 0;        // S: this rank's shard of every unit
  std::int64_t largest_unit = 0;  // U
  std::int64_t two_largest = 0;   // the two largest units together
};

Sizes sizes_of(const TrainConfig& config, int world, int rank) {
  GPT model(config.model);
  Sizes sizes;
  std::vector<std::int64_t> units;
  for (const Unit* unit : model.units()) {
    sizes.total += unit->numel();
    sizes.shards += chunk_range(unit->numel(), world, rank).length;
    units.push_back(unit->numel());
  }
  std::sort(units.rbegin(), units.rend());
  sizes.largest_unit = units.at(0);
  sizes.two_largest = units.at(0) + units.at(1);
  return sizes;
}

// Per rank and category, the peaks during a step against the formulas, DDP's
// numbers (everything whole: Psi, Psi, 2 Psi with AdamW) and the bytes moved:
// every unit's full buffer once per reduce-scatter and per all-gather, plus
// the gradient norm (one f64 all-reduce).
TEST(ZeroDriverReports, MemoryPerRankAgainstTheFormulasAndDdp) {
  TrainConfig config = tiny_config(6, 2);
  config.optimizer = "adamw";  // two states per element: an optimizer over the whole model holds 2 Psi
  const std::int64_t e = 8;    // f64
  for (const Variant& v : kVariants) {
    for (int world : {1, 2, 3}) {
      const Reported got = run_strategy(config, zero_options(world, v.stage, v.prefetch, v.offload));
      ASSERT_EQ(got.ranks.size(), 2u) << describe(v, world);
      for (std::size_t s = 0; s < got.ranks.size(); ++s) {
        for (const RankMemoryStep& r : got.ranks[s]) {
          const Sizes n = sizes_of(config, world, r.rank);
          const std::string where = describe(v, world) + ", step " + std::to_string(s + 1) + ", rank " +
                                    std::to_string(r.rank) + " (Psi " + std::to_string(n.total) + ", S " +
                                    std::to_string(n.shards) + ", U " + std::to_string(n.largest_unit) +
                                    " elements of 8 bytes)";
          EXPECT_EQ(r.ddp_params, n.total * e) << where << ": DDP holds every parameter";
          EXPECT_EQ(r.ddp_grads, n.total * e) << where << ": DDP holds every gradient";
          EXPECT_EQ(r.ddp_optimizer, 2 * n.total * e) << where << ": DDP's AdamW holds m and v of every element";
          EXPECT_EQ(r.host_optimizer_peak, 0) << where << ": on the CPU, host memory is the device's";
          const bool gathers_twice = v.stage == 3;  // before forward and before backward
          EXPECT_EQ(r.bytes_moved, (gathers_twice ? 3 : 2) * n.total * e + 8)
              << where << ": per unit one reduce-scatter and " << (gathers_twice ? "two all-gathers" : "one all-gather")
              << " of its full buffer, plus the gradient norm";
          // Optimizer state: m and v of the shards; offload adds the host master copy of the parameter shards.
          EXPECT_EQ(r.optimizer_peak, (v.offload ? 3 : 2) * n.shards * e) << where << ": optimizer state";
          switch (v.stage) {
            case 1:
              EXPECT_EQ(r.params_peak, n.total * e) << where << ": ZeRO-1 keeps the full parameters";
              // Full gradients, the reduce-scatter targets, and (offload) their host copies.
              EXPECT_EQ(r.grads_peak, (n.total + (v.offload ? 2 : 1) * n.shards) * e) << where << ": gradients";
              break;
            case 2:
              EXPECT_EQ(r.params_peak, n.total * e) << where << ": ZeRO-2 keeps the full parameters";
              EXPECT_EQ(r.grads_peak, (n.shards + n.largest_unit) * e)
                  << where << ": the gradient shards and one unit's full gradient at a time";
              break;
            default:
              if (v.prefetch) {
                EXPECT_GE(r.params_peak, (n.shards + n.largest_unit) * e) << where << ": every unit is gathered";
                EXPECT_LE(r.params_peak, (n.shards + n.two_largest) * e)
                    << where << ": the unit computing and the one arriving, no more";
              } else {
                EXPECT_EQ(r.params_peak, (n.shards + n.largest_unit) * e)
                    << where << ": the parameter shards and one unit's full parameters at a time";
              }
              EXPECT_EQ(r.grads_peak, (n.shards + n.largest_unit) * e)
                  << where << ": the gradient shards and one unit's full gradient at a time";
          }
          if (world == 1) continue;
          // What the stage shards is below what a DDP rank holds (for this
          // model: its largest unit is well under (1 - 1/N) Psi).
          EXPECT_LT(r.optimizer_peak, r.ddp_optimizer) << where;
          if (v.stage >= 2) {
            EXPECT_LT(r.grads_peak, r.ddp_grads) << where;
          }
          if (v.stage == 3 && !v.prefetch) {
            EXPECT_LT(r.params_peak, r.ddp_params) << where;
          }
        }
      }
    }
  }
}

// --- checkpoints: --save, --resume, --stop-after under zero ------------------------------

TrainConfig adamw_run(std::int64_t steps) {
  TrainConfig config = tiny_config(6, steps);  // 6 sequences: equal slices on 3 ranks
  config.strategy = "zero";
  config.optimizer = "adamw";  // state to carry over, sharded: m, v and the step count
  config.warmup = 2;
  return config;
}

// On 3 ranks most units' shards differ in length (chunk_range), so a shard
// gathered or restored at the wrong offset shows.
TEST(ZeroDriverCheckpoints, EveryStageThreeStepsThenResumingEqualsEightStepsBitForBit) {
  testing::TempFolder folder;
  for (const Variant& v : kVariants) {
    register_zero_strategy(zero_options(3, v.stage, v.prefetch, v.offload));
    testing::expect_slices_equal_straight_run(adamw_run(8), 3, folder, describe(v, 3));
  }
}

// The file is consolidated: a single-device run's tensors, names, shapes and
// dtypes, whatever the stage; its values are what the single-device run
// trains (to rounding: the ranks sum their gradients in another order).
TEST(ZeroDriverCheckpoints, AConsolidatedCheckpointHasTheSingleDeviceLayoutAndValues) {
  testing::TempFolder folder;
  TrainConfig single = adamw_run(2);
  single.strategy = "single";
  const Checkpoint expected = testing::saved_checkpoint(single, folder);
  for (const Variant& v : kVariants) {
    const std::string where = describe(v, 3);
    register_zero_strategy(zero_options(3, v.stage, v.prefetch, v.offload));
    const Checkpoint got = testing::saved_checkpoint(adamw_run(2), folder);
    EXPECT_EQ(got.step, 2) << where;
    testing::expect_single_device_layout(expected, got, where,
                                         "a shard gathered to the wrong offset, or another rank's shard?");
  }
}

TEST(ZeroDriverCheckpoints, ResumingUnderAnotherStageOrWorldNamesTheSetting) {
  testing::TempFolder folder;
  TrainConfig first = adamw_run(4);
  first.stop_after = 2;
  first.save_path = folder.file("run.ckpt");
  register_zero_strategy(zero_options(3, 1));
  train(first);
  TrainConfig second = adamw_run(4);
  second.resume_path = first.save_path;
  register_zero_strategy(zero_options(2, 3));
  const std::string message = error_of([&] { train(second); });
  EXPECT_NE(message.find("strategy_settings.--world \"3\" in the saved run, \"2\" in this one"), std::string::npos)
      << message;
  EXPECT_NE(message.find("strategy_settings.--stage \"1\" in the saved run, \"3\" in this one"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace dtp::ch03
