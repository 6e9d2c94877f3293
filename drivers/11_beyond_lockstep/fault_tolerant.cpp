// A fault-tolerant data-parallel run's provided parts (beyond_lockstep.h):
// the coordinator's and replica's state, and the run itself, which
// relaunches from the last checkpoint when the coordinator stops it.
// Puzzle 11.5 writes Coordinator::step and FtReplica::step.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <utility>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "dtp/error.h"
#include "dtp/fault.h"
#include "dtp/launch.h"

namespace dtp::ch11 {
namespace {

constexpr int kStartTag = 79;       // rank 0 -> replicas: where a launch starts
constexpr int kParametersTag = 78;  // survivors -> rank 0: their parameters at the end

// How long the coordinator keeps refusing late contributions after its last
// step, so none is left unreceived: a replica's pending call ends within its
// timeout.
double drain_seconds(const FtOptions& o) { return o.replica_timeout_seconds + 0.1; }

std::vector<double> flat_parameters(GPT& model) {
  std::vector<double> flat;
  for (Unit* unit : model.units()) {
    const std::vector<double> p = unit->params().to_vector();
    flat.insert(flat.end(), p.begin(), p.end());
  }
  return flat;
}

// The lowest replica of a quorum mask.
int lowest(std::int64_t mask) {
  for (int w = 1; w < 63; ++w)
    if (mask & (std::int64_t{1} << w)) return w;
  return -1;
}

}  // namespace

const std::vector<std::string>& ft_methods() {
  static const std::vector<std::string> names = {"contribute"};
  return names;
}

Coordinator::Coordinator(Comm& comm, Recovery recovery, double detect_seconds)
    : comm_(comm),
      server_(comm, ft_methods(), DType::f64),
      recovery_(recovery),
      detect_seconds_(detect_seconds) {
  DTP_CHECK(comm.rank() == 0, "Coordinator: the coordinator is rank 0, not rank ", comm.rank());
  DTP_CHECK(comm.size() >= 2 && comm.size() <= 62, "Coordinator: needs 1 to 61 replicas, got ",
            comm.size() - 1);
  DTP_CHECK(detect_seconds > 0, "Coordinator: detect_seconds must be > 0, got ", detect_seconds);
  for (int w = 1; w < comm.size(); ++w) live_.push_back(w);
}

FtReplica::FtReplica(Comm& comm, const TrainConfig& config, double timeout_seconds)
    : comm_(comm),
      trainer_(config, comm.rank() - 1, comm.size() - 1),
      client_(comm, 0, ft_methods(), DType::f64, timeout_seconds) {
  DTP_CHECK(comm.rank() >= 1, "FtReplica: replicas are ranks 1..W; rank 0 coordinates");
  DTP_CHECK(config.model.dtype == DType::f64,
            "FtReplica: gradients travel as f64; train the chapter's runs in f64");
}

FtResult run_fault_tolerant(int world, const TrainConfig& config, const FtOptions& options) {
  DTP_CHECK(options.replica_timeout_seconds > options.detect_seconds,
            "run_fault_tolerant: a replica must wait longer (replica_timeout_seconds ",
            options.replica_timeout_seconds,
            ") than the coordinator takes to decide "
            "(detect_seconds ",
            options.detect_seconds, ")");
  DTP_CHECK(options.recovery != Recovery::restart || options.checkpoint_every == 0 ||
                !options.checkpoint_path.empty(),
            "run_fault_tolerant: checkpoint_every needs a checkpoint_path");
  FtResult result;
  std::int64_t start = 1;  // rank 0's: the first step of the next launch
  for (int attempt = 0;; ++attempt) {
    DTP_CHECK(attempt <= options.max_restarts, "run_fault_tolerant: the run needed more than ",
              options.max_restarts, " restarts; last: ",
              result.events.empty() ? std::string("none") : result.events.back());
    bool stopped = false;
    launch(World::from_env(world), [&](Comm& comm) {
      if (comm.rank() == 0) {
        for (int w = 1; w < comm.size(); ++w)
          comm.send(Tensor::from_values({static_cast<double>(start)}, DType::f64), w, kStartTag);
        Coordinator coordinator(comm, options.recovery, options.detect_seconds);
        std::int64_t s = start;
        for (; s <= config.steps; ++s)
          if (!coordinator.step(s)) break;
        for (const QuorumStep& q : coordinator.log()) {
          result.log.push_back(q);
          for (int w : q.failed)
            result.events.push_back("step " + std::to_string(q.step) + ": replica " +
                                    std::to_string(w) + " sent nothing within " +
                                    std::to_string(options.detect_seconds) + " s: failed");
        }
        // After a failure a slow replica's contribution may still come: refuse
        // what comes late, until nothing has come for a while.
        bool failures = false;
        for (const QuorumStep& q : coordinator.log()) failures = failures || !q.failed.empty();
        while (failures) {
          const std::optional<rpc::Request> late =
              coordinator.server().next(drain_seconds(options));
          if (!late) break;
          coordinator.server().refuse(*late, -1);
        }
        if (s <= config.steps) {
          stopped = true;
          const std::int64_t saved =
              options.checkpoint_every > 0
                  ? (s - 1) / options.checkpoint_every * options.checkpoint_every
                  : 0;
          result.restarted_from.push_back(saved);
          result.events.push_back("step " + std::to_string(s) + ": restart from " +
                                  (saved > 0 ? "the checkpoint of step " + std::to_string(saved)
                                             : std::string("the start")));
          start = saved + 1;
          return;
        }
        result.survivors = coordinator.live();
        result.parameters.clear();
        for (int w : coordinator.live()) {
          Tensor theirs = Tensor::zeros({0}, DType::f64);
          std::vector<double> got;
          Tensor count = Tensor::zeros({1}, DType::f64);
          comm.recv(count, w, kParametersTag);
          theirs = Tensor::zeros({static_cast<std::int64_t>(count.item(0))}, DType::f64);
          comm.recv(theirs, w, kParametersTag);
          got = theirs.to_vector();
          if (result.parameters.empty()) {
            result.parameters = got;
          } else if (got != result.parameters) {
            std::size_t i = 0;
            while (i < got.size() && i < result.parameters.size() && got[i] == result.parameters[i])
              ++i;
            throw Error("run_fault_tolerant: replica " + std::to_string(w) +
                        "'s parameters differ from replica " + std::to_string(result.survivors[0]) +
                        "'s at flat element " + std::to_string(i) +
                        ": replicas must apply the same mean and hold the same bits");
          }
        }
        return;
      }
      Tensor first = Tensor::zeros({1}, DType::f64);
      comm.recv(first, 0, kStartTag);
      const auto from = static_cast<std::int64_t>(first.item(0));
      FtReplica replica(comm, config, options.replica_timeout_seconds);
      if (from > 1) replica.trainer().resume(options.checkpoint_path);
      bool live = true;
      for (std::int64_t s = from; s <= config.steps && live; ++s) {
        fault::at_step(comm, s);
        live = replica.step();
        if (live && options.checkpoint_every > 0 && s % options.checkpoint_every == 0 &&
            lowest(replica.quorum()) == comm.rank())
          replica.trainer().save(options.checkpoint_path);
      }
      if (!live) return;
      const std::vector<double> mine = flat_parameters(replica.trainer().model());
      comm.send(Tensor::from_values({static_cast<double>(mine.size())}, DType::f64), 0,
                kParametersTag);
      comm.send(Tensor::from_values(mine, DType::f64), 0, kParametersTag);
    });
    // Every process learns rank 0's decision (under mpi only rank 0's knows
    // it): each rank writes its own slot, and this process reads one it ran.
    std::vector<std::vector<double>> decisions(static_cast<std::size_t>(world));
    const std::vector<double> mine = {stopped ? 1.0 : 0.0, static_cast<double>(start)};
    launch(World::from_env(world), [&](Comm& comm) {
      Tensor decision = Tensor::from_values(mine, DType::f64);
      comm.broadcast(decision, 0);
      decisions[static_cast<std::size_t>(comm.rank())] = decision.to_vector();
    });
    for (const std::vector<double>& d : decisions)
      if (!d.empty()) {
        stopped = d[0] != 0;
        start = static_cast<std::int64_t>(d[1]);
      }
    if (!stopped) break;
  }
  return result;
}

}  // namespace dtp::ch11
