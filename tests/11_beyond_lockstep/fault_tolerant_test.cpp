// Puzzle 11.5: a data-parallel step that survives a failed replica. Rank 0
// coordinates, ranks 1..3 are replicas; DTP_FAULT's kinds are injected at
// a planned step (fault::set_plan) and the provided run_fault_tolerant
// drives the run. After it, rank 0 holds the coordinator's log and the
// survivors' parameters (which the driver checked are the same bits). The
// checker holds them to:
// - detection: the faulted replica, and only it, is failed at the planned
//   step, within the detection bound; a replica slower than the bound is
//   failed too, one faster is not;
// - continue: the parameters equal the checker's serial replay of the
//   logged quorums (per step, the mean of the quorum's gradients on the
//   parameters of the step before);
// - restart: the run restarted from the last checkpoint before the
//   failure and ends with the parameters of the run without a fault;
// - and nothing hangs: every run ends within seconds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
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

namespace dtp::testing::ft {
namespace {

using ch11::FtOptions;
using ch11::FtResult;
using ch11::QuorumStep;
using ch11::Recovery;
using Values = std::vector<double>;
using ch11_lockstep::expect_none;
using ch11_lockstep::flat_parameters;
using ch11_lockstep::set_flat_parameters;

constexpr int kReplicas = 3;
constexpr double kDetect = 0.5;
constexpr double kSlack = 0.5;  // detection may overrun its bound by this much (scheduling)

// The checker's serial replay: per step, the mean (in replica order, times
// 1/|quorum|) of the quorum's gradients, each replica's on its slice of the
// step's batch at the parameters of the step before, then the optimizer's
// clip and step. @p quorums[s - 1] is step s's.
// How a replay divides each step's sum: by the quorum's size (the
// contract), or as two mistakes the checker names: by all W replicas, or by
// the replicas live before the step (the failed ones still counted).
enum class Divisor { quorum, all_replicas, live_before };

Values replay(const TrainConfig& config, const std::vector<std::vector<int>>& quorums,
              Divisor divisor = Divisor::quorum) {
  Trainer model(config);
  std::vector<std::unique_ptr<Trainer>> replica;
  for (int w = 1; w <= kReplicas; ++w)
    replica.push_back(std::make_unique<Trainer>(config, w - 1, kReplicas));
  const std::vector<Unit*> units = model.model().units();
  for (std::size_t s = 0; s < quorums.size(); ++s) {
    const Values theta = flat_parameters(model.model());
    for (Unit* unit : units) unit->grads().fill(0);
    for (int w : quorums[s]) {
      GPT& m = replica[static_cast<std::size_t>(w - 1)]->model();
      set_flat_parameters(m, theta);
      const Batch batch =
          replica[static_cast<std::size_t>(w - 1)]->sampler().batch(static_cast<std::int64_t>(s));
      m.zero_grad();
      m.forward(batch.inputs, batch.targets);
      m.backward();
      const std::vector<Unit*> mine = m.units();
      for (std::size_t u = 0; u < units.size(); ++u) {
        Tensor g = units[u]->grads();
        ops::accumulate(g, mine[u]->grads());
      }
    }
    for (Unit* unit : units) {
      Tensor g = unit->grads();
      const std::size_t live = s == 0 ? kReplicas : quorums[s - 1].size();
      const std::size_t n = divisor == Divisor::all_replicas  ? kReplicas
                            : divisor == Divisor::live_before ? live
                                                              : quorums[s].size();
      ops::scale(g, 1.0 / static_cast<double>(n));
    }
    model.optimizer().clip_gradients(config.grad_clip);
    model.optimizer().step(config.schedule().at(static_cast<std::int64_t>(s)));
  }
  return flat_parameters(model.model());
}

std::string ints(const std::vector<int>& v) {
  std::string out = "{";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "}";
}

// What one run must show. failed_at 0: nobody fails.
struct Expect {
  int failed = 0;
  std::int64_t failed_at = 0;
};

std::string first_difference(const Values& want, const Values& got, const std::string& what) {
  if (got.size() != want.size())
    return what + ": the survivors sent " + std::to_string(got.size()) + " parameters, expected " +
           std::to_string(want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i])
      return what + ": flat parameter " + std::to_string(i) + " is " + number(got[i]) +
             ", expected " + number(want[i]);
  return "";
}

// Runs the plan and checks it; "" when all holds (rank 0's process decides).
std::string run_and_check(const std::string& plan, Recovery recovery, const Expect& expect,
                          std::int64_t checkpoint_every = 0) {
  TrainConfig config = tiny_config(2 * kReplicas, 6);
  FtOptions options;
  options.recovery = recovery;
  options.detect_seconds = kDetect;
  options.replica_timeout_seconds = kDetect + 0.3;
  options.checkpoint_every = checkpoint_every;
  // One file per run that every rank can read: a process's under threads,
  // the mpiexec's (the processes' parent) under mpi.
  const bool threads = World::from_env(1).backend == Backend::thread;
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("dtp-ft-" + std::to_string(threads ? ::getpid() : ::getppid()) + ".ckpt"))
          .string();
  options.checkpoint_path = path;
  fault::set_plan(fault::parse_plan(plan));
  FtResult result;
  const auto start = std::chrono::steady_clock::now();
  try {
    result = ch11::run_fault_tolerant(kReplicas + 1, config, options);
  } catch (const std::exception& e) {
    fault::set_plan({});
    return std::string("the run threw: ") + e.what();
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fault::set_plan({});
  std::filesystem::remove(path);
  if (result.log.empty()) return "";  // not rank 0's process (mpi): it has nothing to check

  std::ostringstream out;
  // Detection: the faulted replica, at the planned step, within the bound; nobody else.
  std::vector<std::vector<int>> quorums;  // of the launch that finished
  bool planned_seen = false;
  for (const QuorumStep& q : result.log) {
    // Only the planned step fails, the first time it runs: under restart the
    // relaunch runs it again without the fault (a fault fires once).
    const bool fails = expect.failed != 0 && q.step == expect.failed_at && !planned_seen;
    planned_seen = planned_seen || (expect.failed != 0 && q.step == expect.failed_at);
    const std::vector<int> want = fails ? std::vector<int>{expect.failed} : std::vector<int>{};
    if (q.failed != want)
      out << "step " << q.step << ": the coordinator failed replicas " << ints(q.failed)
          << ", expected " << ints(want)
          << (q.failed.empty() ? ": the faulted replica was not noticed"
                               : ": a replica that answered in time was declared failed")
          << "\n";
    if (!q.failed.empty() && q.detection_seconds > kDetect + kSlack)
      out << "step " << q.step << ": detection took " << q.detection_seconds << " s, over the "
          << kDetect << " s bound (+" << kSlack << " s of slack)\n";
    if (q.restart != (fails && recovery == Recovery::restart))
      out << "step " << q.step
          << (q.restart ? " stopped the run, but under continue recovery the quorum goes on"
                        : " failed a replica and went on, but under restart recovery a failure "
                          "stops the run (refuse the quorum, return false)")
          << "\n";
    if (q.restart) continue;
    quorums.resize(static_cast<std::size_t>(q.step - 1));
    quorums.push_back(q.quorum);
  }
  if (!out.str().empty()) return out.str();
  // The parameters.
  if (recovery == Recovery::restart) {
    const std::int64_t saved =
        expect.failed ? (expect.failed_at - 1) / checkpoint_every * checkpoint_every : -1;
    if (expect.failed && result.restarted_from != std::vector<std::int64_t>{saved})
      out << "the run restarted from " << result.restarted_from.size()
          << " checkpoint(s); expected one restart from the checkpoint of step " << saved << "\n";
    std::vector<std::vector<int>> everyone(static_cast<std::size_t>(config.steps),
                                           std::vector<int>{1, 2, 3});
    const std::string d = first_difference(replay(config, everyone), result.parameters,
                                           "after the restart the parameters differ from the "
                                           "run without a fault");
    if (!d.empty()) out << d << "\n";
  } else {
    const std::string d = first_difference(
        replay(config, quorums), result.parameters,
        "after the last step (" + std::to_string(config.steps) +
            ") the survivors' parameters differ from the serial replay of the logged quorums");
    if (!d.empty()) {
      out << d;
      if (first_difference(replay(config, quorums, Divisor::all_replicas), result.parameters, "")
              .empty())
        out << ": they are the replay with every mean divided by all " << kReplicas
            << " replicas, not by the quorum's size";
      else if (first_difference(replay(config, quorums, Divisor::live_before), result.parameters,
                                "")
                   .empty())
        out << ": they are the replay with each mean divided by the replicas live before the "
               "step, the failed ones counted: divide by the quorum's size";
      out << "\n";
    }
  }
  if (expect.failed) {
    bool named = false;
    for (const std::string& e : result.events)
      named = named || e.find("step " + std::to_string(expect.failed_at) + ": replica " +
                              std::to_string(expect.failed)) != std::string::npos;
    if (!named)
      out << "no event names replica " << expect.failed << " at step " << expect.failed_at << "\n";
  }
  if (took > 30)
    out << "the run took " << took << " s: something waited far longer than its bound\n";
  return out.str();
}

TEST(Puzzle11_5_fault_tolerant_step, WithoutAFaultItIsDataParallelism) {
  if (!world_fits(kReplicas + 1)) GTEST_SKIP() << "needs 4 ranks";
  expect_none(run_and_check("", Recovery::continue_with_quorum, {}),
              "no fault, continue with the quorum");
}

TEST(Puzzle11_5_fault_tolerant_step, TheQuorumContinuesWithoutTheFailedReplica) {
  if (!world_fits(kReplicas + 1)) GTEST_SKIP() << "needs 4 ranks";
  struct Case {
    const char* plan;
    Expect expect;
  };
  for (const Case& c :
       {Case{"2:3:crash", {2, 3}}, Case{"3:2:hang", {3, 2}}, Case{"1:4:drop-message", {1, 4}},
        Case{"2:2:slow=0.1", {}}, Case{"2:2:slow=0.8", {2, 2}}}) {
    expect_none(run_and_check(c.plan, Recovery::continue_with_quorum, c.expect),
                std::string("DTP_FAULT ") + c.plan + ", continue with the quorum");
    if (HasFailure()) return;
  }
}

TEST(Puzzle11_5_fault_tolerant_step, ARestartResumesFromTheLastCheckpoint) {
  if (!world_fits(kReplicas + 1)) GTEST_SKIP() << "needs 4 ranks";
  struct Case {
    const char* plan;
    Expect expect;
  };
  for (const Case& c : {Case{"2:5:crash", {2, 5}}, Case{"1:3:drop-message", {1, 3}}}) {
    expect_none(run_and_check(c.plan, Recovery::restart, c.expect, 2),
                std::string("DTP_FAULT ") + c.plan + ", restart from a checkpoint every 2 steps");
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace dtp::testing::ft
