// The nccl backend's eager sends, proven on the CPU: the plans of
// comm/eager_sends.h (the very code the backend issues) are played against a
// model of NCCL with 2-8 ranks, on the patterns the chapters use. No GPU here,
// so the model stands in for NCCL; what it assumes is written below.
// Messages a rank sends itself never reach NCCL (NcclComm copies them on the
// stream), so the programs here send only to peers; a naive protocol, which
// waits for its own sends before receiving, is shown to deadlock on one.
//
// The model of NCCL:
// - each rank's calls run on its one stream, group after group in the order
//   they were issued; every call of the group at the head is in flight, and
//   the group leaves the stream when all its calls are done;
// - the k-th send from s to d meets the k-th receive on d from s, once both
//   are in flight and the (k-1)-th pair is done, and they must be the same
//   size (NCCL hangs otherwise; the model reports it);
// - a collective is done when every rank has its k-th collective in flight.
// The hosts: a rank runs its program one call at a time (send, recv, a
// collective, then the end of the launch) and stops while it waits for a
// group it must wait for. A collective is two groups, as in the backend: its
// signature check, waited for (the host reads the votes), then the
// collective itself, not waited for. The end of the launch is one group,
// waited for (the message counts). A run ends when nothing
// can move; every rank must have finished with an empty stream.
#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/eager_sends.h"

namespace dtp {
namespace {

constexpr long kHeaderBytes = 32;

struct Action {
  enum class Kind { send, recv, collective, wait_sends } kind;
  int peer = -1;
  long bytes = 0;
};
Action send_to(int dst, long bytes) { return {Action::Kind::send, dst, bytes}; }
Action recv_from(int src, long bytes) { return {Action::Kind::recv, src, bytes}; }
Action collective() { return {Action::Kind::collective}; }
Action wait_sends() { return {Action::Kind::wait_sends}; }  // an isend's wait()

// A call on a model stream: a send or receive of `bytes` on the channel
// src -> dst with its position k there, or the k-th collective.
struct ModelCall {
  P2pCall::Kind kind;
  int src = -1, dst = -1;
  long bytes = 0;
  int k = 0;
  bool done = false;
};
struct ModelGroup {
  std::vector<ModelCall> calls;
};

// How a rank turns its program into NCCL groups: the backend's plan, or (to
// show the model catches a deadlock) the protocol the backend had before.
struct Protocol {
  // Returns the groups to issue for one action and whether the host then
  // waits for the last of them.
  virtual std::vector<NcclGroupPlan> plan(const Action& action, int id) = 0;
  virtual NcclGroupPlan finish() = 0;
  virtual ~Protocol() = default;
};

NcclGroupPlan the_collective() {
  NcclGroupPlan g;
  g.calls.push_back({P2pCall::Kind::collective});
  return g;
}

struct BackendProtocol : Protocol {
  EagerSends sends;
  std::vector<NcclGroupPlan> plan(const Action& a, int id) override {
    switch (a.kind) {
      case Action::Kind::send:
        sends.queue(a.peer, id);
        return {};
      case Action::Kind::recv:
        return {sends.receive(a.peer, id)};
      case Action::Kind::collective:
        return {sends.collective(), the_collective()};
      case Action::Kind::wait_sends:
        return {sends.flush()};
    }
    return {};
  }
  NcclGroupPlan finish() override {
    return sends.collective();
  }  // NcclComm::finish: counts exchanged with the sends
};

// A naive protocol: a receive sends the queued messages in one group with
// its header receive and waits for that group, then receives the payload.
struct NaiveProtocol : Protocol {
  std::vector<std::pair<int, int>> queued;  // dst, id
  NcclGroupPlan take() {
    NcclGroupPlan g;
    for (auto [dst, id] : queued) {
      g.calls.push_back({P2pCall::Kind::send_header, dst, id});
      g.calls.push_back({P2pCall::Kind::send_payload, dst, id});
    }
    queued.clear();
    return g;
  }
  std::vector<NcclGroupPlan> plan(const Action& a, int id) override {
    if (a.kind == Action::Kind::send) {
      queued.push_back({a.peer, id});
      return {};
    }
    NcclGroupPlan g = take();
    g.host_waits = true;
    if (a.kind == Action::Kind::collective) {
      g.calls.push_back({P2pCall::Kind::collective});
      return {g, the_collective()};
    }
    g.calls.push_back({P2pCall::Kind::recv_header, a.peer, id});
    NcclGroupPlan payload;
    payload.calls.push_back({P2pCall::Kind::recv_payload, a.peer, id});
    return {g, payload};
  }
  NcclGroupPlan finish() override {
    NcclGroupPlan g = take();
    g.host_waits = true;
    g.calls.push_back({P2pCall::Kind::collective});
    return g;
  }
};

using Program = std::vector<Action>;

class Model {
 public:
  Model(std::vector<Program> programs, const std::function<std::unique_ptr<Protocol>()>& make)
      : programs_(std::move(programs)), n_(static_cast<int>(programs_.size())) {
    for (int r = 0; r < n_; ++r) {
      Rank rank;
      rank.protocol = make();
      ranks_.push_back(std::move(rank));
    }
  }

