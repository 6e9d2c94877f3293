// Checkers for 11.3 local SGD. The checker simulates local SGD itself (W
// Trainers in one process, lockstep_checks.h) and compares every rank's
// parameters with it after every step, on 1 to 4 ranks:
// - the values: each rank's parameters after step s (within the chapter's
//   tolerance), the averages() count, and replicas bitwise equal on every
//   rank right after each average;
// - communication: one all_reduce per unit after a step that completes a
//   period of h, of the parameters' bytes, and nothing after other steps;
// - h = 1 with SGD without momentum is data parallelism: every step equals
//   single-device training on the global batch; h < 1 is refused.
// A wrong value is decoded by simulating the likely mistakes too (averaging
// every step, never, summing, averaging or resetting the optimizer state)
// and naming the one the rank's parameters match.
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep_checks.h"

namespace dtp::testing::ch11_local_sgd {

using namespace dtp::testing::ch11_lockstep;
using dtp::ch11::LocalSgd;

struct MistakeMeaning {
  Averaging mistake;
  const char* meaning;
};

const MistakeMeaning kMistakes[] = {
    {Averaging::every_step,
     "a run that averages after every step: average only after a step that completes a period "
     "of h (trainer.steps_done() % h == 0)"},
    {Averaging::never,
     "a run that has not averaged (never, or before a step instead of after it): after each "
     "step that completes a period of h, each unit's parameters become their mean over the "
     "ranks (all_reduce, ReduceOp::avg)"},
    {Averaging::summed,
     "a run that replaces the parameters by their sum over the ranks, W times the mean: "
     "all-reduce with ReduceOp::avg"},
    {Averaging::state_averaged,
     "a run that averages the optimizer's state (SGD's momentum) too: it stays each rank's own"},
    {Averaging::state_reset,
     "a run that resets the optimizer's state (SGD's momentum) at every average: it is kept "
     "across averages"},
};

// The right run and every mistake's, on one world.
struct Simulations {
  Trajectory expected;
  std::vector<Trajectory> mistakes;  // in kMistakes order
};

Simulations simulate(const TrainConfig& config, int world, int h) {
  Simulations sims{simulate_local_sgd(config, world, h), {}};
  for (const MistakeMeaning& m : kMistakes)
    sims.mistakes.push_back(simulate_local_sgd(config, world, h, m.mistake));
  return sims;
}

// Which checks a run makes (each test makes some).
struct Checks {
  bool values = false;         // parameters, averages(), replicas
  bool communication = false;  // calls and bytes per step
};

// Trains config.steps steps of local SGD with period @p h on this rank and
// checks every step against @p sims; "" or the first failure of each kind.
// Every rank runs the same collectives whatever it finds, so a failure on
// one rank never leaves the others waiting.
std::string run_local_sgd(Comm& comm, const TrainConfig& config, int h, const Simulations& sims,
                          const Checks& checks) {
  Trainer trainer(config, comm.rank(), comm.size());
  GPT& model = trainer.model();
  LocalSgd local(comm, trainer, h);
  const auto rank = static_cast<std::size_t>(comm.rank());
  const DType dtype = config.model.dtype;
  const Closeness within = training_tolerance(dtype);
  const std::string run = "local SGD on " + std::to_string(comm.size()) +
                          " rank(s), h = " + std::to_string(h) + ", " + dtype_name(dtype);
  std::string values_failure, count_failure, replicas_failure, communication_failure;
  for (std::int64_t s = 1; s <= config.steps; ++s) {
    const CommStats before = comm.stats();
    local.step();
    const StepComm c = comm_between(before, comm.stats());
    const bool averages = s % h == 0;
    std::string replicas;
    if (averages && checks.values) {
      std::vector<Replicated> params;
      for (Unit* unit : model.units()) params.push_back({"parameter", unit, unit->params()});
      replicas = check_replicas_bitwise(
          comm, params,
          "Right after an average every rank holds the same mean: all_reduce gives every rank "
          "the same bits.");
    }
    if (checks.communication && communication_failure.empty())
      communication_failure =
          check_step_communication(model, c, comm.rank(), s, h, "the unit's parameters",
                                   "the optimizer's state stays on its rank");
    if (!checks.values) continue;
    if (replicas_failure.empty() && !replicas.empty())
      replicas_failure = rank_step(comm.rank(), s) + ": the replicas differ:" + replicas;
    if (count_failure.empty() && local.averages() != s / h)
      count_failure = rank_step(comm.rank(), s) + ": averages() returned " +
                      std::to_string(local.averages()) + ", expected " + std::to_string(s / h) +
                      " (one per period of h = " + std::to_string(h) + ", " + period_steps(h) + ")";
    if (!values_failure.empty()) continue;
    const UnitValues got = parameters_of(model);
    const std::size_t at = static_cast<std::size_t>(s - 1);
    const std::string wrong =
        first_unit_differing("parameter", model, sims.expected[at][rank], got, within);
    if (wrong.empty()) continue;
    std::string decoded;
    for (std::size_t k = 0; k < sims.mistakes.size() && decoded.empty(); ++k)
      if (!alike(sims.mistakes[k][at][rank], sims.expected[at][rank], within) &&
          near(sims.mistakes[k][at][rank], got, mistake_closeness(dtype)))
        decoded = std::string("They match ") + kMistakes[k].meaning + ".";
    if (decoded.empty())
      decoded =
          "Each rank takes trainer.step() alone; after steps h, 2h, ... every unit's parameters "
          "become their mean over the ranks (all_reduce, ReduceOp::avg); the optimizer's state "
          "stays local.";
    values_failure = rank_step(comm.rank(), s) + (averages ? " (ends with an average)" : "") +
                     ": the parameters differ from the checker's simulation of " + run +
                     " (tolerance " + within.str() + "):" + wrong + "\n    " + decoded;
  }
  return joined(joined(values_failure, count_failure),
                joined(replicas_failure, communication_failure));
}

// "" when LocalSgd refuses h = 0 and h = -2 with a dtp::Error naming h.
std::string refuses_h_below_one(Comm& comm, Trainer& trainer) {
  std::string failure;
  for (int h : {0, -2}) {
    const std::string error = error_of([&] { LocalSgd local(comm, trainer, h); });
    if (error.find("h = " + std::to_string(h)) == std::string::npos)
      failure = joined(failure, "rank " + std::to_string(comm.rank()) +
                                    ": LocalSgd(comm, trainer, " + std::to_string(h) +
                                    ") must throw a dtp::Error naming h = " + std::to_string(h) +
                                    "; got: " + error);
  }
  return failure;
}

// Runs every (world, h) of the sweep: 7 steps, averages after steps h, 2h, ...
void expect_local_sgd(const Checks& checks) {
  const TrainConfig config = lockstep_config(7, "sgd");
  for (const auto& [world, h] : {std::pair{1, 2}, {2, 3}, {3, 2}, {4, 3}}) {
    // The communication checks need no simulation.
    const Simulations sims = checks.values ? simulate(config, world, h) : Simulations{};
    run_and_report("11.3 LocalSgd, h = " + std::to_string(h) + ", 7 steps", world,
                   [&](Comm& comm) { return run_local_sgd(comm, config, h, sims, checks); });
  }
}

TEST(Puzzle11_3_local_sgd, MatchesTheSimulationAfterEveryStep) {
  expect_local_sgd(Checks{.values = true});
}

TEST(Puzzle11_3_local_sgd, AllReducesOncePerUnitEveryHSteps) {
  expect_local_sgd(Checks{.communication = true});
}

// h = 1 is the smallest period: below it LocalSgd refuses, naming h; at it,
// with SGD without momentum, averaging the parameters after every step
// averages the ranks' updates, so local SGD is data parallelism.
TEST(Puzzle11_3_local_sgd, HOfOneWithPlainSgdIsDataParallelism) {
  TrainConfig config = lockstep_config(3, "sgd");
  config.momentum = 0;
  Trainer single(config);
  Trajectory expected;  // [step - 1][0]: the single-device parameters
  for (std::int64_t s = 1; s <= config.steps; ++s) {
    single.step();
    expected.push_back({parameters_of(single.model())});
  }
  for (int world = 1; world <= 4; ++world)
    run_and_report("11.3 LocalSgd, h = 1, SGD without momentum", world, [&](Comm& comm) {
      Trainer trainer(config, comm.rank(), comm.size());
      std::string refused = refuses_h_below_one(comm, trainer);
      LocalSgd local(comm, trainer, 1);
      const Closeness within = training_tolerance(config.model.dtype);
      for (std::int64_t s = 1; s <= config.steps; ++s) {
        local.step();
        const std::string wrong = first_unit_differing("parameter", trainer.model(),
                                                       expected[static_cast<std::size_t>(s - 1)][0],
                                                       parameters_of(trainer.model()), within);
        if (!wrong.empty())
          return joined(
              refused,
              rank_step(comm.rank(), s) +
                  ": with h = 1 and SGD without momentum, local SGD is data parallelism, but the "
                  "parameters differ from single-device training on the same global batch "
                  "(tolerance " +
                  within.str() + "):" + wrong + "\n    " +
                  scale_hint(expected[static_cast<std::size_t>(s - 1)][0],
                             parameters_of(trainer.model()), comm.size()) +
                  "The mean of the ranks' p - lr g_r is p - lr (mean of g_r): average "
                  "every unit's parameters after every step (all_reduce, ReduceOp::avg).");
      }
      return refused;
    });
}

}  // namespace dtp::testing::ch11_local_sgd
