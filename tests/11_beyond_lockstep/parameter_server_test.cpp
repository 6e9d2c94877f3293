// Puzzles 11.1 and 11.2: the parameter server's serve loops and the
// worker's step. Rank 0 serves, ranks 1..W work. After the run rank 0
// holds the server's log (which version every applied gradient was
// computed on) and its parameters; the workers send it the versions their
// pulls returned. The checker then replays the run in one process from
// that log: per round, each worker's gradient computed on the logged
// version of the parameters, averaged and applied as the server's provided
// apply_round does. The server's parameters must equal the replay bit for
// bit. 11.1 and 11.2 with s = 0 must log every gradient as computed on the
// previous round (data parallelism exactly); 11.2 with s > 0, a worker
// made slow by fault injection so the others run ahead, must stay within
// the bound and use it.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "dtp/dtp.h"
#include "dtp/fault.h"
#include "lockstep_checks.h"
#include "support/harness.h"
#include "support/training.h"

namespace dtp::testing::ps {
namespace {

using ch11::Applied;
using Values = std::vector<double>;
using ch11_lockstep::expect_none;
using ch11_lockstep::flat_parameters;
using ch11_lockstep::set_flat_parameters;

constexpr int kVersionsTag = 77;  // workers -> rank 0, after the run
constexpr double kTimeout = 30;

// An optimizer that updates nothing: the replay's workers only compute gradients.
class NoUpdate : public Optimizer {
 public:
  explicit NoUpdate(GPT& model) : Optimizer(param_buffers(model)) {}
  void step(double) override {}
  std::string name() const override { return "none"; }
  double clip_gradients(double) override { return 0; }
};

// "unit 'block.0' parameter 'attn.qkv.weight' element 12" for flat index i.
std::string where(GPT& model, std::size_t i) {
  for (Unit* unit : model.units()) {
    const auto n = static_cast<std::size_t>(unit->numel());
    if (i < n) return "unit '" + unit->name() + "' " + locate(*unit, static_cast<std::int64_t>(i));
    i -= n;
  }
  return "element " + std::to_string(i);
}

// The checker's replay: the server's parameters after applying, round by
// round, the mean of the W workers' gradients, each computed on the
// version @p computed_on[r - 1][w - 1] of the parameters.
Values replay(const TrainConfig& config, int workers,
              const std::vector<std::vector<std::int64_t>>& computed_on) {
  Trainer server(config);
  std::vector<std::unique_ptr<Trainer>> worker;
  for (int w = 1; w <= workers; ++w) {
    worker.push_back(std::make_unique<Trainer>(config, w - 1, workers));
    worker.back()->set_optimizer(std::make_unique<NoUpdate>(worker.back()->model()));
  }
  std::vector<Values> versions = {flat_parameters(server.model())};
  const std::vector<Unit*> units = server.model().units();
  for (std::size_t r = 0; r < computed_on.size(); ++r) {
    for (Unit* unit : units) unit->grads().fill(0);
    for (int w = 0; w < workers; ++w) {
      Trainer& t = *worker[static_cast<std::size_t>(w)];
      set_flat_parameters(t.model(), versions[static_cast<std::size_t>(computed_on[r][w])]);
      t.step();  // its batch of round r + 1: a worker steps once per round
      const std::vector<Unit*> mine = t.model().units();
      for (std::size_t u = 0; u < units.size(); ++u) {
        Tensor g = units[u]->grads();
        ops::accumulate(g, mine[u]->grads());
      }
    }
    for (Unit* unit : units) {
      Tensor g = unit->grads();
      ops::scale(g, 1.0 / workers);
    }
    server.optimizer().clip_gradients(config.grad_clip);
    server.optimizer().step(config.schedule().at(static_cast<std::int64_t>(r)));
    versions.push_back(flat_parameters(server.model()));
  }
  return versions.back();
}

// What rank 0 found, "" when all holds.
std::string check_on_server(ch11::ParameterServer& ps, Comm& comm, int staleness,
                            std::int64_t* largest_staleness) {
  const TrainConfig& config = ps.config();
  const int w = ps.workers();
  const std::int64_t steps = config.steps;
  std::ostringstream out;
  // What each worker's pulls returned (received first: every worker sends them).
  std::vector<Values> pulled;
  for (int k = 1; k <= w; ++k) {
    Tensor got = Tensor::zeros({steps}, DType::f64);
    comm.recv(got, k, kVersionsTag);
    pulled.push_back(got.to_vector());
  }
  // Every (worker, round) once.
  std::vector<std::vector<std::int64_t>> computed_on(static_cast<std::size_t>(steps),
                                                     std::vector<std::int64_t>(w, -1));
  for (const Applied& a : ps.log()) {
    if (a.round < 1 || a.round > steps || a.worker < 1 || a.worker > w)
      return "the log names worker " + std::to_string(a.worker) + ", round " +
             std::to_string(a.round) + ": outside workers 1.." + std::to_string(w) +
             " and rounds 1.." + std::to_string(steps);
    std::int64_t& slot = computed_on[static_cast<std::size_t>(a.round - 1)][a.worker - 1];
    if (slot >= 0)
      return "worker " + std::to_string(a.worker) + "'s gradient of round " +
             std::to_string(a.round) + " was applied twice";
    slot = a.computed_on;
  }
  for (std::int64_t r = 0; r < steps; ++r)
    for (int k = 0; k < w; ++k)
      if (computed_on[static_cast<std::size_t>(r)][k] < 0)
        return "worker " + std::to_string(k + 1) + "'s gradient of round " + std::to_string(r + 1) +
               " was never applied (the log has " + std::to_string(ps.log().size()) +
               " entries, expected " + std::to_string(steps * w) + ")";
  // The workers' own record of their pulls agrees with the log.
  for (int k = 1; k <= w; ++k) {
    const Values& v = pulled[static_cast<std::size_t>(k - 1)];
    for (std::int64_t r = 0; r < steps; ++r)
      if (static_cast<std::int64_t>(v[static_cast<std::size_t>(r)]) !=
          computed_on[static_cast<std::size_t>(r)][k - 1])
        return "worker " + std::to_string(k) + "'s pull of step " + std::to_string(r + 1) +
               " returned version " + std::to_string(static_cast<std::int64_t>(v[r])) +
               " but the server logged its gradient as computed on version " +
               std::to_string(computed_on[static_cast<std::size_t>(r)][k - 1]) +
               ": the push must carry the pull's version";
  }
  // Each within the bound, in the order the server applied them.
  for (const Applied& a : ps.log()) {
    const std::int64_t age = a.round - 1 - a.computed_on;
    *largest_staleness = std::max(*largest_staleness, age);
    if (age < 0 || age > staleness)
      return "worker " + std::to_string(a.worker) + "'s gradient of round " +
             std::to_string(a.round) + " was computed on version " + std::to_string(a.computed_on) +
             ", " + std::to_string(age) + " round(s) old; the bound is " +
             std::to_string(staleness) +
             (age > staleness ? ": its pull of step " + std::to_string(a.round) +
                                    " was answered before version " +
                                    std::to_string(a.round - 1 - staleness) + " was applied"
                              : ": a version from the future");
  }
  // Requests: steps pulls, steps x U pushes and one done per worker.
  const std::int64_t units = static_cast<std::int64_t>(ps.model().units().size());
  const std::vector<std::int64_t> expected = {steps * w, steps * w * units, w};
  if (ps.server().received() != expected)
    out << "the server received " << ps.server().received()[0] << " pulls, "
        << ps.server().received()[1] << " pushes and " << ps.server().received()[2]
        << " dones; expected " << expected[0] << ", " << expected[1] << " (every unit of every "
        << "step) and " << expected[2] << "\n";
  // The parameters: the replay of the log, bit for bit.
  const Values want = replay(config, w, computed_on);
  const Values got = ps.parameters().to_vector();
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i]) {
      out << "after " << steps << " rounds the server's " << where(ps.model(), i) << " is "
          << number(got[i]) << "; the replay of its own log gives " << number(want[i])
          << " (each worker's gradient computed on its logged version, the mean applied in "
             "round order): a gradient stored under the wrong round or unit, or a worker that "
             "computed on parameters it did not pull\n";
      break;
    }
  return out.str();
}

