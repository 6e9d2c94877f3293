// Puzzle 8.4: LoRA under data parallelism. Only the adapters' gradients
// travel, one all-reduce per block started in the block's grad-ready hook
// (overlapped with the backward of the blocks below), and three steps equal
// the checker's own LoRA training of the whole batch. The models are f64 on
// the CPU, f32 on a GPU (lora_checks.h).
#include <memory>

#include "dtp/trace.h"
#include "lora_checks.h"
#include "support/trace_overlap.h"

namespace dtp {
namespace {

using namespace testing::ch08;

ch08::LoraConfig ddp_lora_config() {
  ch08::LoraConfig c;
  c.rank = 2;
  c.alpha = 4;
  c.seed = 9;
  return c;
}

/// A trainer with LoRA on its model: SGD (momentum) over the adapters only.
struct LoraRun {
  Trainer trainer;
  ch08::LoraModel lora;
  LoraRun(const TrainConfig& config, int rank, int world)
      : trainer(config, rank, world), lora(trainer.model(), ddp_lora_config()) {
    trainer.set_optimizer(make_optimizer(config, lora.buffers()));
    trainer.on_zero_grad([this] { lora.zero_grad(); });
  }
  std::vector<std::pair<std::string, Tensor>> adapters() const {
    std::vector<std::pair<std::string, Tensor>> named;
    for (const ParamBuffer& b : lora.buffers()) named.push_back({b.name, b.params});
    return named;
  }
};

TEST(Puzzle8_4_lora_ddp, OneAllReducePerBlockMovingExactlyTheAdapterGradients) {
  for (int world : {2, 3}) {
    testing::run_and_report("LoRA DDP communication", world, [&](Comm& comm) -> std::string {
      const TrainConfig config = lora_tiny_config(12, 2, comm.device());
      LoraRun run(config, comm.rank(), comm.size());
      ch08::LoraDataParallel ddp(comm, run.trainer.model(), run.lora);
      run.trainer.on_after_backward([&] { ddp.finish(); });
      const std::int64_t blocks = run.trainer.model().num_blocks();
      const std::int64_t element = static_cast<std::int64_t>(dtype_size(config.model.dtype));
      const std::int64_t bytes = run.lora.trainable_parameters() * element;
      std::vector<double> losses;
      const auto steps = testing::train_rank(comm, run.trainer, losses);
      for (std::size_t s = 0; s < steps.size(); ++s) {
        const testing::StepComm& c = steps[s];
        if (c.all_reduces != blocks || c.bytes != bytes || c.other_collectives != 0)
          return "rank " + std::to_string(comm.rank()) + ", step " + std::to_string(s + 1) +
                 ": expected " + std::to_string(blocks) + " all-reduces (one per block) moving " +
                 std::to_string(bytes) + " bytes (the adapters' gradients: " +
                 std::to_string(run.lora.trainable_parameters()) + " x " + std::to_string(element) +
                 ") and no other collective; got " + std::to_string(c.all_reduces) +
                 " all-reduce(s) of " + std::to_string(c.bytes) + " bytes and " +
                 std::to_string(c.other_collectives) + " other collective(s)" +
                 (c.bytes > bytes ? ". More bytes than the adapters have: are base weights or "
                                    "gradients travelling? "
                                    "The frozen base is the same on every rank and has no gradients"
                                  : "");
      }
      return "";
    });
  }
}

// Three steps against the checker's own LoRA training on the whole global
// batch (lora_checks.h): after every backward and finish() each rank holds
// the batch's gradients (the mean of the ranks' own), the replicas agree
// after every step, and the losses and adapters follow the checker's.
TEST(Puzzle8_4_lora_ddp, TrainingEqualsTheCheckersLoraTrainingAndReplicasAgreeEveryStep) {
  constexpr int kSteps = 3;
  const LoraTrajectory expected =
      checker_lora_training(lora_tiny_config(12, kSteps), ddp_lora_config(), kSteps);
  for (int world : {2, 4}) {
    testing::run_and_report("LoRA DDP training", world, [&](Comm& comm) -> std::string {
      const std::string rank = "rank " + std::to_string(comm.rank()) + ", ";
      LoraRun run(lora_tiny_config(12, kSteps, comm.device()), comm.rank(), comm.size());
      ch08::LoraDataParallel ddp(comm, run.trainer.model(), run.lora);
      run.trainer.on_after_backward([&] { ddp.finish(); });
      std::vector<double> gradients, previous, losses;
      run.trainer.on_after_backward([&] { gradients = adapter_gradients(run.lora); });
      for (int step = 1; step <= kSteps; ++step) {
        losses.push_back(run.trainer.step().loss);
        const std::string wrong = check_step_gradients(expected, step, gradients, previous);
        if (!wrong.empty()) {
          std::vector<double> summed = expected.grads[static_cast<std::size_t>(step - 1)];
          for (double& g : summed) g *= comm.size();
          if (first_apart(summed, gradients) < 0)
            return rank + wrong + ": the ranks' gradients summed, not averaged (ReduceOp::avg)";
          const std::vector<double> own =
              checker_lora_training(lora_tiny_config(12, 1), ddp_lora_config(), 1, comm.rank(),
                                    comm.size())
                  .grads[0];
          if (step == 1 && first_apart(own, gradients) < 0)
            return rank + wrong +
                   ": this rank's own gradient, never averaged (does every block's hook start "
                   "its all-reduce, and finish() wait for it?)";
          return rank + wrong;
        }
        previous = gradients;
        const std::string apart = testing::check_replicas_agree(
            comm, run.adapters(),
            "Each rank must apply the same averaged adapter gradients (step " +
                std::to_string(step) + ").",
            "DP");
        if (!apart.empty()) return rank + apart;
        const std::vector<double> params = adapter_parameters(run.lora);
        const std::vector<double>& want = expected.params[static_cast<std::size_t>(step - 1)];
        const std::int64_t i = first_moved_apart(expected, want, params);
        if (i >= 0)
          return rank + "after step " + std::to_string(step) + ", " + expected.where(i) + " is " +
                 testing::number(params[static_cast<std::size_t>(i)]) + ", the checker's is " +
                 testing::number(want[static_cast<std::size_t>(i)]) +
                 " while the gradients were right: the update missed the adapters";
      }
      const std::vector<double> mean = testing::mean_over_ranks(comm, losses);
      for (std::size_t s = 0; s < mean.size(); ++s)
        if (!(std::fabs(mean[s] - expected.losses[s]) <=
              trajectory_tolerance() * std::fabs(expected.losses[s])))
          return "step " + std::to_string(s + 1) + ": the mean loss over ranks is " +
                 testing::number(mean[s]) + ", the checker's is " +
                 testing::number(expected.losses[s]);
      return "";
    });
  }
}

// Overlap, counted (every backend): the checker's grad-ready hook, added
// after LoraDataParallel's, runs right after it for each unit. When block i
// is ready, blocks N-1 .. i have final gradients, so this step has started
// N - i all-reduces: each in its block's hook, none left for finish().
TEST(Puzzle8_4_lora_ddp, StartsEachBlocksAllReduceInItsGradReadyHook) {
  testing::run_and_report("LoRA DDP start times", 2, [&](Comm& comm) -> std::string {
    LoraRun run(lora_tiny_config(12, 2, comm.device()), comm.rank(), comm.size());
    GPT& model = run.trainer.model();
    ch08::LoraDataParallel ddp(comm, model, run.lora);
    std::string failure;
    std::int64_t step_start = 0;
    model.on_grad_ready([&](Unit& unit) {
      const int block = unit.index() - 1;  // units: embedding, block.0 .., head
      if (!failure.empty() || block < 0 || block >= model.num_blocks()) return;
      const std::int64_t started = testing::all_reduce_calls(comm.stats()) - step_start;
      const std::int64_t final_blocks = model.num_blocks() - block;
      if (started != final_blocks)
        failure = "rank " + std::to_string(comm.rank()) + ", step " +
                  std::to_string(run.trainer.steps_done() + 1) + ": right after '" + unit.name() +
                  "' became ready, " + std::to_string(final_blocks) +
                  " block(s) had final adapter gradients but " + std::to_string(started) +
                  " all-reduce(s) had been started" +
                  (started == 0 ? ": none, so nothing overlaps backward. Start block i's "
                                  "iall_reduce in its grad-ready hook, not in finish()"
                                : "");
    });
    run.trainer.on_after_backward([&] { ddp.finish(); });
    for (int s = 0; s < 2; ++s) {
      step_start = testing::all_reduce_calls(comm.stats());
      run.trainer.step();
    }
    return failure;
  });
}

// Overlap, seen (thread backend), as puzzle 2.3 reads it from the trace
// (support/trace_overlap.h): every all-reduce runs on the communication
// thread, the rank's thread never waits on one while backward runs (exact),
// and in at least one of 4 steps the all-reduce of a block above block.0
// runs during the rank's backward (timing: on two busy cores the
// communication thread is sometimes not scheduled until backward ends). An
// all-reduce started in finish() never can.
TEST(Puzzle8_4_lora_ddp, TraceShowsAllReducesRunningDuringBackward) {
  if (!testing::trace_has_comm_lane())
    GTEST_SKIP() << "mpi/nccl progress iall_reduce inside library calls, with no span of their "
                    "own; the thread flavour checks this (StartsEachBlocksAllReduceInItsGradReady"
                    "Hook runs everywhere)";
  constexpr int kSteps = 4;
  TrainConfig config = lora_tiny_config(8, kSteps);
  config.model.d_model = 128;
  config.model.heads = 4;
  config.model.layers = 3;
  config.model.context = 64;
  config.seq = 64;
  trace::enable();
  testing::run_and_report("8.4 overlap in the trace", 2, [&](Comm& comm) -> std::string {
    TrainConfig mine = config;
    mine.model.device = comm.device();
    LoraRun run(mine, comm.rank(), comm.size());
    ch08::LoraDataParallel ddp(comm, run.trainer.model(), run.lora);
    run.trainer.on_after_backward([&] { ddp.finish(); });
    for (int s = 0; s < kSteps; ++s) run.trainer.step();
    return "";
  });
  trace::disable();
  if (::testing::Test::HasFailure()) return;
  const auto blocks = static_cast<std::size_t>(config.model.layers);
  const std::vector<trace::Span> spans = trace::spans();
  for (int rank = 0; rank < 2; ++rank) {
    const testing::RankLanes lanes = testing::lanes_of(spans, rank);
    const std::vector<trace::Span> reduces = testing::named(lanes.comm, "all_reduce");
    ASSERT_EQ(reduces.size(), blocks * kSteps)
        << "rank " << rank << ": expected one all-reduce per block and step on the communication "
        << "thread (trace lane 1), " << blocks << " x " << kSteps << "; got " << reduces.size()
        << (reduces.empty() ? " (use comm.iall_reduce: a blocking all_reduce runs on the rank's "
                              "own thread and stops backward)"
                            : "");
    const std::size_t waits = testing::waits_during_backward(lanes).size();
    EXPECT_EQ(waits, 0u) << "rank " << rank << ": the rank's thread waited on a request " << waits
                         << " time(s) while backward was running: a hook that waits stops "
                            "backward until its block's gradients have travelled. Start the "
                            "all-reduce in the hook and return at once; wait only in finish()";
    // Per step the blocks' all-reduces start in backward order: block N-1 first, block.0 last.
    std::size_t overlapped = 0;
    for (std::size_t i = 0; i < reduces.size(); ++i)
      if (i % blocks + 1 < blocks && testing::during_backward(lanes, reduces[i])) ++overlapped;
    const auto passes = testing::backward_passes(lanes);
    std::string timeline = passes.empty()
                               ? ""
                               : "; step 1's backward ran " + testing::number(passes[0].first) +
                                     "-" + testing::number(passes[0].second) + " us";
    for (std::size_t b = 0; b < blocks; ++b)
      timeline += ", block." + std::to_string(blocks - 1 - b) + "'s all-reduce " +
                  testing::number(reduces[b].start_us) + "-" + testing::number(reduces[b].end_us) +
                  " us";
    EXPECT_GE(overlapped, 1u) << "rank " << rank << ": in " << kSteps << " steps, no all-reduce of "
                              << "a block above block.0 ran while the rank's backward was still "
                              << "running" << timeline;
  }
}

// 8.4's bad call: finish() with no backward since the last one. The
// contract says it throws naming a block whose hook did not run.
TEST(Puzzle8_4_lora_ddp, FinishWithoutABackwardIsAnErrorNamingABlock) {
  testing::run_and_report("LoRA DDP finish() twice", 2, [&](Comm& comm) -> std::string {
    LoraRun run(lora_tiny_config(12, 1, comm.device()), comm.rank(), comm.size());
    ch08::LoraDataParallel ddp(comm, run.trainer.model(), run.lora);
    run.trainer.on_after_backward([&] { ddp.finish(); });
    run.trainer.step();
    const std::string message = testing::error_of([&] { ddp.finish(); });
    if (message.find("block") == std::string::npos)
      return "rank " + std::to_string(comm.rank()) +
             ": finish() a second time, with no backward in between, must throw a dtp::Error "
             "naming a block whose gradients were not all-reduced; " +
             (message.empty() ? "it returned" : "it threw: " + message);
    return "";
  });
}

// Destroyed with an all-reduce in flight: a backward stopped by an error
// right after block.1's hook (block.1's all-reduce started, block.0's
// never). The contract: the destructor waits for the requests in flight
// (so block.1's gradients are the ranks' mean once it returns) and never
// throws; and every rank goes on (a collective after it completes).
TEST(Puzzle8_4_lora_ddp, DestroyedWithAnAllReduceInFlightItWaitsForIt) {
  struct Stop {};
  const bool lanes = testing::trace_has_comm_lane();
  if (lanes) trace::enable();
  testing::run_and_report("LoRA DDP destroyed mid-backward", 2, [&](Comm& comm) -> std::string {
    const std::string rank = "rank " + std::to_string(comm.rank()) + ": ";
    const TrainConfig config = lora_tiny_config(12, 1, comm.device());
    LoraRun run(config, comm.rank(), comm.size());
    GPT& model = run.trainer.model();
    auto ddp = std::make_unique<ch08::LoraDataParallel>(comm, model, run.lora);
    model.on_grad_ready([](Unit& unit) {
      if (unit.name() == "block.1") throw Stop{};
    });
    const Batch batch = run.trainer.sampler().batch(0, config.model.device);
    model.forward(batch.inputs, batch.targets);
    try {
      model.backward();
      return rank + "checker setup: the backward was not stopped at block.1";
    } catch (const Stop&) {
    }
    {
      trace::Scope span("checker: ~LoraDataParallel", "checker");
      ddp.reset();
    }
    // Block 1's adapter gradients: the mean over ranks of the checker's own.
    std::vector<double> own = checker_lora_training(lora_tiny_config(12, 1), ddp_lora_config(), 1,
                                                    comm.rank(), comm.size())
                                  .grads[0];
    Tensor mean = Tensor::from_values(own, DType::f64).to(comm.device());
    comm.all_reduce(mean, ReduceOp::avg);
    const std::vector<double> want = mean.to_vector();
    const std::vector<double> got = adapter_gradients(run.lora);
    const auto first = static_cast<std::size_t>(run.lora.buffers()[0].grads.numel());
    const std::int64_t i = first_apart(std::vector<double>(want.begin() + first, want.end()),
                                       std::vector<double>(got.begin() + first, got.end()));
    if (i >= 0)
      return rank + "right after ~LoraDataParallel returned, the adapter gradient " +
             "block 1 element " + std::to_string(i) + " is " +
             testing::number(got[first + static_cast<std::size_t>(i)]) +
             ", the mean over the ranks is " +
             testing::number(want[first + static_cast<std::size_t>(i)]) +
             ": not the mean, so block 1's all-reduce was not complete when the destructor "
             "returned (never started in its hook, or started and not waited for: the "
             "destructor must wait for every request started, Request::wait)";
    return "";
  });
  if (!lanes) return;
  trace::disable();
  if (::testing::Test::HasFailure()) return;
  for (int rank = 0; rank < 2; ++rank) {
    const testing::RankLanes lanes_of_rank = testing::lanes_of(trace::spans(), rank);
    // No all-reduce on the communication thread: block.1's hook started no
    // iall_reduce (a blocking all_reduce, or none), so nothing was in flight
    // for the destructor to wait for. Name that, not the destructor.
    if (testing::named(lanes_of_rank.comm, "all_reduce").empty()) {
      ADD_FAILURE() << "rank " << rank << ": block.1's hook started no comm.iall_reduce (no "
                    << "all-reduce ran on the communication thread), so nothing was in flight "
                    << "for ~LoraDataParallel to wait for: start it with comm.iall_reduce in "
                    << "the hook and keep its Request";
      continue;
    }
    const std::size_t waits =
        testing::count_inside(lanes_of_rank, "checker: ~LoraDataParallel", "wait");
    EXPECT_EQ(waits, 1u) << "rank " << rank << ": ~LoraDataParallel waited on " << waits
                         << " request(s); block.1's all-reduce was in flight (block.0's never "
                            "started): wait for each request started, skip the blocks that "
                            "have none";
  }
}

}  // namespace
}  // namespace dtp
