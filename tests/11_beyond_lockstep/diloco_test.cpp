// Checkers for 11.4 DiLoCo. The checker simulates DiLoCo itself (W Trainers
// with their own AdamW in one process, theta and m per unit, the outer
// Nesterov step in the model's dtype, element by element in the contract's
// order) and compares every rank after every step, on 1 to 4 ranks:
// - the values: each rank's parameters, theta (global_parameters) and m
//   (outer_momentum) after step s (within the chapter's tolerance), the
//   outer_steps() count, and theta, m and the parameters bitwise equal on
//   every rank right after each outer step;
// - communication: one all_reduce per unit after a step that completes a
//   period of h, of the parameters' bytes (delta), and nothing after other
//   steps;
// - outer lr 1 and momentum 0 make DiLoCo local SGD with the same inner
//   optimizer (the checker's local-SGD simulation); h < 1 is refused.
// A wrong value is decoded by simulating the likely mistakes too (an outer
// step after every step, plain momentum, delta's sign, a summed delta,
// parameters not reset to theta, the inner optimizer's state reset) and
// naming the one the rank's state matches.
#include <cstdint>
#include <string>
#include <vector>

#include "lockstep_checks.h"

namespace dtp::testing::ch11_diloco {

using namespace dtp::testing::ch11_lockstep;
using dtp::ch11::DiLoCo;
using dtp::ch11::OuterConfig;

// How a DiLoCo simulation takes its outer step: right, or with one mistake.
enum class Outer {
  right,
  every_step,
  plain_momentum,
  delta_flipped,
  delta_summed,
  params_kept,
  inner_state_reset
};

struct MistakeMeaning {
  Outer mistake;
  const char* meaning;
};

const MistakeMeaning kMistakes[] = {
    {Outer::every_step,
     "a run that takes an outer step after every inner step: only after a step that completes "
     "a period of h (trainer.steps_done() % h == 0)"},
    {Outer::plain_momentum,
     "a run with plain momentum, theta = theta - lr * m: Nesterov's is theta = theta - lr * "
     "(delta + momentum * m)"},
    {Outer::delta_flipped,
     "a run with delta = params - theta, so theta moves away from where the ranks went: delta "
     "= theta - params"},
    {Outer::delta_summed,
     "a run that sums the ranks' deltas, W times their mean: all-reduce with ReduceOp::avg"},
    {Outer::params_kept,
     "a run that updates theta but leaves each rank's parameters where its inner steps took "
     "them: after the outer step, params = theta"},
    {Outer::inner_state_reset,
     "a run that resets the inner optimizer (AdamW's m, v and step count) at every outer step: "
     "its state is kept across outer steps"},
};

// What a DiLoCo run holds after each step.
struct DiLoCoTrajectory {
  Trajectory params;                 // [step - 1][rank]
  std::vector<UnitValues> theta;     // [step - 1], the same on every rank
  std::vector<UnitValues> momentum;  // [step - 1], the same on every rank
};

// DiLoCo simulated on @p world ranks with period @p h and @p outer, for
// config.steps steps. Each line of the outer step is computed per element
// in double and rounded to the model's dtype, in the contract's order.
DiLoCoTrajectory simulate_diloco(const TrainConfig& config, int world, int h,
                                 const OuterConfig& outer, Outer how = Outer::right) {
  const DType dtype = config.model.dtype;
  auto round = [dtype](double x) { return round_to(dtype, x); };
  std::vector<std::unique_ptr<Trainer>> trainers = simulated_ranks(config, world);
  UnitValues theta = parameters_of(trainers[0]->model());
  UnitValues m = theta;
  for (std::vector<double>& unit : m) unit.assign(unit.size(), 0.0);
  DiLoCoTrajectory run;
  for (std::int64_t s = 1; s <= config.steps; ++s) {
    for (auto& trainer : trainers) trainer->step();
    if (how == Outer::every_step || s % h == 0) {
      std::vector<UnitValues> deltas;
      for (auto& trainer : trainers) {
        UnitValues delta = parameters_of(trainer->model());
        for (std::size_t u = 0; u < delta.size(); ++u)
          for (std::size_t i = 0; i < delta[u].size(); ++i)
            delta[u][i] = how == Outer::delta_flipped ? round(delta[u][i] - theta[u][i])
                                                      : round(theta[u][i] - delta[u][i]);
        deltas.push_back(delta);
      }
      const UnitValues delta =
          rank_order_mean(deltas, dtype, how == Outer::delta_summed ? 1 : world);
      for (std::size_t u = 0; u < theta.size(); ++u)
        for (std::size_t i = 0; i < theta[u].size(); ++i) {
          m[u][i] = round(round(outer.momentum * m[u][i]) + delta[u][i]);
          const double step = how == Outer::plain_momentum
                                  ? m[u][i]
                                  : round(delta[u][i] + round(outer.momentum * m[u][i]));
          theta[u][i] = round(theta[u][i] - round(outer.lr * step));
        }
      for (auto& trainer : trainers) {
        if (how != Outer::params_kept) set_parameters(trainer->model(), theta);
        if (how == Outer::inner_state_reset) reset_optimizer(*trainer);
      }
    }
    run.params.emplace_back();
    for (auto& trainer : trainers) run.params.back().push_back(parameters_of(trainer->model()));
    run.theta.push_back(theta);
    run.momentum.push_back(m);
  }
  return run;
}

// The right run and every mistake's, on one world.
struct Simulations {
  DiLoCoTrajectory expected;
  std::vector<DiLoCoTrajectory> mistakes;  // in kMistakes order
};

Simulations simulate(const TrainConfig& config, int world, int h, const OuterConfig& outer) {
  Simulations sims{simulate_diloco(config, world, h, outer), {}};
  for (const MistakeMeaning& m : kMistakes)
    sims.mistakes.push_back(simulate_diloco(config, world, h, outer, m.mistake));
  return sims;
}

// This rank's theta and m, per unit.
UnitValues theta_of(const DiLoCo& diloco, std::size_t units) {
  UnitValues values;
  for (std::size_t u = 0; u < units; ++u)
    values.push_back(diloco.global_parameters(static_cast<int>(u)).to_vector());
  return values;
}

UnitValues momentum_of(const DiLoCo& diloco, std::size_t units) {
  UnitValues values;
  for (std::size_t u = 0; u < units; ++u)
    values.push_back(diloco.outer_momentum(static_cast<int>(u)).to_vector());
  return values;
}

// Which checks a run makes (each test makes some).
struct Checks {
  bool values = false;         // params, theta, m, outer_steps(), replicas
  bool communication = false;  // calls and bytes per step
};

// Trains config.steps inner steps of DiLoCo with period @p h on this rank
// and checks every step against @p sims; "" or the first failure of each
// kind. Every rank runs the same collectives whatever it finds, so a
// failure on one rank never leaves the others waiting.
std::string run_diloco(Comm& comm, const TrainConfig& config, int h, const OuterConfig& outer,
                       const Simulations& sims, const Checks& checks) {
  Trainer trainer(config, comm.rank(), comm.size());
  GPT& model = trainer.model();
  DiLoCo diloco(comm, trainer, h, outer);
  const std::vector<Unit*> units = model.units();
  const auto rank = static_cast<std::size_t>(comm.rank());
  const DType dtype = config.model.dtype;
  const Closeness within = training_tolerance(dtype);
  const std::string run = "DiLoCo on " + std::to_string(comm.size()) +
                          " rank(s), h = " + std::to_string(h) + ", outer lr " + number(outer.lr) +
                          ", momentum " + number(outer.momentum) + ", " + dtype_name(dtype);
  std::string values_failure, count_failure, replicas_failure, communication_failure;
  for (std::int64_t s = 1; s <= config.steps; ++s) {
    const CommStats before = comm.stats();
    diloco.step();
    const StepComm c = comm_between(before, comm.stats());
    const bool outer_step = s % h == 0;
    std::string replicas;
    if (outer_step && checks.values) {
      std::vector<Replicated> global;
      for (std::size_t u = 0; u < units.size(); ++u) {
        global.push_back({"theta", units[u], diloco.global_parameters(static_cast<int>(u))});
        global.push_back({"m", units[u], diloco.outer_momentum(static_cast<int>(u))});
        global.push_back({"parameter", units[u], units[u]->params()});
      }
      replicas = check_replicas_bitwise(
          comm, global,
          "After an outer step theta, m and the parameters are the same on every rank: each is "
          "computed from the all-reduced delta (the same bits everywhere) and the theta and m "
          "every rank shares.");
    }
    if (checks.communication && communication_failure.empty())
      communication_failure = check_step_communication(
          model, c, comm.rank(), s, h, "delta = theta - params",
          "every rank computes the same theta and m from the averaged delta, and the inner "
          "optimizer's state stays on its rank");
    if (!checks.values) continue;
    if (replicas_failure.empty() && !replicas.empty())
      replicas_failure = rank_step(comm.rank(), s) + ": the replicas differ:" + replicas;
    if (count_failure.empty() && diloco.outer_steps() != s / h)
      count_failure = rank_step(comm.rank(), s) + ": outer_steps() returned " +
                      std::to_string(diloco.outer_steps()) + ", expected " + std::to_string(s / h) +
                      " (one per period of h = " + std::to_string(h) + ", " + period_steps(h) + ")";
    if (!values_failure.empty()) continue;
    const std::size_t at = static_cast<std::size_t>(s - 1);
    const UnitValues params = parameters_of(model);
    const UnitValues theta = theta_of(diloco, units.size());
    const UnitValues m = momentum_of(diloco, units.size());
    const std::string wrong =
        first_unit_differing("parameter", model, sims.expected.params[at][rank], params, within) +
        first_unit_differing("theta (global_parameters)", model, sims.expected.theta[at], theta,
                             within) +
        first_unit_differing("m (outer_momentum)", model, sims.expected.momentum[at], m, within);
    if (wrong.empty()) continue;
    std::string decoded;
    const double closeness = mistake_closeness(dtype);
    for (std::size_t k = 0; k < sims.mistakes.size() && decoded.empty(); ++k) {
      const DiLoCoTrajectory& mistake = sims.mistakes[k];
      const bool changes_nothing_yet =
          alike(mistake.params[at][rank], sims.expected.params[at][rank], within) &&
          alike(mistake.theta[at], sims.expected.theta[at], within) &&
          alike(mistake.momentum[at], sims.expected.momentum[at], within);
      if (!changes_nothing_yet && near(mistake.params[at][rank], params, closeness) &&
          near(mistake.theta[at], theta, closeness) && near(mistake.momentum[at], m, closeness))
        decoded = std::string("They match ") + kMistakes[k].meaning + ".";
    }
    if (decoded.empty())
      decoded =
          "Each rank takes trainer.step() alone (AdamW, its state kept); after steps h, 2h, "
          "... per unit: delta = theta - params, all-reduced (avg); m = momentum * m + delta; "
          "theta = theta - lr * (delta + momentum * m); params = theta.";
    values_failure = rank_step(comm.rank(), s) + (outer_step ? " (ends with an outer step)" : "") +
                     ": the state differs from the checker's simulation of " + run +
                     " (tolerance " + within.str() + "):" + wrong + "\n    " + decoded;
  }
  return joined(joined(values_failure, count_failure),
                joined(replicas_failure, communication_failure));
}

// Runs every (world, h) of the sweep: 7 inner steps of AdamW, outer steps
// after steps h, 2h, ... with the paper's lr 0.7 and momentum 0.9.
void expect_diloco(const Checks& checks) {
  const TrainConfig config = lockstep_config(7, "adamw");
  const OuterConfig outer{0.7, 0.9};
  for (const auto& [world, h] : {std::pair{1, 2}, {2, 3}, {3, 2}, {4, 3}}) {
    // The communication checks need no simulation.
    const Simulations sims = checks.values ? simulate(config, world, h, outer) : Simulations{};
    run_and_report("11.4 DiLoCo, h = " + std::to_string(h) + ", 7 inner steps", world,
                   [&](Comm& comm) { return run_diloco(comm, config, h, outer, sims, checks); });
  }
}

TEST(Puzzle11_4_diloco, MatchesTheSimulationAfterEveryStep) {
  expect_diloco(Checks{.values = true});
}

TEST(Puzzle11_4_diloco, AllReducesOncePerUnitEveryHSteps) {
  expect_diloco(Checks{.communication = true});
}

// "" when DiLoCo refuses h = 0 and h = -2 with a dtp::Error naming h, and
// its accessors refuse a unit out of range, naming it.
std::string refuses_bad_arguments(Comm& comm, Trainer& trainer, const DiLoCo& diloco) {
  std::string failure;
  const std::string where = "rank " + std::to_string(comm.rank()) + ": ";
  for (int h : {0, -2}) {
    const std::string error = error_of([&] { DiLoCo bad(comm, trainer, h, OuterConfig{}); });
    if (error.find("h = " + std::to_string(h)) == std::string::npos)
      failure =
          joined(failure, where + "DiLoCo(comm, trainer, " + std::to_string(h) +
                              ", outer) must throw a dtp::Error naming h = " + std::to_string(h) +
                              "; got: " + error);
  }
  const int units = static_cast<int>(trainer.model().units().size());
  for (int unit : {-1, units}) {
    const std::string theta = error_of([&] { diloco.global_parameters(unit); });
    const std::string m = error_of([&] { diloco.outer_momentum(unit); });
    for (const std::string& error : {theta, m})
      if (error.find("unit " + std::to_string(unit)) == std::string::npos)
        failure = joined(failure, where + "global_parameters(" + std::to_string(unit) +
                                      ") and outer_momentum(" + std::to_string(unit) +
                                      ") must throw a dtp::Error naming unit " +
                                      std::to_string(unit) + "; got: " + error);
  }
  return failure;
}

// With outer lr 1 and momentum 0 the outer step is theta = theta - mean(theta
// - params) = mean(params): local SGD with DiLoCo's inner optimizer. Compared
// with the checker's local-SGD simulation (AdamW), after every step; h = 1
// and 2, the smallest periods (below them DiLoCo refuses, naming h).
TEST(Puzzle11_4_diloco, WithOuterLrOneAndNoMomentumIsLocalSgd) {
  const TrainConfig config = lockstep_config(4, "adamw");
  const OuterConfig outer{1.0, 0.0};
  for (const auto& [world, h] : {std::pair{2, 1}, {3, 2}}) {
    const Trajectory expected = simulate_local_sgd(config, world, h);
    run_and_report(
        "11.4 DiLoCo, outer lr 1, momentum 0, h = " + std::to_string(h), world, [&](Comm& comm) {
          Trainer trainer(config, comm.rank(), comm.size());
          DiLoCo diloco(comm, trainer, h, outer);
          const std::string refused = refuses_bad_arguments(comm, trainer, diloco);
          const Closeness within = training_tolerance(config.model.dtype);
          const auto rank = static_cast<std::size_t>(comm.rank());
          for (std::int64_t s = 1; s <= config.steps; ++s) {
            diloco.step();
            const std::string wrong = first_unit_differing(
                "parameter", trainer.model(), expected[static_cast<std::size_t>(s - 1)][rank],
                parameters_of(trainer.model()), within);
            if (!wrong.empty())
              return joined(refused,
                            rank_step(comm.rank(), s) +
                                ": with outer lr 1 and momentum 0, theta - 1 x mean(theta - "
                                "params) is mean(params), so DiLoCo is local SGD with its inner "
                                "AdamW; the parameters differ from the checker's simulation of "
                                "local SGD (h = " +
                                std::to_string(h) + ", tolerance " + within.str() + "):" + wrong);
          }
          return refused;
        });
  }
}

}  // namespace dtp::testing::ch11_diloco
