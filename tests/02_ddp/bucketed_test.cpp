// Checkers for 2.3 bucketed DDP overlapped with backward: the bucket plan,
// results equal to single-device training for several bucket sizes, one
// all-reduce per bucket, all-reduces started during backward as soon as a
// bucket is complete (counted from the hooks, and seen in the trace on the
// thread backend), and clear errors.
#include <algorithm>
#include <limits>
#include <memory>

#include "dtp/trace.h"
#include "ddp_checks.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch02;
using dtp::ch02::BucketedAllReduce;
using dtp::ch02::BucketPiece;

constexpr std::int64_t kHuge = std::numeric_limits<std::int64_t>::max() / 4;

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
      bytes += p->shape.numel() * static_cast<std::int64_t>((*u)->grads().element_size());
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
        return head + "bucket " + std::to_string(b) + " piece " + std::to_string(i) + ": expected " +
               (i < plan[b].size() ? describe(plan[b][i]) : "nothing") + ", got " +
               (i < got.size() ? describe(got[i]) : "nothing") +
               " (buckets take whole parameters in readiness order: units last to first, "
               "parameters last to first)";
    }
  }
  return "";
}

TEST(Puzzle2_3_bucketed_ddp, PlansBucketsInReadinessOrder) {
  run_and_report("2.3 bucket plan", 1, [&](Comm& comm) -> std::string {
    GPT model(tiny_config().model);
    const std::int64_t params = parameter_tensors(model);
    for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, std::int64_t{4096},
                               std::int64_t{20000}, kHuge}) {
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

// Trains with buckets of `bucket_bytes` and compares with the single device,
// and the per-step communication with the plan.
void expect_bucketed_matches(int world, std::int64_t bucket_bytes, const ModelState& expected,
                             const TrainConfig& config) {
  run_and_report("2.3 bucketed DDP, bucket_bytes " + std::to_string(bucket_bytes), world,
                 [&](Comm& comm) -> std::string {
                   Trainer trainer(config, comm.rank(), comm.size());
                   BucketedAllReduce buckets(comm, trainer.model(), bucket_bytes);
                   trainer.on_after_backward([&] { buckets.finish(); });
                   std::vector<double> losses;
                   const std::vector<StepComm> steps = train_rank(comm, trainer, losses);
                   std::string failure =
                       check_step_comm(steps, buckets.bucket_count(), gradient_bytes(trainer.model()),
                                       "one per bucket", comm.rank());
                   const std::vector<double> mean = mean_over_ranks(comm, losses);
                   if (!failure.empty()) return failure;
                   return compare_with_single(expected, trainer.model(), mean, comm.rank());
                 });
}

TEST(Puzzle2_3_bucketed_ddp, MatchesSingleDeviceOnWorlds1To4) {
  const TrainConfig config = tiny_config();
  const ModelState expected = single_device(config);
  for (int world = 1; world <= 4; ++world) expect_bucketed_matches(world, 4096, expected, config);
}

TEST(Puzzle2_3_bucketed_ddp, DegenerateBucketSizes) {
  const TrainConfig config = tiny_config();
  const ModelState expected = single_device(config);
  for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{1000}, kHuge})
    expect_bucketed_matches(3, bytes, expected, config);
}

// Overlap, counted: when the hook for a unit runs, every bucket whose pieces
// all lie in units that are ready by then must already have been started.
// The checker's hook is installed after the BucketedAllReduce's, so it runs
// right after it for each unit. Works on every backend.
TEST(Puzzle2_3_bucketed_ddp, StartsEachBucketAsSoonAsItIsComplete) {
  const TrainConfig config = tiny_config();
  run_and_report("2.3 bucket start times", 2, [&](Comm& comm) -> std::string {
    Trainer trainer(config, comm.rank(), comm.size());
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
        failure = "rank " + std::to_string(comm.rank()) + ", step " + std::to_string(trainer.steps_done() + 1) +
                  ": right after unit '" + unit.name() + "' became ready, " + std::to_string(complete) +
                  " bucket(s) were complete but " + std::to_string(started) +
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

// Overlap, seen: on the thread backend iall_reduce runs on the rank's
// communication thread (trace lane 1). The first bucket's all-reduce must
// start before the backward of the first block ("block.0 backward", the last
// block backward reaches) finishes. A somewhat larger model makes each block's
// backward long enough to see it.
TEST(Puzzle2_3_bucketed_ddp, TraceShowsAllReduceDuringBackward) {
  TrainConfig config = tiny_config(8, 1);
  config.model.d_model = 64;
  config.model.heads = 4;
  config.model.layers = 3;
  config.model.context = 32;
  config.seq = 32;
  const bool thread_backend = World::from_env(2).backend == Backend::thread;
  if (thread_backend) trace::enable();
  run_and_report("2.3 overlap in the trace", 2, [&](Comm& comm) -> std::string {
    Trainer trainer(config, comm.rank(), comm.size());
    BucketedAllReduce buckets(comm, trainer.model(), 1);  // the head's last parameter is bucket 0
    trainer.on_after_backward([&] { buckets.finish(); });
    trainer.step();
    return "";
  });
  if (!thread_backend) {
    // mpi advances MPI_Iallreduce inside MPI calls, with no span of its own;
    // StartsEachBucketAsSoonAsItIsComplete covers the overlap there.
    return;
  }
  trace::disable();
  const std::vector<trace::Span> spans = trace::spans();
  for (int rank = 0; rank < 2; ++rank) {
    double first_comm = -1, block0_end = -1, embedding_end = -1;
    for (const trace::Span& s : spans) {
      if (s.rank != rank) continue;
      if (s.name == "all_reduce" && s.lane == 1 && (first_comm < 0 || s.start_us < first_comm))
        first_comm = s.start_us;
      if (s.name == "block.0 backward" && s.lane == 0) block0_end = s.end_us;
      if (s.name == "embedding backward" && s.lane == 0) embedding_end = s.end_us;
    }
    ASSERT_GE(block0_end, 0) << "rank " << rank << ": no 'block.0 backward' span in the trace";
    ASSERT_GE(first_comm, 0) << "rank " << rank
                             << ": no all_reduce ran on the communication thread (trace lane 1): "
                                "use comm.iall_reduce for the buckets";
    EXPECT_LT(first_comm, block0_end)
        << "rank " << rank << ": the first bucket's all-reduce started at " << first_comm
        << " us, after 'block.0 backward' ended at " << block0_end << " us (embedding backward ended at "
        << embedding_end << " us): communication does not overlap backward";
  }
}

TEST(Puzzle2_3_bucketed_ddp, BadInputIsAClearError) {
  run_and_report("2.3 bad input", 1, [&](Comm& comm) -> std::string {
    GPT model(tiny_config().model);
    {
      BucketedAllReduce buckets(comm, model, 1000);  // a stub fails here
      try {
        buckets.finish();
        return "finish() before any backward: expected a dtp::Error (no bucket is complete), got none";
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
