// Checkers for 3.3 ZeRO-3 / FSDP and 3.4 FSDP with prefetch: everything the
// other stages get, plus: each unit runs with its own gathered parameters,
// and from the trace, 3.3 gathers only on demand while 3.4's gather of the
// next unit is already travelling while the current unit computes, and
// 3.4's destructor waits for a gather still in flight.
#include <algorithm>

#include "dtp/trace.h"
#include "support/trace_overlap.h"
#include "zero_expectations.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch03;

TrainConfig traced_config() { return traced_model(tiny_config(8, 2)); }

// All-gathers that ran on rank `rank`'s communication thread (lane 1): the
// ones started with Comm::iall_gather.
std::size_t gathers_on_comm_lane(const std::vector<trace::Span>& spans, int rank) {
  return static_cast<std::size_t>(
      std::count_if(spans.begin(), spans.end(), [rank](const trace::Span& s) {
        return s.rank == rank && s.lane == 1 && s.name == "all_gather";
      }));
}

// Trains `stage` for traced_config().steps steps on 2 ranks with the trace on.
std::vector<trace::Span> traced_run(Stage stage, std::vector<std::string>& unit_names) {
  trace::enable();
  run_and_report(stage_name(stage) + " traced run", 2, [&](Comm& comm) -> std::string {
    const TrainConfig config = on_device(traced_config(), comm.device());
    StagedTrainer run = plug(stage, comm, config);
    if (comm.rank() == 0)
      for (Unit* unit : run.trainer->model().units()) unit_names.push_back(unit->name());
    for (std::int64_t s = 0; s < config.steps; ++s) run.trainer->step();
    return "";
  });
  trace::disable();
  return trace::spans();
}

