// Checkers for 2.3 bucketed DDP overlapped with backward: the bucket plan
// (with its boundaries), first-step gradients equal to the single-device
// mean, results equal to single-device training for several bucket sizes
// with bitwise equal replicas, one all-reduce per bucket, all-reduces
// started during backward as soon as a bucket is complete (counted from the
// hooks) and running while backward computes (seen in the trace on the
// thread backend), and clear errors.
#include <algorithm>
#include <limits>
#include <memory>

#include "ddp_checks.h"
#include "dtp/trace.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch02;
using dtp::ch02::BucketedAllReduce;
using dtp::ch02::BucketPiece;

constexpr std::int64_t kHuge = std::numeric_limits<std::int64_t>::max() / 4;

// The bytes of one gradient element of @p model: the element size of its dtype.
std::int64_t element_bytes(GPT& model) {
  return static_cast<std::int64_t>(dtype_size(model_dtype(model)));
}

// The checker's own plan: parameters in readiness order (units last to first,
// parameters last to first), a new bucket once one holds >= bucket_bytes.
std::vector<std::vector<BucketPiece>> expected_plan(GPT& model, std::int64_t bucket_bytes) {
  std::vector<std::vector<BucketPiece>> plan(1);
  std::int64_t bytes = 0;
  std::vector<Unit*> units = model.units();
  for (auto u = units.rbegin(); u != units.rend(); ++u) {
    const auto& parameters = (*u)->parameters();
    for (auto p = parameters.rbegin(); p != parameters.rend(); ++p) {
      plan.back().push_back(BucketPiece{(*u)->index(), p->offset, p->shape.numel()});
      bytes += p->shape.numel() * element_bytes(model);
      if (bytes >= bucket_bytes) {
        plan.emplace_back();
        bytes = 0;
      }
    }
  }
  if (plan.back().empty()) plan.pop_back();
  return plan;
}

std::string describe(const BucketPiece& p) {
  return "{unit " + std::to_string(p.unit) + ", offset " + std::to_string(p.offset) + ", numel " +
         std::to_string(p.numel) + "}";
}

std::string check_plan(const BucketedAllReduce& buckets, GPT& model, std::int64_t bucket_bytes) {
  const auto plan = expected_plan(model, bucket_bytes);
  const std::string head = "bucket_bytes " + std::to_string(bucket_bytes) + ": ";
  if (buckets.bucket_count() != static_cast<std::int64_t>(plan.size()))
    return head + "expected " + std::to_string(plan.size()) + " buckets, got " +
           std::to_string(buckets.bucket_count());
  for (std::size_t b = 0; b < plan.size(); ++b) {
    const auto& got = buckets.bucket(static_cast<std::int64_t>(b));
    for (std::size_t i = 0; i < std::max(got.size(), plan[b].size()); ++i) {
      const bool same = i < got.size() && i < plan[b].size() && got[i].unit == plan[b][i].unit &&
                        got[i].offset == plan[b][i].offset && got[i].numel == plan[b][i].numel;
      if (!same)
        return head + "bucket " + std::to_string(b) + " piece " + std::to_string(i) +
               ": expected " + (i < plan[b].size() ? describe(plan[b][i]) : "nothing") + ", got " +
               (i < got.size() ? describe(got[i]) : "nothing") +
               " (buckets take whole parameters in readiness order: units last to first, "
               "parameters last to first)";
    }
  }
  return "";
}

TEST(Puzzle2_3_bucketed_ddp, PlansBucketsInReadinessOrder) {
  run_and_report("2.3 bucket plan", 1, [&](Comm& comm) -> std::string {
    GPT model(ddp_config(12, 3, comm.device()).model);
    const std::int64_t params = parameter_tensors(model);
    for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000},
                               std::int64_t{4096}, std::int64_t{20000}, kHuge}) {
      BucketedAllReduce buckets(comm, model, bytes);
      if (std::string f = check_plan(buckets, model, bytes); !f.empty()) return f;
      if (bytes == 0 && buckets.bucket_count() != params)
        return "bucket_bytes 0 must give one bucket per parameter (" + std::to_string(params) + ")";
      if (bytes == kHuge && buckets.bucket_count() != 1)
        return "a huge bucket_bytes must give one bucket for the whole model";
    }
    return "";
  });
}

// The bytes of the first parameters in readiness order (head's last first),
// running totals: a bucket closes exactly when it reaches bucket_bytes.
std::vector<std::int64_t> running_bytes(GPT& model, int count) {
  std::vector<std::int64_t> totals;
  std::int64_t bytes = 0;
  std::vector<Unit*> units = model.units();
  for (auto u = units.rbegin(); u != units.rend() && static_cast<int>(totals.size()) < count; ++u) {
    const auto& parameters = (*u)->parameters();
    for (auto p = parameters.rbegin();
         p != parameters.rend() && static_cast<int>(totals.size()) < count; ++p) {
      bytes += p->shape.numel() * element_bytes(model);
      totals.push_back(bytes);
    }
  }
  return totals;
}

