// Puzzles 11.1 and 11.2: a parameter server's serve loops and a worker's step.
//
// The server answers whoever asks first. A pull waits until the rounds it
// may see are applied; pushes are kept per round and worker; a round is
// applied once all its W x U pushes are in. With a staleness bound s a
// worker may pull while up to s rounds are still missing, so several
// rounds' pushes can be in flight at once.
#include <map>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "dtp/error.h"

namespace dtp::ch11 {
namespace {

// The pushes of one round: per worker, per unit, and each worker's version.
struct Round {
  std::vector<std::vector<Tensor>> gradients;  // [worker - 1][unit]
  std::vector<std::int64_t> versions;          // [worker - 1]
  std::int64_t pushes = 0;
};

Round empty_round(int workers, std::size_t units) {
  return {std::vector<std::vector<Tensor>>(static_cast<std::size_t>(workers),
                                           std::vector<Tensor>(units)),
          std::vector<std::int64_t>(static_cast<std::size_t>(workers), -1), 0};
}

}  // namespace

void ParameterServer::serve_synchronous() { serve_bounded(0); }

void ParameterServer::serve_bounded(int staleness) {
  DTP_CHECK(staleness >= 0, "serve_bounded: the staleness bound must be >= 0, got ", staleness);
  const int w = workers();
  const std::size_t units = model().units().size();
  std::map<std::int64_t, Round> rounds;  // by round number, not yet applied
  // The round of each (worker, unit)'s next push: its c-th push is round c.
  std::vector<std::vector<std::int64_t>> next_round(static_cast<std::size_t>(w),
                                                    std::vector<std::int64_t>(units, 1));
  std::vector<rpc::Request> waiting;  // pulls that may not see the current version yet
  int done = 0;
  auto may_answer = [&](const rpc::Request& pull) {
    return version() >= pull.version - 1 - staleness;
  };

  while (done < w) {
    const std::optional<rpc::Request> request = server().next(timeout_seconds());
    DTP_CHECK(request.has_value(), "parameter server: no request in ", timeout_seconds(),
              " s after version ", version(), " (", done, " of ", w, " workers done)");
    if (request->method == kDone) {
      ++done;
      server().reply(*request, Tensor(), version());
    } else if (request->method == kPull) {
      if (may_answer(*request))
        server().reply(*request, parameters(), version());
      else
        waiting.push_back(*request);
    } else {
      const std::size_t worker = static_cast<std::size_t>(request->client - 1);
      DTP_CHECK(request->key >= 0 && request->key < static_cast<std::int64_t>(units),
                "parameter server: worker ", request->client, " pushed unit ", request->key,
                "; the model has units 0..", units - 1);
      const std::size_t unit = static_cast<std::size_t>(request->key);
      const std::int64_t round = next_round[worker][unit]++;
      DTP_CHECK(request->version >= round - 1 - staleness && request->version <= round - 1,
                "parameter server: worker ", request->client, "'s push of unit ", unit,
                " for round ", round, " was computed on version ", request->version,
                "; with staleness ", staleness, " it must be from ", round - 1 - staleness, " to ",
                round - 1);
      auto found = rounds.find(round);
      if (found == rounds.end()) found = rounds.emplace(round, empty_round(w, units)).first;
      Round& r = found->second;
      r.gradients[worker][unit] = request->payload;
      r.versions[worker] = request->version;
      ++r.pushes;
      server().reply(*request, Tensor(), version());
      // Apply every complete round in order, then answer the pulls that may now see them.
      for (auto next = rounds.find(version() + 1);
           next != rounds.end() && next->second.pushes == w * static_cast<std::int64_t>(units);
           next = rounds.find(version() + 1)) {
        apply_round(next->first, next->second.gradients, next->second.versions);
        rounds.erase(next);
      }
      std::vector<rpc::Request> still;
      for (const rpc::Request& pull : waiting) {
        if (may_answer(pull))
          server().reply(pull, parameters(), version());
        else
          still.push_back(pull);
      }
      waiting.swap(still);
    }
  }
  DTP_CHECK(rounds.empty() && waiting.empty(), "parameter server: every worker is done, but ",
            rounds.size(), " round(s) were left unapplied and ", waiting.size(),
            " pull(s) unanswered");
}

double PsWorker::step() {
  const std::int64_t c = trainer().steps_done() + 1;
  const rpc::Response pulled = client().call(kPull, -1, c, Tensor());
  versions_.push_back(pulled.version);
  std::int64_t offset = 0;
  for (Unit* unit : trainer().model().units()) {
    unit->params().copy_from(pulled.payload.slice(offset, unit->numel()));
    offset += unit->numel();
  }
  const double loss = trainer().step().loss;
  for (Unit* unit : trainer().model().units())
    client().call(kPush, unit->index(), pulled.version, unit->grads().flatten());
  return loss;
}

}  // namespace dtp::ch11
