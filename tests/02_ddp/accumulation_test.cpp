// Checkers for 2.4 gradient accumulation: K micro-batches per optimizer step
// on W ranks equal one single-device step on the whole global batch; the
// gradients are synchronized once per step, after the last micro-batch.
#include "ddp_checks.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch02;

struct AccumulationRun {
  std::vector<double> losses;
  std::string failure;  // protocol problems seen during the run
};

// One optimizer step per s: zero_grad, accumulation_step over this rank's K
// micro-batches, optimizer update (no clipping: tiny_config disables it).
// The synchronization is the checker's own flat all-reduce, so 2.4 can be
// solved before 2.2 and 2.3.
AccumulationRun train_accumulating(Comm& comm, Trainer& trainer, std::int64_t k) {
  AccumulationRun run;
  GPT& model = trainer.model();
  int backwards = 0;  // backward passes finished in this step
  model.on_grad_ready([&](Unit& unit) {
    if (unit.index() == 0) ++backwards;
  });
  const BatchSampler& sampler = trainer.sampler();
  const std::int64_t micro = sampler.local_batch() / k;
  for (std::int64_t s = 0; s < trainer.config().steps; ++s) {
    std::vector<Batch> micro_batches;
    for (std::int64_t i = 0; i < k; ++i)
      micro_batches.push_back(sampler.samples(s, sampler.first_sample() + i * micro, micro,
                                              trainer.config().model.device));
    model.zero_grad();
    backwards = 0;
    int syncs = 0;
    int backwards_at_sync = -1;
    const CommStats before = comm.stats();
    const double loss = dtp::ch02::accumulation_step(model, micro_batches, [&] {
      ++syncs;
      backwards_at_sync = backwards;
      for (Unit* unit : model.units()) comm.all_reduce(unit->grads(), ReduceOp::avg);
    });
    const StepComm c = comm_between(before, comm.stats());
    const std::string where = "rank " + std::to_string(comm.rank()) + ", step " +
                              std::to_string(s + 1) + ", K = " + std::to_string(k) + ": ";
    if (run.failure.empty() && syncs != 1)
      run.failure = where + "synchronize_gradients was called " + std::to_string(syncs) +
                    " time(s); expected exactly once per optimizer step";
    if (run.failure.empty() && backwards_at_sync != k)
      run.failure = where + "synchronize_gradients ran after " + std::to_string(backwards_at_sync) +
                    " backward pass(es); expected after all " + std::to_string(k) +
                    " (the first K-1 micro-steps must not communicate)";
    if (run.failure.empty() && backwards != k)
      run.failure =
          where + std::to_string(backwards) + " backward pass(es); expected " + std::to_string(k);
    if (run.failure.empty() && (c.all_reduces != static_cast<std::int64_t>(model.units().size()) ||
                                c.other_collectives != 0))
      run.failure = where + "expected only the synchronization's " +
                    std::to_string(model.units().size()) + " all-reduces; got " +
                    std::to_string(c.all_reduces) + " all-reduces and " +
                    std::to_string(c.other_collectives) + " other collective call(s)";
    trainer.optimizer().step(trainer.config().schedule().at(s));
    run.losses.push_back(loss);
  }
  model.clear_grad_ready_hooks();
  return run;
}

void expect_accumulation_matches(int world, std::int64_t k) {
  // The single-device run takes the whole global batch 12K at once; each of
  // the W ranks takes 12K/W in K micro-batches of 12/W.
  const ModelState expected = single_device(ddp_config(12 * k));
  run_and_report("2.4 accumulation_step, K = " + std::to_string(k), world, [&](Comm& comm) {
    Trainer trainer(ddp_config(12 * k, 3, comm.device()), comm.rank(), comm.size());
    AccumulationRun run = train_accumulating(comm, trainer, k);
    const std::vector<double> mean = mean_over_ranks(comm, run.losses);
    const std::string replicas = check_parameters_replicated(comm, trainer);
    if (!run.failure.empty()) return run.failure;
    return joined(compare_with_single(expected, trainer.model(), mean, comm.rank()), replicas);
  });
}

