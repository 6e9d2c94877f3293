// Chapter 11 — beyond lockstep: a data-parallel step that survives a
// failed replica (11.5).
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 11 --puzzle 11.5
// The contract is in chapters/11_beyond_lockstep/beyond_lockstep.h; the
// lesson (section 6) in chapters/11_beyond_lockstep/README.md.
//
// Tools you may use:
//   server_.next(seconds)               the next contribution, or std::nullopt after
//                                       `seconds` without one; ->client, ->key, ->payload
//   server_.reply(request, payload, version), server_.refuse(request, -1)
//   live_, log_, recovery_, detect_seconds_, timeout_seconds()
//   std::chrono::steady_clock::now(), std::chrono::duration<double>(b - a).count()
//   std::map<int, rpc::Request>         keeps replicas in ascending order
//   ops::accumulate(sum, x), ops::scale(x, factor)
//   client_.call(kContribute, step, 0, payload)
//                                       throws rpc::Timeout when no answer comes
//   trainer_.steps_done(), trainer_.sampler().batch(step, device), trainer_.count_step()
//   model.zero_grad(), model.forward(inputs, targets), model.backward()
//   trainer_.optimizer().clip_gradients(max_norm), .step(lr), config.schedule().at(step)
//   t.slice(offset, length), dst.copy_from(src), Tensor::empty(Shape{n}, DType::f64)
//   DTP_CHECK(condition, "message parts", value, ...)
#include "11_beyond_lockstep/beyond_lockstep.h"

namespace dtp::ch11 {

bool Coordinator::step(std::int64_t step) {
  // About 40 lines: collect contributions until every live replica has
  // sent one or detect_seconds_ have passed since the first; refuse what
  // does not belong to this step's live replicas; log the quorum and the
  // failed; then reply with the mean (or refuse all, under restart).
  (void)step;
  throw dtp::NotSolved("11.5 fault_tolerant_step");
}

bool FtReplica::step() {
  // About 30 lines: forward and backward of the next batch, contribute the
  // flat gradient, and on a mean: copy it into the gradients, clip, step,
  // count the step, note the quorum. A refusal or a timeout returns false.
  throw dtp::NotSolved("11.5 fault_tolerant_step");
}

}  // namespace dtp::ch11
