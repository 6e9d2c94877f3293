/// @file agreement.h
/// @brief The check that every rank of a distributed run trains the same
/// replica: same settings, same initial parameters.
///
/// Under mpiexec every process parses its own command line. Processes started
/// with a different --seed or --batch would train diverging replicas and still
/// exit 0; a strategy calls check_ranks_agree() once, before the first step.
#pragma once

#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/nn.h"
#include "dtp/trainer.h"

namespace dtp {

/// The settings of @p config that decide what a replica computes (not where
/// it logs: --json and --trace are written by rank 0 only).
std::vector<RunSetting> run_settings(const TrainConfig& config);
/// run_settings(@p config) followed by a strategy's @p own settings.
std::vector<RunSetting> run_settings(const TrainConfig& config, const std::vector<RunSetting>& own);

/// Gathers every rank's @p settings and a fingerprint of each unit of
/// @p model's parameters (under expert parallelism, of what precedes the
/// experts: each rank holds others) and compares them with rank 0's. Every rank throws
/// the same dtp::Error naming the lowest differing rank, the first differing
/// setting and both values. Collective: every rank of @p comm calls it.
void check_ranks_agree(Comm& comm, const std::vector<RunSetting>& settings, const GPT& model);

}  // namespace dtp
