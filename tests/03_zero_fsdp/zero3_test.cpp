// Checkers for 3.3 ZeRO-3 / FSDP and 3.4 FSDP with prefetch: everything the
// other stages get, plus: each unit runs with its own gathered parameters,
// and from the trace, 3.3 gathers only on demand while 3.4's gather of the
// next unit is already travelling while the current unit computes.
#include <algorithm>

#include "dtp/trace.h"
#include "zero_expectations.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch03;

// A model whose blocks take long enough to see what overlaps what.
TrainConfig traced_config() {
  TrainConfig config = tiny_config(8, 2);
  config.model.d_model = 64;
  config.model.heads = 4;
  config.model.layers = 3;
  config.model.context = 32;
  config.seq = 32;
  return config;
}

struct RankTrace {
  std::vector<trace::Span> gathers_on_comm_lane;                 // lane 1, by start
  std::vector<std::pair<std::string, trace::Span>> forwards;     // unit forward spans, lane 0, in order
};

RankTrace trace_of(const std::vector<trace::Span>& spans, int rank, const std::vector<std::string>& units) {
  RankTrace t;
  for (const trace::Span& s : spans) {
    if (s.rank != rank) continue;
    if (s.lane == 1 && s.name == "all_gather") t.gathers_on_comm_lane.push_back(s);
    if (s.lane == 0)
      for (const std::string& unit : units)
        if (s.name == unit + " forward") t.forwards.push_back({unit, s});
  }
  auto by_start = [](const trace::Span& a, const trace::Span& b) { return a.start_us < b.start_us; };
  std::sort(t.gathers_on_comm_lane.begin(), t.gathers_on_comm_lane.end(), by_start);
  std::sort(t.forwards.begin(), t.forwards.end(),
            [](const auto& a, const auto& b) { return a.second.start_us < b.second.start_us; });
  return t;
}

// Trains `stage` for traced_config().steps steps on 2 ranks with the trace on.
std::vector<trace::Span> traced_run(Stage stage, std::vector<std::string>& unit_names) {
  const TrainConfig config = traced_config();
  trace::enable();
  run_and_report(stage_name(stage) + " traced run", 2, [&](Comm& comm) -> std::string {
    StagedTrainer run = plug(stage, comm, config);
    if (comm.rank() == 0)
      for (Unit* unit : run.trainer->model().units()) unit_names.push_back(unit->name());
    for (std::int64_t s = 0; s < config.steps; ++s) run.trainer->step();
    return "";
  });
  trace::disable();
  return trace::spans();
}

bool thread_backend() { return World::from_env(2).backend == Backend::thread; }

TEST(Puzzle3_3_zero3, FirstStepGradientShardsAreTheSingleDeviceMean) { expect_first_step_shards(Stage::zero3); }
TEST(Puzzle3_3_zero3, EachUnitRunsWithItsOwnParameters) { expect_each_unit_runs_with_its_own_parameters(Stage::zero3); }
TEST(Puzzle3_3_zero3, MatchesSingleDeviceSgdMomentum) { expect_matches_single(Stage::zero3, tiny_config(), {1, 2, 3, 4}); }
TEST(Puzzle3_3_zero3, MatchesSingleDeviceAdamW) { expect_matches_single(Stage::zero3, adamw_config(), {1, 2, 3, 4}); }
TEST(Puzzle3_3_zero3, MemoryPerRankMatchesTheFormulas) { expect_memory(Stage::zero3); }
TEST(Puzzle3_3_zero3, CommunicationPerStep) { expect_communication(Stage::zero3); }
TEST(Puzzle3_3_zero3, UnitsSmallerThanTheWorld) { expect_units_smaller_than_the_world(Stage::zero3); }
TEST(Puzzle3_3_zero3, FinishWithoutBackwardIsAClearError) { expect_finish_without_backward_is_an_error(Stage::zero3); }

// Without prefetch every gather is the blocking one a unit waits for: none
// runs on the communication lane.
TEST(Puzzle3_3_zero3, GathersOnDemandWithoutPrefetch) {
  if (!thread_backend()) GTEST_SKIP() << "the trace lanes are the thread backend's; the thread flavour checks this";
  std::vector<std::string> units;
  const std::vector<trace::Span> spans = traced_run(Stage::zero3, units);
  if (::testing::Test::HasFailure()) return;
  for (int rank = 0; rank < 2; ++rank) {
    const RankTrace t = trace_of(spans, rank, units);
    EXPECT_TRUE(t.gathers_on_comm_lane.empty())
        << "rank " << rank << ": " << t.gathers_on_comm_lane.size()
        << " all-gathers ran on the communication thread; Zero3 gathers a unit with the blocking all_gather "
           "right before it runs (prefetching is puzzle 3.4)";
  }
}

