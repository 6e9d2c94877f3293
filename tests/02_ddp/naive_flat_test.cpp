// Checkers for 2.1 naive DDP (one all-reduce per parameter) and 2.2 flat DDP
// (one all-reduce per unit): the first step's synchronized gradients equal
// the single-device gradient of the same global batch (a wrong scale is named
// as a ratio), after 3 steps on world sizes 1-4 every rank equals
// single-device training with bitwise equal replicas, and each step issues
// exactly the expected all-reduces.
#include "ddp_checks.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch02;

using Sync = std::function<void(Comm&, GPT&)>;

// The pattern: Trainer(config, rank, world) + on_after_backward(sync).
void expect_matches_single(const std::string& name, const Sync& sync) {
  const ModelState expected = single_device(ddp_config());
  for (int world = 1; world <= 4; ++world) {
    run_and_report(name + " vs single device", world, [&](Comm& comm) {
      Trainer trainer(ddp_config(12, 3, comm.device()), comm.rank(), comm.size());
      trainer.on_after_backward([&] { sync(comm, trainer.model()); });
      std::vector<double> losses;
      train_rank(comm, trainer, losses);
      const std::string replicas = check_parameters_replicated(comm, trainer);
      return joined(compare_with_single(expected, trainer.model(), mean_over_ranks(comm, losses),
                                        comm.rank()),
                    replicas);
    });
  }
}

// calls_per_step(model) all-reduces per step moving the gradient bytes.
void expect_communication(const std::string& name, const Sync& sync,
                          const std::function<std::int64_t(GPT&)>& calls_per_step,
                          const std::string& formula) {
  for (int world : {2, 3}) {
    run_and_report(name + " communication", world, [&](Comm& comm) {
      const TrainConfig config = ddp_config(12, 3, comm.device());
      Trainer trainer(config, comm.rank(), comm.size());
      trainer.on_after_backward([&] { sync(comm, trainer.model()); });
      std::vector<double> losses;
      const std::vector<StepComm> steps = train_rank(comm, trainer, losses);
      return check_step_comm(steps, calls_per_step(trainer.model()), trainer.model(),
                             config.model.dtype, formula, comm.rank());
    });
  }
}

// An after-backward synchronization, as the trainer's hook.
Install after_backward(const Sync& sync) {
  return [sync](Comm& comm, Trainer& trainer) -> std::shared_ptr<void> {
    trainer.on_after_backward([&comm, &trainer, sync] { sync(comm, trainer.model()); });
    return nullptr;
  };
}

TEST(Puzzle2_1_naive_ddp, FirstStepGradientsAreTheSingleDeviceMean) {
  expect_first_step_gradients("2.1 naive_all_reduce_gradients",
                              after_backward(dtp::ch02::naive_all_reduce_gradients));
}

TEST(Puzzle2_1_naive_ddp, MatchesSingleDeviceOnWorlds1To4) {
  expect_matches_single("2.1 naive_all_reduce_gradients", dtp::ch02::naive_all_reduce_gradients);
}

TEST(Puzzle2_1_naive_ddp, OneAllReducePerParameter) {
  expect_communication("2.1 naive_all_reduce_gradients", dtp::ch02::naive_all_reduce_gradients,
                       parameter_tensors, "one per named parameter");
}

TEST(Puzzle2_2_flat_ddp, FirstStepGradientsAreTheSingleDeviceMean) {
  expect_first_step_gradients("2.2 flat_all_reduce_gradients",
                              after_backward(dtp::ch02::flat_all_reduce_gradients));
}

TEST(Puzzle2_2_flat_ddp, MatchesSingleDeviceOnWorlds1To4) {
  expect_matches_single("2.2 flat_all_reduce_gradients", dtp::ch02::flat_all_reduce_gradients);
}

TEST(Puzzle2_2_flat_ddp, OneAllReducePerUnit) {
  expect_communication(
      "2.2 flat_all_reduce_gradients", dtp::ch02::flat_all_reduce_gradients,
      [](GPT& model) { return static_cast<std::int64_t>(model.units().size()); }, "one per unit");
}

}  // namespace
