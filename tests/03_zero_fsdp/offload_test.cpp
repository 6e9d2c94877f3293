// Checkers for 3.5 ZeRO-1 with the optimizer offloaded to host memory: the
// numbers of ZeRO-1, and the optimizer (state and master copy) on the host.
// On the CPU flavour device and host are the same memory, so only the
// numbers and where the state lives can be checked; the GPU flavour also
// checks that the device holds no optimizer bytes.
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

TEST(Puzzle3_5_zero1_offload, ShardOptimizerBuffersAreHostTensors) {
  run_and_report("3.5 Zero1Offload buffers", 2, [&](Comm& comm) -> std::string {
    StagedTrainer run = plug(Stage::offload, comm, adamw_config(12, 1));
    run.trainer->step();
    for (const ParamBuffer& buffer : run.stage->shard_optimizer().buffers())
      if (!buffer.params.device().is_cpu() || !buffer.grads.device().is_cpu())
        return "rank " + std::to_string(comm.rank()) + ": the shard optimizer's buffer '" +
               buffer.name + "' is on " + buffer.params.device().str() +
               "; expected host memory (Device::cpu())";
    return "";
  });
}

}  // namespace