TEST(Puzzle3_3_zero3, FirstStepGradientShardsAreTheSingleDeviceMean) {
  expect_first_step_shards(Stage::zero3);
}
TEST(Puzzle3_3_zero3, EachUnitRunsWithItsOwnParameters) {
  expect_each_unit_runs_with_its_own_parameters(Stage::zero3);
}
TEST(Puzzle3_3_zero3, MatchesSingleDeviceSgdMomentum) {
  expect_matches_single(Stage::zero3, tiny_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_3_zero3, MatchesSingleDeviceAdamW) {
  expect_matches_single(Stage::zero3, adamw_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_3_zero3, MemoryPerRankMatchesTheFormulas) { expect_memory(Stage::zero3); }
TEST(Puzzle3_3_zero3, CommunicationPerStep) { expect_communication(Stage::zero3); }
TEST(Puzzle3_3_zero3, UnitsSmallerThanTheWorld) {
  expect_units_smaller_than_the_world(Stage::zero3);
}
TEST(Puzzle3_3_zero3, FinishWithoutBackwardIsAClearError) {
  expect_finish_without_backward_is_an_error(Stage::zero3);
}

// Without prefetch every gather is the blocking one a unit waits for: none
// runs on the communication lane.
TEST(Puzzle3_3_zero3, GathersOnDemandWithoutPrefetch) {
  if (!trace_has_comm_lane())
    GTEST_SKIP() << "the trace lanes are the thread backend's; the thread flavour checks this";
  std::vector<std::string> units;
  const std::vector<trace::Span> spans = traced_run(Stage::zero3, units);
  if (::testing::Test::HasFailure()) return;
  for (int rank = 0; rank < 2; ++rank) {
    const std::size_t gathers = gathers_on_comm_lane(spans, rank);
    EXPECT_EQ(gathers, 0u) << "rank " << rank << ": " << gathers
                           << " all-gathers ran on the communication thread; Zero3 gathers a unit "
                              "with the blocking all_gather "
                              "right before it runs (prefetching is puzzle 3.4)";
  }
}

TEST(Puzzle3_4_zero3_prefetch, FirstStepGradientShardsAreTheSingleDeviceMean) {
  expect_first_step_shards(Stage::prefetch);
}
TEST(Puzzle3_4_zero3_prefetch, EachUnitRunsWithItsOwnParameters) {
  expect_each_unit_runs_with_its_own_parameters(Stage::prefetch);
}
TEST(Puzzle3_4_zero3_prefetch, MatchesSingleDeviceSgdMomentum) {
  expect_matches_single(Stage::prefetch, tiny_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_4_zero3_prefetch, MatchesSingleDeviceAdamW) {
  expect_matches_single(Stage::prefetch, adamw_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_4_zero3_prefetch, MemoryPerRankMatchesTheFormulas) { expect_memory(Stage::prefetch); }
TEST(Puzzle3_4_zero3_prefetch, CommunicationPerStep) { expect_communication(Stage::prefetch); }
TEST(Puzzle3_4_zero3_prefetch, UnitsSmallerThanTheWorld) {
  expect_units_smaller_than_the_world(Stage::prefetch);
}

// With prefetch, the gather of the unit that runs next is travelling while
// the current unit computes. Read exactly, from the order of events on the
// rank's own thread (lane 0), not from timings: before unit k computes, the
// next unit's Comm::iall_gather has been posted (an "iall_gather" span), and
// it has not been waited on yet (the "wait" spans so far are only for the
// units already computed). In forward the next unit is k+1; in backward k-1.
struct Pass {
  std::vector<double> posts, waits;                        // lane-0 start times, in order
  std::vector<std::pair<std::string, trace::Span>> units;  // unit compute spans, in run order
};

// Splits rank `rank`'s lane-0 events into passes: forward, backward, forward, ...
std::vector<Pass> passes_of(const std::vector<trace::Span>& spans, int rank,
                            const std::vector<std::string>& units) {
  std::vector<trace::Span> lane0;
  for (const trace::Span& s : spans)
    if (s.rank == rank && s.lane == 0) lane0.push_back(s);
  std::sort(lane0.begin(), lane0.end(),
            [](const trace::Span& a, const trace::Span& b) { return a.start_us < b.start_us; });
  std::vector<Pass> passes(1);
  bool forward = true;
  for (const trace::Span& s : lane0) {
    const std::string pass_word = forward ? " forward" : " backward";
    if (s.name == "iall_gather") passes.back().posts.push_back(s.start_us);
    if (s.name == "wait") passes.back().waits.push_back(s.start_us);
    for (const std::string& unit : units)
      if (s.name == unit + pass_word) passes.back().units.push_back({unit, s});
    // A pass ends with its last unit: the head in forward, the embedding in backward.
    if (s.name == (forward ? units.back() : units.front()) + pass_word) {
      passes.emplace_back();
      forward = !forward;
    }
  }
  passes.pop_back();  // the empty pass opened after the last backward
  return passes;
}

std::size_t count_before(const std::vector<double>& times, double t) {
  return static_cast<std::size_t>(
      std::count_if(times.begin(), times.end(), [t](double x) { return x < t; }));
}

TEST(Puzzle3_4_zero3_prefetch, NextUnitsGatherTravelsWhileTheCurrentUnitComputes) {
  if (!trace_has_comm_lane())
    GTEST_SKIP() << "the trace lanes are the thread backend's; the thread flavour checks this";
  std::vector<std::string> units;
  const std::vector<trace::Span> spans = traced_run(Stage::prefetch, units);
  if (::testing::Test::HasFailure()) return;
  const std::size_t n = units.size();
  const std::size_t steps = static_cast<std::size_t>(traced_config().steps);
  for (int rank = 0; rank < 2; ++rank) {
    const std::size_t gathers = gathers_on_comm_lane(spans, rank);
    // Per step: n-1 prefetches in forward (units 1..n-1) and n-1 in backward.
    ASSERT_EQ(gathers, 2 * (n - 1) * steps) << "rank " << rank << ": expected " << 2 * (n - 1)
                                            << " all-gathers per step on the communication thread "
                                               "(Comm::iall_gather of the next unit, in forward "
                                               "and in backward), got "
                                            << gathers << " in " << steps << " steps";
    const std::vector<Pass> passes = passes_of(spans, rank, units);
    ASSERT_EQ(passes.size(), 2 * steps)
        << "rank " << rank << ": expected a forward and a backward pass per step";
    for (std::size_t p = 0; p < passes.size(); ++p) {
      const Pass& pass = passes[p];
      const bool forward = p % 2 == 0;
      const std::string where = "rank " + std::to_string(rank) + ", step " +
                                std::to_string(p / 2 + 1) + ", " +
                                (forward ? "forward" : "backward");
      ASSERT_EQ(pass.units.size(), n) << where << ": expected one span per unit";
      // Every unit but the last of the pass has a successor to prefetch.
      for (std::size_t k = 0; k + 1 < n; ++k) {
        const auto& [name, compute] = pass.units[k];
        const std::string next = pass.units[k + 1].first;
        const std::size_t posted = count_before(pass.posts, compute.start_us);
        const std::size_t waited = count_before(pass.waits, compute.end_us);
        EXPECT_GE(posted, k + 1) << where << ": when unit '" << name << "' began to compute, "
                                 << posted
                                 << " iall_gather(s) had been posted in this pass, expected "
                                 << k + 1
                                 << " (one for every unit after the first, up to and including '"
                                 << next << "'). Post the next unit's gather in the hook before '"
                                 << name << "' runs, so it travels meanwhile";
        EXPECT_LE(waited, k)
            << where << ": when unit '" << name << "' finished computing, " << waited
            << " request(s) had been waited on in this pass, expected at most " << k
            << " (one for each unit after the first that already ran): the gather of '" << next
            << "' was waited on before '" << name
            << "' computed, so nothing overlapped it. Wait for it in the hook before '" << next
            << "' runs";
        if (::testing::Test::HasFailure()) return;  // one pass tells the story
      }
    }
  }
}

// Destroyed with a gather in flight: a step stopped by an error as block.0's
// forward begins, when block.1's prefetch has been posted and not waited
// for. The contract: ~Zero3Prefetch waits for it (one "wait" on the rank's
// thread, on the thread backend) and never throws, and every rank goes on:
// a collective after the destruction completes on all of them.
TEST(Puzzle3_4_zero3_prefetch, DestroyedWithAPrefetchInFlightItWaitsForIt) {
  struct Stop {};
  const bool lanes = trace_has_comm_lane();
  if (lanes) trace::enable();
  run_and_report("3.4 Zero3Prefetch destroyed mid-forward", 2, [&](Comm& comm) -> std::string {
    StagedTrainer run = plug(Stage::prefetch, comm, on_device(tiny_config(12, 1), comm.device()));
    run.trainer->model().on_before_forward([](Unit& unit) {
      if (unit.name() == "block.0") throw Stop{};
    });
    try {
      run.trainer->step();
      return "rank " + std::to_string(comm.rank()) +
             ": checker setup: the step was not stopped at block.0";
    } catch (const Stop&) {
    }
    {
      trace::Scope span("checker: destroy the trainer", "checker");
      run.trainer.reset();  // the stage (its optimizer) first, then the model
    }
    Tensor everyone = Tensor::full(Shape{1}, 1.0, DType::f64, comm.device());
    comm.all_reduce(everyone);
    if (everyone.item(0) != comm.size())
      return "rank " + std::to_string(comm.rank()) +
             ": after the destruction, an all-reduce of 1 "
             "gave " +
             number(everyone.item(0)) + ", expected the world size " + std::to_string(comm.size()) +
             ": the in-flight gather and this all-reduce met out "
             "of order";
    return "";
  });
  if (!lanes) return;
  trace::disable();
  if (::testing::Test::HasFailure()) return;
  for (int rank = 0; rank < 2; ++rank) {
    const std::size_t waits =
        count_inside(lanes_of(trace::spans(), rank), "checker: destroy the trainer", "wait");
    EXPECT_EQ(waits, 1u) << "rank " << rank << ": destroying Zero3Prefetch waited on " << waits
                         << " request(s); block.1's prefetch was in flight: ~Zero3Prefetch must "
                            "wait for it (the gather writes into its buffer until then)";
  }
}

TEST(Puzzle3_4_zero3_prefetch, FinishWithoutBackwardIsAClearError) {
  expect_finish_without_backward_is_an_error(Stage::prefetch);
}

}  // namespace
