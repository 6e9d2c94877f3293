// Checkers for 3.5 ZeRO-1 with the optimizer offloaded to host memory: the
// numbers of ZeRO-1, and the optimizer (state and master copy) on the host.
// The GPU flavour also checks that the device holds no optimizer bytes; on
// the CPU flavour the model runs on a stand-in device so that where each
// buffer lives can be told apart from the host.
#include "zero_expectations.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch03;

TEST(Puzzle3_5_zero1_offload, FirstStepGradientShardsAreTheSingleDeviceMean) {
  expect_first_step_shards(Stage::offload);
}
TEST(Puzzle3_5_zero1_offload, MatchesSingleDeviceSgdMomentum) {
  expect_matches_single(Stage::offload, tiny_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_5_zero1_offload, MatchesSingleDeviceAdamW) {
  expect_matches_single(Stage::offload, adamw_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_5_zero1_offload, OptimizerLivesOnTheHost) { expect_memory(Stage::offload); }
TEST(Puzzle3_5_zero1_offload, CommunicationPerStep) { expect_communication(Stage::offload); }

// Where each buffer lives. On a GPU the model is on the rank's GPU. On the
// CPU flavour host and device are the same memory, so the model goes on a
// stand-in device, Device{cpu, 1}: host memory that is not Device::cpu(), so
// that a "host" copy made where the model lives (on view.device()) shows.
// The master copy and the gradient shards the shard optimizer updates from
// (and so its state) must be on Device::cpu(); the model keeps its own.
Device model_device(const Comm& comm) {
  return comm.device().is_cuda() ? comm.device() : Device{Device::Kind::cpu, 1};
}

std::string place(const Device& device) {
  if (device == Device::cpu()) return "the host (Device::cpu())";
  if (device.is_cpu()) return "the model's device (the CPU flavour's stand-in, Device{cpu, 1})";
  return device.str() + ", the model's device";
}

TEST(Puzzle3_5_zero1_offload, MasterCopyAndOptimizerLiveOnTheHostNotTheModelsDevice) {
  run_and_report("3.5 Zero1Offload placement", 2, [&](Comm& comm) -> std::string {
    TrainConfig config = on_device(adamw_config(12, 1), comm.device());
    config.model.device = model_device(comm);
    StagedTrainer run = plug(Stage::offload, comm, config);
    run.trainer->step();
    const std::string rank = "rank " + std::to_string(comm.rank()) + ": ";
    for (Unit* unit : run.trainer->model().units()) {
      const std::string where = " of unit '" + unit->name() + "'";
      const Device master = run.stage->parameter_shard(unit->index()).device();
      if (master != Device::cpu())
        return rank + "the master copy (parameter shard)" + where + " is on " + place(master) +
               "; host_parameter_shards must allocate it on Device::cpu(), whatever device the "
               "model's parameters are on";
      const Device gradient = run.stage->gradient_shard(unit->index()).device();
      if (gradient != Device::cpu())
        return rank + "the gradient shard" + where + " is on " + place(gradient) +
               "; the optimizer reads it on the host, expected Device::cpu()";
      if (unit->params().device() != config.model.device)
        return rank + "the model's parameters" + where + " moved to " +
               place(unit->params().device()) +
               "; copy each updated shard back into them, where they are";
    }
    for (const ParamBuffer& buffer : run.stage->shard_optimizer().buffers())
      if (buffer.params.device() != Device::cpu() || buffer.grads.device() != Device::cpu())
        return rank + "the shard optimizer's buffer '" + buffer.name + "' is on " +
               place(buffer.params.device()) + "; expected host memory (Device::cpu())";
    return "";
  });
}

}  // namespace
