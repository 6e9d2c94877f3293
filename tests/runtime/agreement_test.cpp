// check_ranks_agree: ranks started with different settings, or holding
// different initial parameters, fail with the rank and the setting named.
#include <gtest/gtest.h>

#include <string>

#include "dtp/agreement.h"
#include "dtp/dtp.h"
#include "support/harness.h"

namespace dtp {
namespace {

GPTConfig small_model(std::uint64_t seed) {
  GPTConfig model;
  model.vocab_size = 16;
  model.context = 4;
  model.d_model = 8;
  model.heads = 2;
  model.layers = 1;
  model.seed = seed;
  return model;
}

// Runs check_ranks_agree on 3 ranks where `tweak` changes rank 2's inputs;
// returns the error message ("" when it passed).
std::string agreement_error(const std::function<void(int rank, TrainConfig&, GPTConfig&)>& tweak) {
  try {
    testing::run_ranks(3, [&](Comm& comm) {
      TrainConfig config;
      GPTConfig model_config = small_model(5);
      tweak(comm.rank(), config, model_config);
      GPT model(model_config);
      check_ranks_agree(comm, run_settings(config), model);
    });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(RanksAgree, SameSettingsAndParametersPass) {
  EXPECT_EQ(agreement_error([](int, TrainConfig&, GPTConfig&) {}), "");
}

TEST(RanksAgree, ADifferentSeedNamesTheRankAndTheFlag) {
  const std::string message = agreement_error([](int rank, TrainConfig& config, GPTConfig&) {
    if (rank == 2) config.seed = 99;
  });
  EXPECT_NE(message.find("rank 2 has --seed 99 but rank 0 has --seed 1234"), std::string::npos)
      << "expected the rank, the flag and both values; got: " << message;
}

TEST(RanksAgree, ADifferentBatchNamesTheRankAndTheFlag) {
  const std::string message = agreement_error([](int rank, TrainConfig& config, GPTConfig&) {
    if (rank == 1) config.batch = 32;
  });
  EXPECT_NE(message.find("rank 1 has --batch 32 but rank 0 has --batch 16"), std::string::npos)
      << "expected the rank, the flag and both values; got: " << message;
}

TEST(RanksAgree, DifferentInitialParametersNameTheUnit) {
  const std::string message = agreement_error([](int rank, TrainConfig&, GPTConfig& model) {
    if (rank == 2) model.seed = 6;  // same settings, other weights
  });
  EXPECT_NE(message.find("rank 2 has initial parameters of unit 'embedding'"), std::string::npos)
      << "expected the rank and the first differing unit; got: " << message;
}

TEST(RanksAgree, SettingsCoverWhatAReplicaComputes) {
  const TrainConfig config;
  std::string flags;
  for (const RunSetting& s : run_settings(config)) flags += s.flag + " ";
  for (const char* flag : {"--seed", "--batch", "--seq", "--steps", "--lr", "--data", "--d-model",
                           "--layers", "--heads", "--optimizer", "--dtype"})
    EXPECT_NE(flags.find(std::string(flag) + " "), std::string::npos)
        << flag << " missing from: " << flags;
  EXPECT_EQ(flags.find("--json"), std::string::npos) << "--json is rank 0's alone: " << flags;
  EXPECT_EQ(flags.find("--trace"), std::string::npos) << "--trace is rank 0's alone: " << flags;
}

}  // namespace
}  // namespace dtp