// Off-by-one mistakes (">" instead of ">=", closing before adding a piece)
// show only at the exact boundaries: one byte below, at and above the size of
// the first parameter, of the first two, of the first three.
TEST(Puzzle2_3_bucketed_ddp, PlansBucketsAtParameterBoundaries) {
  run_and_report("2.3 bucket plan at parameter boundaries", 1, [&](Comm& comm) -> std::string {
    GPT model(ddp_config(12, 3, comm.device()).model);
    for (std::int64_t total : running_bytes(model, 3)) {
      for (std::int64_t bytes : {total - 1, total, total + 1}) {
        BucketedAllReduce buckets(comm, model, bytes);
        if (std::string f = check_plan(buckets, model, bytes); !f.empty())
          return f + " [the first parameters in readiness order add up to " +
                 std::to_string(total) + " bytes: a bucket closes once it holds >= bucket_bytes]";
      }
    }
    return "";
  });
}

// A model whose LayerNorm weights and biases hold a single element each
// (d_model 1): one-element pieces, and bucket_bytes of one element.
TEST(Puzzle2_3_bucketed_ddp, PlansBucketsOfSingleElementParameters) {
  run_and_report("2.3 bucket plan, d_model 1", 1, [&](Comm& comm) -> std::string {
    GPTConfig config = ddp_config(12, 3, comm.device()).model;
    config.d_model = 1;
    config.heads = 1;
    GPT model(config);
    const std::int64_t element = element_bytes(model);
    for (std::int64_t bytes : {std::int64_t{0}, element - 1, element, element + 1, 3 * element}) {
      BucketedAllReduce buckets(comm, model, bytes);
      if (std::string f = check_plan(buckets, model, bytes); !f.empty()) return "d_model 1, " + f;
    }
    return "";
  });
}

// Trains with buckets of `bucket_bytes` and compares with the single device,
// and the per-step communication with the plan.
void expect_bucketed_matches(int world, std::int64_t bucket_bytes, const ModelState& expected) {
  run_and_report(
      "2.3 bucketed DDP, bucket_bytes " + std::to_string(bucket_bytes), world,
      [&](Comm& comm) -> std::string {
        const TrainConfig config = ddp_config(12, 3, comm.device());
        Trainer trainer(config, comm.rank(), comm.size());
        BucketedAllReduce buckets(comm, trainer.model(), bucket_bytes);
        trainer.on_after_backward([&] { buckets.finish(); });
        std::vector<double> losses;
        const std::vector<StepComm> steps = train_rank(comm, trainer, losses);
        // The count comes from the checker's own plan, never from bucket_count().
        const auto planned =
            static_cast<std::int64_t>(expected_plan(trainer.model(), bucket_bytes).size());
        std::string failure = check_step_comm(steps, planned, trainer.model(), config.model.dtype,
                                              "one per bucket of the plan", comm.rank());
        const std::vector<double> mean = mean_over_ranks(comm, losses);
        const std::string replicas = check_parameters_replicated(comm, trainer);
        if (!failure.empty()) return failure;
        return joined(compare_with_single(expected, trainer.model(), mean, comm.rank()), replicas);
      });
}

TEST(Puzzle2_3_bucketed_ddp, FirstStepGradientsAreTheSingleDeviceMean) {
  expect_first_step_gradients("2.3 BucketedAllReduce(bucket_bytes 1000)",
                              [](Comm& comm, Trainer& trainer) -> std::shared_ptr<void> {
                                auto buckets = std::make_shared<BucketedAllReduce>(
                                    comm, trainer.model(), 1000);
                                trainer.on_after_backward([raw = buckets.get()] { raw->finish(); });
                                return buckets;
                              });
}

TEST(Puzzle2_3_bucketed_ddp, MatchesSingleDeviceOnWorlds1To4) {
  const ModelState expected = single_device(ddp_config());
  for (int world = 1; world <= 4; ++world) expect_bucketed_matches(world, 4096, expected);
}

TEST(Puzzle2_3_bucketed_ddp, DegenerateBucketSizes) {
  const ModelState expected = single_device(ddp_config());
  for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{1000}, kHuge})
    expect_bucketed_matches(3, bytes, expected);
}

