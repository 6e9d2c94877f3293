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
//      the next point where the host waits anyway (NcclComm::synchronize).
// Each message is two NCCL sends to its destination, header then payload,
// and each receive posts header then payload: NCCL keeps calls to one peer
// in order, so the k-th header/payload pair meets the k-th receive.
// Messages a rank sends itself never come here: NcclComm keeps them in a
// queue of its own and a receive copies them on the stream (through NCCL, a
// second message to self would sit in a group its receive can never join).
//
// The limit (said in chapter 01's lesson and in the timeout report): a
// collective waits for its ranks' agreement with the queued sends in its
// group, so a message sent before a collective must be received by its
// destination before that destination's next collective.
#pragma once

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
  /// send() to a peer: remembers message @p id for @p dst; no NCCL call yet.
  void queue(int dst, int id) { queued_.push_back({dst, id}); }

  /// recv() from a peer: one group of the queued sends and this receive; the
  /// host does not wait.
  NcclGroupPlan receive(int src, int id) {
    NcclGroupPlan plan = take_queued();
    plan.calls.push_back({P2pCall::Kind::recv_header, src, id});
    plan.calls.push_back({P2pCall::Kind::recv_payload, src, id});
    return plan;
  }

  /// A collective (or its signature check, which the host reads): the queued
  /// sends then the collective, in one group the host waits for.
  NcclGroupPlan collective() {
    NcclGroupPlan plan = take_queued();
    plan.calls.push_back({P2pCall::Kind::collective, -1, -1});
    plan.host_waits = true;
    return plan;
  }

  /// The queued sends alone, waited for: an isend's wait().
  NcclGroupPlan flush() {
    NcclGroupPlan plan = take_queued();
    plan.host_waits = true;
    return plan;
  }

 private:
  struct Queued {
    int dst, id;
  };
  // Every queued message, header then payload, in the order they were sent.
  NcclGroupPlan take_queued() {
    NcclGroupPlan plan;
    for (const Queued& q : queued_) {
      plan.calls.push_back({P2pCall::Kind::send_header, q.dst, q.id});
      plan.calls.push_back({P2pCall::Kind::send_payload, q.dst, q.id});
    }
    queued_.clear();
    return plan;
  }
  std::vector<Queued> queued_;
};

}  // namespace dtp
