// Internal: which NCCL calls carry a rank's point-to-point messages, and when
// the host may wait for them. Pure bookkeeping, no CUDA: the nccl backend
// issues what it returns, and a CPU test plays it against a model of NCCL
// (tests/runtime/eager_sends_test.cpp) with rings, exchanges and sends to self.
//
// The problem. DTP's send() is eager: it returns at once, as on the thread and
// mpi backends, so "send right, then receive from the left" works on a ring.
// An NCCL send completes only when the peer posts the matching receive, and
// a rank's NCCL calls run one after another on its stream. Two rules follow:
//   1. a send is issued in the same NCCL group as this rank's next receive
//      (or collective), so that on a ring every rank's send and receive are in
//      flight together: calls in one group progress independently;
//   2. the host never waits for a group that holds a send the peer may post
//      its receive for only later. A receive therefore does not wait at all:
//      the message lands in stream order, before anything later on the
//      stream reads it; its header (size, dtype, tag, clock) is checked at
//      the next point where the host waits anyway (sync()).
// Each message is two NCCL sends to its destination, header then payload,
// and each receive posts header then payload: NCCL keeps calls to one peer
// in order, so the k-th header/payload pair meets the k-th receive.
// A message to the rank itself is the exception: its receive is on the same
// stream, so it is issued only in the group of the receive that takes it
// (rule 1 alone would put a second message to self in a group that can never
// finish), and never with a collective.
//
// The limit (said in chapter 01's lesson and in the timeout report): a
// collective waits for its ranks' agreement with the queued sends in its
// group, so a message sent before a collective must be received by its
// destination before that destination's next collective.
#pragma once

#include <cstddef>
#include <vector>

namespace dtp {

/// One NCCL call of a plan. `message` is the sender's id of the message for
/// sends (from queue()), the receive's own id for receives; -1 for the collective.
struct P2pCall {
  enum class Kind { send_header, send_payload, recv_header, recv_payload, collective };
  Kind kind;
  int peer = -1;
  int message = -1;
};

/// One NCCL group, and whether the host waits for it to finish before going on.
struct NcclGroupPlan {
  std::vector<P2pCall> calls;
  bool host_waits = false;
};

/// A rank's messages sent but not yet handed to NCCL, and the groups that
/// carry them (see the file comment for the rules).
class EagerSends {
 public:
  /// send(): remembers message @p id for @p dst; no NCCL call yet. A message
  /// to the rank itself names its communicator in @p self_channel (-1: a peer).
  void queue(int dst, int id, int self_channel = -1) { queued_.push_back({dst, id, self_channel}); }

  /// recv(): one group of the queued sends (to self: only the one this
  /// receive takes) and this receive; the host does not wait.
  NcclGroupPlan receive(int src, int id, int self_channel = -1) {
    NcclGroupPlan plan = take_queued(self_channel, self_channel >= 0);
    plan.calls.push_back({P2pCall::Kind::recv_header, src, id});
    plan.calls.push_back({P2pCall::Kind::recv_payload, src, id});
    return plan;
  }

  /// A collective (or its signature check, which the host reads): the queued
  /// sends then the collective, in one group the host waits for.
  NcclGroupPlan collective() {
    NcclGroupPlan plan = take_queued(-1, false);
    plan.calls.push_back({P2pCall::Kind::collective, -1, -1});
    plan.host_waits = true;
    return plan;
  }

  /// The queued sends alone, waited for: an isend's wait(). Messages to self
  /// go too (waiting for one before its receive is posted hangs, as it may on MPI).
  NcclGroupPlan flush() {
    NcclGroupPlan plan = take_queued(-1, false, true);
    plan.host_waits = true;
    return plan;
  }

  bool empty() const { return queued_.empty(); }

 private:
  struct Queued {
    int dst, id, self_channel;
  };
  // Every queued message to a peer; of those to self, the first on
  // @p self_channel when @p one_to_self, or all of them with @p all_to_self.
  NcclGroupPlan take_queued(int self_channel, bool one_to_self, bool all_to_self = false) {
    NcclGroupPlan plan;
    std::vector<Queued> kept;
    for (const Queued& q : queued_) {
      const bool to_self = q.self_channel >= 0;
      const bool take = !to_self || all_to_self || (one_to_self && q.self_channel == self_channel);
      if (!take) {
        kept.push_back(q);
        continue;
      }
      if (to_self && !all_to_self) one_to_self = false;
      plan.calls.push_back({P2pCall::Kind::send_header, q.dst, q.id});
      plan.calls.push_back({P2pCall::Kind::send_payload, q.dst, q.id});
    }
    queued_.swap(kept);
    return plan;
  }
  std::vector<Queued> queued_;
};

}  // namespace dtp