// Overlap, counted: when the hook for a unit runs, every bucket whose pieces
// all lie in units that are ready by then must already have been started.
// The checker's hook is installed after the BucketedAllReduce's, so it runs
// right after it for each unit. Works on every backend.
TEST(Puzzle2_3_bucketed_ddp, StartsEachBucketAsSoonAsItIsComplete) {
  run_and_report("2.3 bucket start times", 2, [&](Comm& comm) -> std::string {
    Trainer trainer(ddp_config(12, 3, comm.device()), comm.rank(), comm.size());
    GPT& model = trainer.model();
    const std::int64_t bucket_bytes = 1000;
    BucketedAllReduce buckets(comm, model, bucket_bytes);
    const auto plan = expected_plan(model, bucket_bytes);
    std::string failure;
    std::int64_t step_start_calls = 0;
    model.on_grad_ready([&](Unit& unit) {
      // Buckets complete once `unit` is ready: those whose earliest unit is >= unit.index().
      std::int64_t complete = 0;
      for (const auto& bucket : plan) {
        int lowest = bucket.front().unit;
        for (const BucketPiece& p : bucket) lowest = std::min(lowest, p.unit);
        if (lowest >= unit.index()) ++complete;
      }
      const std::int64_t started = all_reduce_calls(comm.stats()) - step_start_calls;
      if (failure.empty() && started != complete)
        failure = "rank " + std::to_string(comm.rank()) + ", step " +
                  std::to_string(trainer.steps_done() + 1) + ": right after unit '" + unit.name() +
                  "' became ready, " + std::to_string(complete) + " bucket(s) were complete but " +
                  std::to_string(started) +
                  " all-reduce(s) had been started (start each bucket's iall_reduce in the hook, "
                  "as soon as its last piece arrives, not in finish())";
    });
    trainer.on_after_backward([&] { buckets.finish(); });
    for (int s = 0; s < 2; ++s) {
      step_start_calls = all_reduce_calls(comm.stats());
      trainer.step();
    }
    return failure;
  });
}