// Runs a parameter server on W + 1 ranks: staleness -1 runs
// serve_synchronous, else serve_bounded(staleness). Returns rank 0's
// verdict ("" when all holds).
// @p ahead: how many rounds old the oldest applied gradient must be (the
// run used the bound as far as it goes).
std::string run(const TrainConfig& config, int workers, int staleness, const std::string& plan,
                std::int64_t ahead) {
  fault::set_plan(fault::parse_plan(plan));
  std::string verdict;
  std::int64_t largest = 0;
  try {
    run_ranks(workers + 1, [&](Comm& comm) {
      if (comm.rank() == 0) {
        ch11::ParameterServer ps(comm, config, kTimeout);
        if (staleness < 0)
          ps.serve_synchronous();
        else
          ps.serve_bounded(staleness);
        verdict = check_on_server(ps, comm, std::max(staleness, 0), &largest);
        if (verdict.empty() && largest != ahead)
          verdict =
              "the oldest gradient applied was " + std::to_string(largest) +
              " round(s) old; with " + plan +
              (ahead == 0 ? " a synchronous server answers no pull before its round"
                          : " (one worker asleep) the others must run " + std::to_string(ahead) +
                                " round(s) ahead: answer a pull as soon as the bound "
                                "allows");
        return;
      }
      ch11::PsWorker worker(comm, config, kTimeout);
      for (std::int64_t s = 1; s <= config.steps; ++s) {
        fault::at_step(comm, s);
        worker.step();
      }
      worker.finish();
      Values v(worker.versions().begin(), worker.versions().end());
      v.resize(static_cast<std::size_t>(config.steps), -1);
      comm.send(Tensor::from_values(v, DType::f64), 0, kVersionsTag);
    });
  } catch (const std::exception& e) {
    verdict = std::string("the run threw: ") + e.what();
  }
  fault::set_plan({});
  return verdict;
}