  // "" when every rank finished with an empty stream; else what is stuck.
  std::string run() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < n_; ++r) moved |= host_step(r);
      moved |= nccl_step();
      if (!error_.empty()) return error_;
    }
    std::ostringstream stuck;
    for (int r = 0; r < n_; ++r) {
      const Rank& rank = ranks_[r];
      if (rank.finished && rank.stream.empty()) continue;
      stuck << "rank " << r << " stuck at action " << rank.next << " of " << programs_[r].size()
            << (rank.waiting ? ", its host waiting" : "") << ", " << rank.stream.size()
            << " group(s) on its stream";
      if (!rank.stream.empty()) {
        stuck << ", head:";
        for (const ModelCall& c : rank.stream.front().calls)
          if (!c.done) stuck << " " << name(c);
      }
      stuck << "; ";
    }
    return stuck.str();
  }

 private:
  struct Rank {
    std::unique_ptr<Protocol> protocol;
    std::size_t next = 0;
    bool waiting = false;   // the host waits until its stream is empty
    bool finished = false;  // the end of the launch has been issued
    std::deque<ModelGroup> stream;
    std::map<int, long> payload_bytes;  // message id -> bytes (sends and receives)
    int next_id = 0;
  };

  static std::string name(const ModelCall& c) {
    switch (c.kind) {
      case P2pCall::Kind::send_header:
        return "header " + std::to_string(c.src) + "->" + std::to_string(c.dst);
      case P2pCall::Kind::send_payload:
        return "payload " + std::to_string(c.src) + "->" + std::to_string(c.dst);
      case P2pCall::Kind::recv_header:
        return "recv header " + std::to_string(c.dst) + "<-" + std::to_string(c.src);
      case P2pCall::Kind::recv_payload:
        return "recv payload " + std::to_string(c.dst) + "<-" + std::to_string(c.src);
      case P2pCall::Kind::collective:
        return "collective #" + std::to_string(c.k);
    }
    return "?";
  }

  void issue(int r, const NcclGroupPlan& plan) {
    Rank& rank = ranks_[r];
    ModelGroup group;
    for (const P2pCall& call : plan.calls) {
      ModelCall c{call.kind};
      switch (call.kind) {
        case P2pCall::Kind::send_header:
        case P2pCall::Kind::send_payload:
          c.src = r, c.dst = call.peer;
          c.bytes = call.kind == P2pCall::Kind::send_header ? kHeaderBytes
                                                            : rank.payload_bytes.at(call.message);
          c.k = sends_[{c.src, c.dst}]++;
          break;
        case P2pCall::Kind::recv_header:
        case P2pCall::Kind::recv_payload:
          c.src = call.peer, c.dst = r;
          c.bytes = call.kind == P2pCall::Kind::recv_header ? kHeaderBytes
                                                            : rank.payload_bytes.at(call.message);
          c.k = recvs_[{c.src, c.dst}]++;
          break;
        case P2pCall::Kind::collective:
          c.k = collectives_[r]++;
          break;
      }
      group.calls.push_back(c);
    }
    if (!group.calls.empty()) rank.stream.push_back(group);
    if (plan.host_waits && !rank.stream.empty()) rank.waiting = true;
  }

  bool host_step(int r) {
    Rank& rank = ranks_[r];
    if (rank.waiting) {
      if (!rank.stream.empty()) return false;
      rank.waiting = false;
    }
    if (rank.finished) return false;
    if (rank.next == programs_[r].size()) {
      issue(r, rank.protocol->finish());
      rank.finished = true;
      return true;
    }
    const Action& action = programs_[r][rank.next++];
    const int id = rank.next_id++;
    if (action.kind == Action::Kind::send || action.kind == Action::Kind::recv)
      rank.payload_bytes[id] = action.bytes;
    for (const NcclGroupPlan& plan : rank.protocol->plan(action, id)) issue(r, plan);
    return true;
  }

  bool in_flight(int r, const ModelCall* call) {
    if (ranks_[r].stream.empty()) return false;
    for (const ModelCall& c : ranks_[r].stream.front().calls)
      if (&c == call) return true;
    return false;
  }

  // Every call of a head group whose partner is in flight completes.
  bool nccl_step() {
    bool moved = false;
    // Point to point: the next undone pair of each channel.
    for (int s = 0; s < n_; ++s) {
      if (ranks_[s].stream.empty()) continue;
      for (ModelCall& send : ranks_[s].stream.front().calls) {
        if (send.done ||
            (send.kind != P2pCall::Kind::send_header && send.kind != P2pCall::Kind::send_payload))
          continue;
        if (done_pairs_[{send.src, send.dst}] != send.k) continue;  // an earlier message first
        Rank& dst = ranks_[send.dst];
        if (dst.stream.empty()) continue;
        for (ModelCall& recv : dst.stream.front().calls) {
          const bool is_recv =
              recv.kind == P2pCall::Kind::recv_header || recv.kind == P2pCall::Kind::recv_payload;
          if (recv.done || !is_recv || recv.src != send.src || recv.k != send.k) continue;
          if (recv.bytes != send.bytes) {
            error_ = "size mismatch (NCCL would hang): " + name(send) + " of " +
                     std::to_string(send.bytes) + " bytes met " + name(recv) + " of " +
                     std::to_string(recv.bytes);
            return false;
          }
          send.done = recv.done = true;
          done_pairs_[{send.src, send.dst}] += 1;
          moved = true;
        }
      }
    }
    // Collectives: every rank's head holds its k-th.
    for (int k = 0;; ++k) {
      std::vector<ModelCall*> members;
      for (int r = 0; r < n_; ++r) {
        if (ranks_[r].stream.empty()) break;
        for (ModelCall& c : ranks_[r].stream.front().calls)
          if (c.kind == P2pCall::Kind::collective && !c.done && c.k == k) members.push_back(&c);
      }
      if (static_cast<int>(members.size()) == n_) {
        for (ModelCall* c : members) c->done = true;
        moved = true;
      }
      if (k > 64) break;
    }
    for (Rank& rank : ranks_) {
      while (!rank.stream.empty()) {
        bool all = true;
        for (const ModelCall& c : rank.stream.front().calls) all &= c.done;
        if (!all) break;
        rank.stream.pop_front();
        moved = true;
      }
    }
    return moved;
  }

  std::vector<Program> programs_;
  int n_;
  std::vector<Rank> ranks_;
  std::map<std::pair<int, int>, int> sends_, recvs_, done_pairs_;
  std::map<int, int> collectives_;
  std::string error_;
};