TEST(Puzzle3_4_zero3_prefetch, FirstStepGradientShardsAreTheSingleDeviceMean) { expect_first_step_shards(Stage::prefetch); }
TEST(Puzzle3_4_zero3_prefetch, EachUnitRunsWithItsOwnParameters) { expect_each_unit_runs_with_its_own_parameters(Stage::prefetch); }
TEST(Puzzle3_4_zero3_prefetch, MatchesSingleDeviceSgdMomentum) { expect_matches_single(Stage::prefetch, tiny_config(), {1, 2, 3, 4}); }
TEST(Puzzle3_4_zero3_prefetch, MatchesSingleDeviceAdamW) { expect_matches_single(Stage::prefetch, adamw_config(), {1, 2, 3, 4}); }
TEST(Puzzle3_4_zero3_prefetch, MemoryPerRankMatchesTheFormulas) { expect_memory(Stage::prefetch); }
TEST(Puzzle3_4_zero3_prefetch, CommunicationPerStep) { expect_communication(Stage::prefetch); }
TEST(Puzzle3_4_zero3_prefetch, UnitsSmallerThanTheWorld) { expect_units_smaller_than_the_world(Stage::prefetch); }

// With prefetch, the gather of unit i+1 starts (on the communication lane)
// before unit i's forward ends: it travels while unit i computes.
TEST(Puzzle3_4_zero3_prefetch, NextUnitsGatherStartsBeforeTheCurrentForwardEnds) {
  if (!thread_backend()) GTEST_SKIP() << "the trace lanes are the thread backend's; the thread flavour checks this";
  std::vector<std::string> units;
  const std::vector<trace::Span> spans = traced_run(Stage::prefetch, units);
  if (::testing::Test::HasFailure()) return;
  const std::size_t n = units.size();
  const std::size_t steps = static_cast<std::size_t>(traced_config().steps);
  for (int rank = 0; rank < 2; ++rank) {
    const RankTrace t = trace_of(spans, rank, units);
    ASSERT_EQ(t.forwards.size(), n * steps) << "rank " << rank << ": expected one forward span per unit and step";
    // Per step: n-1 prefetches in forward (units 1..n-1) and n-1 in backward.
    ASSERT_EQ(t.gathers_on_comm_lane.size(), 2 * (n - 1) * steps)
        << "rank " << rank << ": expected " << 2 * (n - 1)
        << " all-gathers per step on the communication thread (Comm::iall_gather of the next unit, in forward "
           "and in backward), got " << t.gathers_on_comm_lane.size() << " in " << steps << " steps";
    // The span on the communication lane starts when the communication
    // thread picks the gather up, a little after it was posted; the
    // embedding's forward (tens of microseconds) is too short to show that
    // reliably, so the check starts at block.0, and a unit passes when its
    // gather overlaps in any step (a prefetch that is waited on at once never
    // does).
    for (std::size_t i = 1; i + 1 < n; ++i) {
      std::string late;
      bool seen = false;
      for (std::size_t s = 0; s < steps && !seen; ++s) {
        const trace::Span& gather = t.gathers_on_comm_lane[s * 2 * (n - 1) + i];  // the gather of unit i+1
        const auto& [name, forward] = t.forwards[s * n + i];
        seen = gather.start_us < forward.end_us;
        if (!seen && late.empty())
          late = "step " + std::to_string(s + 1) + ": the gather of unit '" + units[i + 1] + "' started at " +
                 std::to_string(gather.start_us) + " us, after unit '" + name + "''s forward ended at " +
                 std::to_string(forward.end_us) + " us";
      }
      EXPECT_TRUE(seen) << "rank " << rank << ", in " << steps << " steps: " << late
                        << ": start the next unit's iall_gather before the current unit runs, so it travels meanwhile";
    }
  }
}

TEST(Puzzle3_4_zero3_prefetch, FinishWithoutBackwardIsAClearError) {
  expect_finish_without_backward_is_an_error(Stage::prefetch);
}

}  // namespace