// Overlap, seen. On the thread backend iall_reduce runs on the rank's
// communication thread (trace lane 1) and backward on the rank's own thread
// (lane 0); Request::wait() leaves a "wait" span where the rank thread blocked.
// Two things must show:
//  1. The rank thread never blocks on a request while backward runs (no
//     "wait" span before the last backward span ends). A DDP that waits on
//     each bucket right after starting it stops backward until the bucket has
//     travelled: there is nothing to overlap. This is exact, not timing.
//  2. Communication really runs during backward: the all-reduce span of at
//     least one bucket completed before 'block.0' intersects a backward
//     compute span of the same rank. (Only "at least one": on busy cores the
//     ranks drift apart, the first bucket's all-reduce then waits for the
//     slowest rank and the next ones queue behind it, so how many intersect
//     is timing, not correctness.) On two busy cores the communication
//     thread is sometimes not scheduled at all until backward ends (about 1
//     step in 20 under load, and in runs of several steps on end under a
//     load of 30), so the checker trains 8 steps and asks for overlap in any
//     of them. That cannot let a wrong DDP pass: a rank that
//     waits in its hooks never computes while its bucket travels.
TEST(Puzzle2_3_bucketed_ddp, TraceShowsAllReducesRunningDuringBackward) {
  if (World::from_env(2).backend != Backend::thread)
    GTEST_SKIP()
        << "mpi/nccl progress iall_reduce inside library calls, with no span of their own; "
           "the thread flavour of this checker sees the overlap "
           "(StartsEachBucketAsSoonAsItIsComplete "
           "runs everywhere)";
  constexpr int kSteps = 8;
  // Backward must last long enough for the communication thread to be
  // scheduled while it runs: 8 sequences per step in f64, 16 in f32, whose
  // kernels run about twice as fast.
  const std::int64_t sequences = checker_dtype() == DType::f64 ? 8 : 16;
  auto config_on = [sequences](Device device) {
    return traced_model(ddp_config(sequences, kSteps, device));
  };
  // A few buckets per block: one bucket holds a 64 x 64 weight's gradient.
  const std::int64_t bucket_bytes =
      64 * 64 * static_cast<std::int64_t>(dtype_size(checker_dtype()));
  std::vector<std::vector<BucketPiece>> plan;
  std::vector<std::string> unit_names;
  trace::enable();
  run_and_report("2.3 overlap in the trace", 2, [&](Comm& comm) -> std::string {
    Trainer trainer(config_on(comm.device()), comm.rank(), comm.size());
    BucketedAllReduce buckets(comm, trainer.model(), bucket_bytes);
    if (comm.rank() == 0) {
      plan = expected_plan(trainer.model(), bucket_bytes);
      for (Unit* unit : trainer.model().units()) unit_names.push_back(unit->name());
    }
    trainer.on_after_backward([&] { buckets.finish(); });
    for (int step = 0; step < kSteps; ++step) trainer.step();
    return "";
  });
  trace::disable();
  if (::testing::Test::HasFailure()) return;
  // The unit whose hook completes each bucket: its lowest unit.
  std::vector<int> completing;
  for (const auto& bucket : plan) {
    int lowest = bucket.front().unit;
    for (const BucketPiece& p : bucket) lowest = std::min(lowest, p.unit);
    completing.push_back(lowest);
  }
  const auto early = static_cast<std::size_t>(
      std::count_if(completing.begin(), completing.end(), [](int unit) { return unit >= 2; }));
  ASSERT_GE(early, 2u) << "checker setup: expected at least 2 buckets before block.0, the plan has "
                       << early;
  const std::vector<trace::Span> spans = trace::spans();
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<trace::Span> comm_spans, backward_spans, waits;
    std::vector<std::pair<double, double>>
        backward_passes;  // head backward start .. embedding backward end
    for (const trace::Span& s : spans) {
      if (s.rank != rank) continue;
      if (s.lane == 1 && s.name == "all_reduce") comm_spans.push_back(s);
      if (s.lane == 0 && s.name == "wait") waits.push_back(s);
      if (s.lane == 0 && s.category == "compute" && s.name.find("backward") != std::string::npos)
        backward_spans.push_back(s);
      if (s.lane == 0 && s.name == "head backward") backward_passes.push_back({s.start_us, -1});
      if (s.lane == 0 && s.name == "embedding backward" && !backward_passes.empty())
        backward_passes.back().second = s.end_us;
    }
    std::sort(comm_spans.begin(), comm_spans.end(),
              [](const trace::Span& a, const trace::Span& b) { return a.start_us < b.start_us; });
    ASSERT_EQ(comm_spans.size(), plan.size() * kSteps)
        << "rank " << rank
        << ": expected one all-reduce per bucket and step on the communication thread "
        << "(trace lane 1), " << plan.size() << " buckets x " << kSteps << " steps; got "
        << comm_spans.size()
        << (comm_spans.empty()
                ? " (use comm.iall_reduce: a blocking all_reduce runs on the rank's own thread)"
                : "");
    std::size_t waits_during_backward = 0;
    std::string where;
    for (const trace::Span& w : waits) {
      bool inside = false;
      for (const auto& [begin, end] : backward_passes)
        inside = inside || (w.start_us >= begin && w.start_us < end);
      if (!inside) continue;
      if (waits_during_backward++ < 3) {
        char line[120];
        std::snprintf(line, sizeof line, "%s%.0f-%.0f us", where.empty() ? "" : ", ", w.start_us,
                      w.end_us);
        where += line;
      }
    }
    std::size_t overlapped = 0;
    std::string timeline;
    for (std::size_t i = 0; i < comm_spans.size(); ++i) {
      const std::size_t b = i % plan.size();
      if (b >= early) continue;
      const trace::Span& c = comm_spans[i];
      bool overlaps = false;
      for (const trace::Span& s : backward_spans)
        overlaps = overlaps || (s.start_us < c.end_us && c.start_us < s.end_us);
      overlapped += overlaps ? 1 : 0;
      if (i < plan.size()) {  // the first step's timeline is enough to read
        char line[160];
        std::snprintf(line, sizeof line,
                      "\n    step 1, bucket %zu (complete after '%s'): all-reduce %.0f-%.0f us%s",
                      b, unit_names[static_cast<std::size_t>(completing[b])].c_str(), c.start_us,
                      c.end_us, overlaps ? ", overlaps backward" : "");
        timeline += line;
      }
    }
    char ended[64];
    std::snprintf(ended, sizeof ended, "%.0f",
                  backward_passes.empty() ? -1.0 : backward_passes.front().second);
    EXPECT_EQ(waits_during_backward, 0u)
        << "rank " << rank << ": the rank thread waited on a request " << waits_during_backward
        << " time(s) while backward was running (at " << where
        << "): a hook that waits stops backward until the bucket has travelled, so nothing "
           "overlaps. "
           "Start each bucket with iall_reduce in the hook and return at once; wait only in "
           "finish().";
    EXPECT_GE(overlapped, 1u)
        << "rank " << rank << ": in " << kSteps << " steps, none of the " << early
        << " buckets complete before 'block.0' had its all-reduce running while a "
           "backward span computed on the rank's thread (step 1's backward ended at "
        << ended << " us):" << timeline;
  }
}

TEST(Puzzle2_3_bucketed_ddp, BadInputIsAClearError) {
  run_and_report("2.3 bad input", 1, [&](Comm& comm) -> std::string {
    GPT model(ddp_config(12, 3, comm.device()).model);
    {
      BucketedAllReduce buckets(comm, model, 1000);  // a stub fails here
      try {
        buckets.finish();
        return "finish() before any backward: expected a dtp::Error (no bucket is complete), got "
               "none";
      } catch (const dtp::Error&) {
      }
    }
    try {
      BucketedAllReduce buckets(comm, model, -1);
      return "bucket_bytes = -1: expected a dtp::Error, got none";
    } catch (const dtp::Error&) {
    }
    return "";
  });
}

}  // namespace
