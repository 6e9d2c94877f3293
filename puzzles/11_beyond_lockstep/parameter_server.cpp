// Chapter 11 — beyond lockstep: a parameter server (11.1) and bounded
// staleness (11.2).
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 11
// to see which puzzles pass. The contract, with the protocol every request
// follows, is in chapters/11_beyond_lockstep/beyond_lockstep.h; the lesson
// is in chapters/11_beyond_lockstep/README.md.
//
// Tools you may use:
//   server().next(seconds)            the next request from any worker (std::nullopt
//                                     after seconds without one); ->method, ->client,
//                                     ->key, ->version, ->payload
//   server().reply(request, payload, version)
//                                     answer it (Tensor() for no payload)
//   parameters(), version(), workers(), model().units(), timeout_seconds()
//   apply_round(round, gradients, versions)
//                                     provided: averages round `round` and steps
//   client().call(method, key, version, payload)
//                                     a worker's request; returns {status, version, payload}
//   trainer().step(), trainer().steps_done(), trainer().model().units()
//   unit->params(), unit->grads(), unit->numel(), unit->index()
//   t.slice(offset, length), t.flatten(), dst.copy_from(src)
//   std::map<key, value>, std::vector
//   DTP_CHECK(condition, "message parts", value, ...)
//                                     throws dtp::Error with the message
#include "11_beyond_lockstep/beyond_lockstep.h"

namespace dtp::ch11 {

void ParameterServer::serve_synchronous() {
  // About 40 lines: loop until all W workers sent done; answer a pull of
  // step r when r - 1 rounds are applied (else keep it for later); collect
  // each round's W x U pushes; apply_round when all are in, then answer the
  // pulls that waited.
  throw dtp::NotSolved("11.1 parameter_server");
}

void ParameterServer::serve_bounded(int staleness) {
  // About 50 lines: serve_synchronous, with pulls answered once
  // version() >= c - 1 - staleness and the pushes of several rounds kept
  // apart (a map from round to its pushes); apply rounds strictly in order.
  (void)staleness;
  throw dtp::NotSolved("11.2 bounded_staleness");
}

double PsWorker::step() {
  // About 12 lines: pull, note its version (versions_.push_back), copy the
  // payload into every unit's parameters, trainer().step(), push every
  // unit's gradient with the pull's version.
  throw dtp::NotSolved("11.1 parameter_server");
}

}  // namespace dtp::ch11