std::string run_backend(std::vector<Program> programs) {
  return Model(std::move(programs), [] { return std::make_unique<BackendProtocol>(); }).run();
}
std::string run_naive(std::vector<Program> programs) {
  return Model(std::move(programs), [] { return std::make_unique<NaiveProtocol>(); }).run();
}

// The size of message `round` from `src`: every pair of sizes differs, so a
// message matched with the wrong receive shows as a size mismatch.
long size_of(int src, int round) { return 1000 + 64 * src + 8 * round; }

// Ring all-reduce's pattern: every rank sends right, then receives from the left, `rounds` times.
std::vector<Program> ring(int n, int rounds) {
  std::vector<Program> programs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < rounds; ++k) {
      programs[r].push_back(send_to((r + 1) % n, size_of(r, k)));
      programs[r].push_back(recv_from((r - 1 + n) % n, size_of((r - 1 + n) % n, k)));
    }
  return programs;
}

// Pairwise all-to-all: in round k, send to r+k and receive from r-k.
std::vector<Program> pairwise(int n) {
  std::vector<Program> programs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int k = 1; k < n; ++k) {
      programs[r].push_back(send_to((r + k) % n, size_of(r, k)));
      programs[r].push_back(recv_from((r - k + n) % n, size_of((r - k + n) % n, k)));
    }
  return programs;
}