// One optimizer step's gradients, right after the synchronization, against
// the single-device gradient of the whole global batch: a missing 1/K shows
// as "2.00x the single-device mean" even on one rank.
TEST(Puzzle2_4_gradient_accumulation, FirstStepGradientsAreTheBigBatchMean) {
  const std::int64_t k = 2;
  const UnitGradients expected = first_step_gradients(ddp_config(12 * k, 1));
  for (int world : {1, 2, 3}) {
    run_and_report(
        "2.4 accumulation_step, K = 2, first-step gradients vs the single-device mean", world,
        [&](Comm& comm) {
          const TrainConfig config = ddp_config(12 * k, 1, comm.device());
          const UnitGradients local = first_step_gradients(config, comm.rank(), comm.size());
          Trainer trainer(config, comm.rank(), comm.size());
          GPT& model = trainer.model();
          const BatchSampler& sampler = trainer.sampler();
          const std::int64_t micro = sampler.local_batch() / k;
          std::vector<Batch> micro_batches;
          for (std::int64_t i = 0; i < k; ++i)
            micro_batches.push_back(
                sampler.samples(0, sampler.first_sample() + i * micro, micro, config.model.device));
          model.zero_grad();
          dtp::ch02::accumulation_step(model, micro_batches, [&] {
            for (Unit* unit : model.units()) comm.all_reduce(unit->grads(), ReduceOp::avg);
          });
          return check_first_step_gradients(expected, local, model, comm.rank(), comm.size(), k);
        });
  }
}

TEST(Puzzle2_4_gradient_accumulation, MatchesSingleDeviceBigBatchK2) {
  for (int world = 1; world <= 4; ++world) expect_accumulation_matches(world, 2);
}

TEST(Puzzle2_4_gradient_accumulation, MatchesSingleDeviceBigBatchK3) {
  for (int world : {1, 2, 3}) expect_accumulation_matches(world, 3);
}

TEST(Puzzle2_4_gradient_accumulation, KEqualsOneIsAPlainStep) {
  for (int world : {1, 4}) expect_accumulation_matches(world, 1);
}

TEST(Puzzle2_4_gradient_accumulation, BadMicroBatchesAreClearErrors) {
  // Every rank sees the same bad input, so all fail together and none waits.
  run_and_report("2.4 accumulation_step bad input", 2, [&](Comm& comm) -> std::string {
    const TrainConfig config = ddp_config(12, 3, comm.device());
    Trainer trainer(config, comm.rank(), comm.size());
    GPT& model = trainer.model();
    const BatchSampler& sampler = trainer.sampler();
    const Device device = config.model.device;
    int syncs = 0;
    auto sync = [&] { ++syncs; };
    const std::string rank = "rank " + std::to_string(comm.rank()) + ": ";
    // A valid call first: a stub must fail here, not pass the error checks below.
    dtp::ch02::accumulation_step(
        model, {sampler.samples(0, 0, 2, device), sampler.samples(0, 2, 2, device)}, sync);
    if (syncs != 1)
      return rank + "a valid 2-micro-batch call synchronized " + std::to_string(syncs) + " times";
    try {
      dtp::ch02::accumulation_step(model, {}, sync);
      return rank + "no micro-batches: expected a dtp::Error, got a loss";
    } catch (const dtp::Error&) {
    }
    try {
      dtp::ch02::accumulation_step(
          model, {sampler.samples(0, 0, 2, device), sampler.samples(0, 2, 1, device)}, sync);
      return rank +
             "micro-batches of 2 and 1 sequences: expected a dtp::Error (1/K weighting needs equal "
             "micro-batches), got a loss";
    } catch (const dtp::Error&) {
    }
    if (model.has_saved_activations() || syncs != 1)
      return rank + "a rejected call must check its input before any forward or synchronization";
    return "";
  });
}

}  // namespace
