// Checkers for 3.1 ZeRO-1 (optimizer state sharded) and 3.2 ZeRO-2
// (gradients sharded too): first-step gradient shards, K steps against
// single-device training with SGD-momentum and AdamW on 1-4 ranks (replicas
// bitwise identical after every step), memory per category against the
// lesson's formulas, communication per step, units smaller than the world,
// and bad input.
#include "zero_expectations.h"

namespace {

using namespace dtp;
using namespace dtp::testing;
using namespace dtp::testing::ch03;

TEST(Puzzle3_1_zero1, FirstStepGradientShardsAreTheSingleDeviceMean) {
  expect_first_step_shards(Stage::zero1);
}
TEST(Puzzle3_1_zero1, MatchesSingleDeviceSgdMomentum) {
  expect_matches_single(Stage::zero1, tiny_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_1_zero1, MatchesSingleDeviceAdamW) {
  expect_matches_single(Stage::zero1, adamw_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_1_zero1, MemoryPerRankMatchesTheFormulas) { expect_memory(Stage::zero1); }
TEST(Puzzle3_1_zero1, CommunicationPerStep) { expect_communication(Stage::zero1); }
TEST(Puzzle3_1_zero1, UnitsSmallerThanTheWorld) {
  expect_units_smaller_than_the_world(Stage::zero1);
}

TEST(Puzzle3_2_zero2, FirstStepGradientShardsAreTheSingleDeviceMean) {
  expect_first_step_shards(Stage::zero2);
}
TEST(Puzzle3_2_zero2, MatchesSingleDeviceSgdMomentum) {
  expect_matches_single(Stage::zero2, tiny_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_2_zero2, MatchesSingleDeviceAdamW) {
  expect_matches_single(Stage::zero2, adamw_config(), {1, 2, 3, 4});
}
TEST(Puzzle3_2_zero2, MemoryPerRankMatchesTheFormulas) { expect_memory(Stage::zero2); }
TEST(Puzzle3_2_zero2, CommunicationPerStep) { expect_communication(Stage::zero2); }
TEST(Puzzle3_2_zero2, UnitsSmallerThanTheWorld) {
  expect_units_smaller_than_the_world(Stage::zero2);
}
TEST(Puzzle3_2_zero2, FinishWithoutBackwardIsAClearError) {
  expect_finish_without_backward_is_an_error(Stage::zero2);
}

}  // namespace
