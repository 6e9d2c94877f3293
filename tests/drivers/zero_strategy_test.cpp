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
#include "drivers/03_zero_fsdp/zero_strategy.h"
#include "dtp/dtp.h"
#include "support/checkpoints.h"
#include "support/training.h"

namespace dtp::ch03 {
namespace {

using dtp::testing::error_of;
using dtp::testing::tiny_config;

ZeroOptions zero_options(int world, ZeroVariant variant) {
  ZeroOptions options;
  options.world = world;
  options.variant = variant;
  return options;
}

// Every stage the driver can select, as `dtp train` flags name it.
struct Variant {
  ZeroVariant variant;
  int stage;
  bool prefetch;
  bool offload;
  const char* flags;
};
const Variant kVariants[] = {
    {ZeroVariant::zero1, 1, false, false, "--stage 1"},
    {ZeroVariant::zero2, 2, false, false, "--stage 2"},
    {ZeroVariant::zero3, 3, false, false, "--stage 3"},
    {ZeroVariant::zero3_prefetch, 3, true, false, "--stage 3 --prefetch"},
    {ZeroVariant::zero1_offload, 1, false, true, "--stage 1 --offload"},
};

TEST(ZeroDriverOptions, TheFlagsSelectOneOfFiveVariantsAndRefuseTheRest) {
  for (const Variant& v : kVariants)
    EXPECT_EQ(zero_variant(v.stage, v.prefetch, v.offload), v.variant) << v.flags;
  struct Case {
    int stage;
    bool prefetch;
    bool offload;
    const char* expected;  // a piece of the message
  };
  const Case cases[] = {
      {0, false, false, "--stage must be 1, 2 or 3, got 0"},
      {4, false, false, "--stage must be 1, 2 or 3, got 4"},
      {1, true, false, "--prefetch is implemented for --stage 3 (puzzle 3.4), got --stage 1"},
      {2, true, false, "--prefetch is implemented for --stage 3 (puzzle 3.4), got --stage 2"},
      {2, false, true, "--offload is implemented for --stage 1 (puzzle 3.5), got --stage 2"},
      {3, true, true, "--offload is implemented for --stage 1 (puzzle 3.5), got --stage 3"},
  };
  for (const Case& c : cases) {
    const std::string message =
        error_of([&] { (void)zero_variant(c.stage, c.prefetch, c.offload); });
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << "--stage " << c.stage << (c.prefetch ? " --prefetch" : "")
        << (c.offload ? " --offload" : "") << ": expected an error containing '" << c.expected
        << "', got '" << message << "'";
  }
}

TEST(ZeroDriverOptions, RejectsBadWorldsAndBatchesWithClearErrors) {
  TrainConfig config = tiny_config(12, 1);
  struct Case {
    int world;
    std::int64_t batch;
    const char* expected;  // a piece of the message
  };
  const Case cases[] = {
      {0, 12, "--world (ranks) must be at least 1, got 0"},
      {-2, 12, "--world (ranks) must be at least 1, got -2"},
      {4, 3, "smaller than the world size (--world 4)"},
      {5, 12, "(--batch 12) must divide evenly by --world 5"},
  };
  for (const Case& c : cases) {
    config.batch = c.batch;
    const std::string message =
        error_of([&] { validate_zero(config, zero_options(c.world, ZeroVariant::zero1)); });
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << "world " << c.world << ", batch " << c.batch << ": expected an error containing '"
        << c.expected << "', got '" << message << "'";
  }
  config.batch = 12;
  for (const Variant& v : kVariants)
    EXPECT_NO_THROW(validate_zero(config, zero_options(3, v.variant)))
        << v.flags << " --world 3 --batch 12 is valid";
}

TEST(ZeroDriverOptions, NamesTheStageAndItsPuzzle) {
  const char* names[] = {"zero1", "zero2", "zero3", "zero3-prefetch", "zero1-offload"};
  const char* puzzles[] = {"3.1", "3.2", "3.3", "3.4", "3.5"};
  for (std::size_t i = 0; i < std::size(kVariants); ++i) {
    const Variant& v = kVariants[i];
    EXPECT_EQ(std::string(zero_variant_name(v.variant)), names[i]) << v.flags;
    EXPECT_EQ(std::string(zero_puzzle(v.variant)), puzzles[i]) << v.flags;
    EXPECT_EQ(zero_stage(v.variant), v.stage) << v.flags;
    EXPECT_EQ(kZeroVariants[i], v.variant) << "kZeroVariants lists the variants in puzzle order";
  }
}

TEST(ZeroDriverReports, BadOptionsFailBeforeLaunching) {
  TrainConfig config = tiny_config(8, 1);
  const std::string message = error_of(
      [&] { drivers::run_strategy(config, ZeroStrategy(zero_options(3, ZeroVariant::zero2))); });
  EXPECT_NE(message.find("(--batch 8) must divide evenly by --world 3"), std::string::npos)
      << message;
}

// The strategy with @p options, as the checkpoint checks run it.
testing::RunFn run_with(const ZeroOptions& options) {
  return
      [options](const TrainConfig& c) { return drivers::run_strategy(c, ZeroStrategy(options)); };
}

struct Reported {
  std::vector<StepRecord> steps;
  std::vector<drivers::ReportTable> ranks;  // per step
};

Reported run_strategy(const TrainConfig& config, const ZeroOptions& options) {
  Reported out;
  TrainResult result =
      drivers::run_strategy(config, ZeroStrategy(options), [&](const drivers::StepReport& r) {
        out.steps.push_back(r.record);
        out.ranks.push_back(r.ranks);
      });
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
      const Reported got = run_strategy(config, zero_options(world, v.variant));
      ASSERT_EQ(got.steps.size(), expected.steps.size()) << where;
      ASSERT_EQ(got.ranks.size(), expected.steps.size()) << where << ": one report per step";
      for (std::size_t s = 0; s < got.steps.size(); ++s) {
        const StepRecord& r = got.steps[s];
        EXPECT_EQ(r.step, static_cast<std::int64_t>(s) + 1) << where;
        EXPECT_TRUE(dtp::testing::close_enough(expected.steps[s].loss, r.loss))
            << where << ", step " << s + 1
            << ": the reported loss must be the global batch's mean loss "
            << "(single device " << expected.steps[s].loss << "), got " << r.loss;
        ASSERT_EQ(got.ranks[s].rows.size(), static_cast<std::size_t>(world) + 1)
            << where << ": a row per rank, then DDP's";
        EXPECT_EQ(r.tokens, config.batch * config.seq)
            << where << ": tokens must count every rank's tokens (the global batch), got "
            << r.tokens;
        ASSERT_GT(r.seconds, 0) << where;
        EXPECT_NEAR(r.tokens_per_second, static_cast<double>(r.tokens) / r.seconds,
                    1e-6 * r.tokens_per_second)
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
  config.optimizer =
      "adamw";  // two states per element: an optimizer over the whole model holds 2 Psi
  const std::int64_t e = 8;  // f64
  for (const Variant& v : kVariants) {
    for (int world : {1, 2, 3}) {
      const Reported got = run_strategy(config, zero_options(world, v.variant));
      ASSERT_EQ(got.ranks.size(), 2u) << describe(v, world);
      for (std::size_t s = 0; s < got.ranks.size(); ++s) {
        const drivers::ReportTable& table = got.ranks[s];
        ASSERT_EQ(table.rows.size(), static_cast<std::size_t>(world) + 1) << describe(v, world);
        ASSERT_EQ(table.rows.back().label, "DDP")
            << describe(v, world) << ": the last row is DDP's";
        const Sizes whole = sizes_of(config, world, 0);
        const std::string ddp =
            describe(v, world) + ", step " + std::to_string(s + 1) + ", the DDP row";
        EXPECT_EQ(table.at(world, "params peak"), whole.total * e)
            << ddp << ": DDP holds every parameter";
        EXPECT_EQ(table.at(world, "grads peak"), whole.total * e)
            << ddp << ": DDP holds every gradient";
        EXPECT_EQ(table.at(world, "optimizer peak"), 2 * whole.total * e)
            << ddp << ": DDP's AdamW holds m and v of every element";
        for (int rank = 0; rank < world; ++rank) {
          // This rank's row, as numbers.
          const struct {
            int rank;
            double params_peak, grads_peak, optimizer_peak, bytes_moved, ddp_params, ddp_grads,
                ddp_optimizer;
          } r{rank,
              table.at(rank, "params peak"),
              table.at(rank, "grads peak"),
              table.at(rank, "optimizer peak"),
              table.at(rank, "moved"),
              table.at(world, "params peak"),
              table.at(world, "grads peak"),
              table.at(world, "optimizer peak")};
          const Sizes n = sizes_of(config, world, r.rank);
          const std::string where = describe(v, world) + ", step " + std::to_string(s + 1) +
                                    ", rank " + std::to_string(r.rank) + " (Psi " +
                                    std::to_string(n.total) + ", S " + std::to_string(n.shards) +
                                    ", U " + std::to_string(n.largest_unit) +
                                    " elements of 8 bytes)";
          EXPECT_EQ(table.rows[static_cast<std::size_t>(rank)].label, std::to_string(rank))
              << where;
          const bool gathers_twice = v.stage == 3;  // before forward and before backward
          EXPECT_EQ(r.bytes_moved, (gathers_twice ? 3 : 2) * n.total * e + 8)
              << where << ": per unit one reduce-scatter and "
              << (gathers_twice ? "two all-gathers" : "one all-gather")
              << " of its full buffer, plus the gradient norm";
          // Optimizer state: m and v of the shards; offload adds the host master copy of the
          // parameter shards.
          EXPECT_EQ(r.optimizer_peak, (v.offload ? 3 : 2) * n.shards * e)
              << where << ": optimizer state";
          switch (v.stage) {
            case 1:
              EXPECT_EQ(r.params_peak, n.total * e)
                  << where << ": ZeRO-1 keeps the full parameters";
              // Full gradients, the reduce-scatter targets, and (offload) their host copies.
              EXPECT_EQ(r.grads_peak, (n.total + (v.offload ? 2 : 1) * n.shards) * e)
                  << where << ": gradients";
              break;
            case 2:
              EXPECT_EQ(r.params_peak, n.total * e)
                  << where << ": ZeRO-2 keeps the full parameters";
              EXPECT_EQ(r.grads_peak, (n.shards + n.largest_unit) * e)
                  << where << ": the gradient shards and one unit's full gradient at a time";
              break;
            default:
              if (v.prefetch) {
                EXPECT_GE(r.params_peak, (n.shards + n.largest_unit) * e)
                    << where << ": every unit is gathered";
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
    testing::expect_slices_equal_straight_run(adamw_run(8), 3, folder, describe(v, 3),
                                              run_with(zero_options(3, v.variant)));
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
    const Checkpoint got =
        testing::saved_checkpoint(adamw_run(2), folder, run_with(zero_options(3, v.variant)));
    EXPECT_EQ(got.step, 2) << where;
    testing::expect_single_device_layout(
        expected, got, where, "a shard gathered to the wrong offset, or another rank's shard?");
  }
}

TEST(ZeroDriverCheckpoints, ResumingUnderAnotherStageOrWorldNamesTheSetting) {
  testing::TempFolder folder;
  TrainConfig first = adamw_run(4);
  first.stop_after = 2;
  first.save_path = folder.file("run.ckpt");
  run_with(zero_options(3, ZeroVariant::zero1))(first);
  TrainConfig second = adamw_run(4);
  second.resume_path = first.save_path;
  const std::string message =
      error_of([&] { run_with(zero_options(2, ZeroVariant::zero3))(second); });
  EXPECT_NE(message.find("strategy_settings.--world \"3\" in the saved run, \"2\" in this one"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("strategy_settings.--stage \"1\" in the saved run, \"3\" in this one"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace dtp::ch03