TrainConfig ps_config(int workers, std::int64_t steps) {
  TrainConfig config = tiny_config(2 * workers, steps);
  return config;
}

std::string label(int workers, int staleness) {
  return std::to_string(workers) + " worker(s), " +
         (staleness < 0 ? std::string("serve_synchronous")
                        : "serve_bounded(" + std::to_string(staleness) + ")");
}

TEST(Puzzle11_1_parameter_server, TrainsExactlyAsDataParallelism) {
  for (int workers = 1; workers <= 3 && world_fits(workers + 1); ++workers) {
    expect_none(run(ps_config(workers, 3), workers, -1, "", 0), label(workers, -1) + ", 3 rounds");
    if (HasFailure()) return;
  }
}

TEST(Puzzle11_1_parameter_server, ASlowWorkerHoldsTheRoundBack) {
  if (!world_fits(4)) GTEST_SKIP() << "needs 4 ranks";
  expect_none(run(ps_config(3, 4), 3, -1, "1:2:slow=0.2", 0),
              label(3, -1) + ", worker 1 slow at step 2");
}

TEST(Puzzle11_2_bounded_staleness, BoundZeroIsSynchronous) {
  for (int workers = 1; workers <= 3 && world_fits(workers + 1); ++workers) {
    expect_none(run(ps_config(workers, 3), workers, 0, "1:2:slow=0.1", 0),
                label(workers, 0) + ", 3 rounds, worker 1 slow at step 2");
    if (HasFailure()) return;
  }
}

TEST(Puzzle11_2_bounded_staleness, FastWorkersRunAheadWithinTheBound) {
  if (!world_fits(4)) GTEST_SKIP() << "needs 4 ranks";
  for (int staleness : {1, 2}) {
    expect_none(run(ps_config(3, 6), 3, staleness, "1:2:slow=0.3", staleness),
                label(3, staleness) + ", 6 rounds, worker 1 slow at step 2");
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace dtp::testing::ps