TEST(EagerSendsOnNccl, RingsOfTwoToEightRanksFinish) {
  for (int n = 2; n <= 8; ++n)
    EXPECT_EQ(run_backend(ring(n, 2 * (n - 1))), "") << "ring of " << n << " ranks";
}

TEST(EagerSendsOnNccl, PairwiseExchangesOfTwoToEightRanksFinish) {
  for (int n = 2; n <= 8; ++n)
    EXPECT_EQ(run_backend(pairwise(n)), "") << "pairwise exchange on " << n << " ranks";
}

TEST(EagerSendsOnNccl, TheLessonsIrecvIsendExchangeFinishes) {
  // irecv(left); isend(right); incoming.wait(); outgoing.wait(): on nccl the
  // receive is issued at its wait(), the isend's wait() sends what is queued.
  for (int n = 2; n <= 8; ++n) {
    std::vector<Program> programs(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      programs[r] = {send_to((r + 1) % n, size_of(r, 0)),
                     recv_from((r - 1 + n) % n, size_of((r - 1 + n) % n, 0)), wait_sends()};
    EXPECT_EQ(run_backend(programs), "") << "irecv/isend ring of " << n << " ranks";
  }
}

TEST(EagerSendsOnNccl, SeveralMessagesToOnePeerArriveInOrder) {
  const std::vector<Program> programs = {
      {send_to(1, size_of(0, 0)), send_to(1, size_of(0, 1)), recv_from(1, size_of(1, 0))},
      {recv_from(0, size_of(0, 0)), recv_from(0, size_of(0, 1)), send_to(0, size_of(1, 0))}};
  EXPECT_EQ(run_backend(programs), "");
}

TEST(EagerSendsOnNccl, PipelineForwardsAndBackwardsThenACollectiveFinish) {
  // All forwards then all backwards over 3 micro-batches, then the loss all-reduce.
  for (int n = 2; n <= 8; ++n) {
    std::vector<Program> programs(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (int m = 0; m < 3; ++m) {
        if (r > 0) programs[r].push_back(recv_from(r - 1, size_of(r - 1, m)));
        if (r < n - 1) programs[r].push_back(send_to(r + 1, size_of(r, m)));
      }
      for (int m = 0; m < 3; ++m) {
        if (r < n - 1) programs[r].push_back(recv_from(r + 1, size_of(r + 1, m)));
        if (r > 0) programs[r].push_back(send_to(r - 1, size_of(r, m)));
      }
      programs[r].push_back(collective());
    }
    EXPECT_EQ(run_backend(programs), "") << "pipeline of " << n << " stages";
  }
}

TEST(EagerSendsOnNccl, AReceiveBeforeACollectiveFinishes) {
  // Rank 0 sends, then both enter a collective; rank 1 receives before it.
  const std::vector<Program> programs = {{send_to(1, 100), collective()},
                                         {recv_from(0, 100), collective()}};
  EXPECT_EQ(run_backend(programs), "");
}

TEST(EagerSendsOnNccl, TheStatedLimitAMessageReceivedAfterTheReceiversNextCollectiveHangs) {
  // The lesson's limit: rank 1 receives only after a collective that rank 0
  // entered with the message still queued. Rank 0 waits for its group (the
  // send and the collective's signature check); rank 1 leaves the check and
  // queues the collective itself, which rank 0 never reaches.
  const std::vector<Program> programs = {{send_to(1, 100), collective(), collective()},
                                         {collective(), recv_from(0, 100), collective()}};
  EXPECT_NE(run_backend(programs), "");
}

TEST(EagerSendsOnNccl, TheModelCatchesTheNaiveProtocolsDeadlockOnARing) {
  // The naive protocol: each rank waits for a group holding its payload
  // send, which the peer can receive only after its own identical wait.
  for (int n = 2; n <= 4; ++n) {
    const std::string stuck = run_naive(ring(n, 1));
    EXPECT_NE(stuck, "") << "ring of " << n;
    EXPECT_NE(stuck.find("host waiting"), std::string::npos) << stuck;
  }
  // And a send to self was never matched in its group.
  EXPECT_NE(run_naive({{send_to(0, 100), recv_from(0, 100)}}), "");
}

TEST(EagerSendsOnNccl, TheModelCatchesAReceiveOfTheWrongSize) {
  const std::string stuck = run_backend({{send_to(1, 100)}, {recv_from(0, 200)}});
  EXPECT_NE(stuck.find("size mismatch"), std::string::npos) << stuck;
}

}  // namespace
}  // namespace dtp
