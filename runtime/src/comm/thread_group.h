// Internal: one communicator's shared state in the thread backend — the
// mailboxes of its point-to-point messages and the rendezvous where its
// library collectives meet. Guarded by the world's mutex.
//
// Collectives meet by sequence number, as in MPI and NCCL: the k-th
// collective a rank calls on a communicator meets the k-th of every other
// rank, whichever thread runs it. A rank's communication thread (running
// its non-blocking collectives) and its own thread (a blocking one) can therefore be
// in two collectives of one communicator at once without mixing them up.
#pragma once

#include <array>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "comm/thread_world.h"
#include "dtp/comm.h"

namespace dtp {

/// An eager message: a private copy of the payload and its arrival time.
struct Message {
  int source = 0;
  int tag = 0;
  std::int64_t sequence = 0;  // n-th message from source to this rank with this tag
  Tensor payload;
  double arrival = 0.0;
  std::shared_ptr<void> ready;  // GPU payloads: event recorded after the copy-in
};

/// One rank's side of a library collective, as it arrives at the rendezvous.
struct CollectiveCall {
  std::int64_t sequence = -1;  // this rank's n-th collective on the communicator
  std::string kind;
  DType dtype = DType::f32;
  std::int64_t count = -1;  // elements compared across ranks; -1 = not compared
  int root = -1;
  bool uses_op = false;
  ReduceOp op = ReduceOp::sum;
  double cost_bytes = 0;                  // what the alpha-beta model charges for
  Tensor first, second;                   // this rank's buffers; their meaning depends on kind
  int color = 0, key = 0;                 // split only
  std::vector<std::int64_t> send_counts;  // all_to_all_v only
  void* ready_event = nullptr;            // GPU: recorded when this rank's inputs are ready
  void* done_event = nullptr;  // GPU: recorded when this rank's share of the work is queued
  /// "all_reduce(100 x f32, sum)", for mismatch messages and reports.
  std::string signature() const;
};

class ThreadGroup {
 public:
  ThreadGroup(std::shared_ptr<ThreadWorld> world, std::vector<int> members);
  /// A group made by split() dies with its last Comm, often before launch()
  /// looks for undelivered messages: it hands its leftovers to the world.
  ~ThreadGroup();
  static std::shared_ptr<ThreadGroup> create(std::shared_ptr<ThreadWorld> world,
                                             std::vector<int> members);

  ThreadWorld& world() { return *world_; }
  int size() const { return static_cast<int>(members_.size()); }
  int global_rank(int group_rank) const { return members_[group_rank]; }
  /// Every member's world rank, in group order.
  const std::vector<int>& members() const { return members_; }
  /// The one-tier cost this group's collectives are charged
  /// (CostModel::for_group over its members).
  CostModel cost() const;
  /// "the world" or "group [0, 2, 4]".
  std::string name() const;

  // --- point to point (callers hold the world lock) ---
  /// Drops @p message in the destination's mailbox; returns its sequence number.
  std::int64_t post(int destination, Message message);
  /// The ticket of the next receive this rank posts for (source, tag).
  std::int64_t take_ticket(int destination, int source, int tag);
  /// True once the message with that ticket has arrived. Pure: wait predicates
  /// are also evaluated by other ranks looking for a deadlock.
  bool has_message(int destination, int source, int tag, std::int64_t ticket) const;
  /// The lowest source (@p source itself, or any when -1) whose next
  /// unclaimed message with @p tag has arrived; -1 when none. Pure.
  int next_ready_source(int destination, int source, int tag) const;
  /// Removes and returns the message with that ticket; it must have arrived.
  Message take_message(int destination, int source, int tag, std::int64_t ticket);
  /// True once the receiver has posted the receive that matches the message
  /// with this sequence number (a synchronous send may then return). Pure.
  bool receive_posted(int destination, int source, int tag, std::int64_t sequence) const;
  /// Lines describing messages nobody has received yet.
  std::string describe_undelivered() const;

  // --- collectives ---
  /// Blocks until every rank of the group has arrived at collective number
  /// call.sequence; the calls must agree (throws CommMismatch otherwise).
  /// Returns every rank's call, valid until depart().
  const std::vector<CollectiveCall>& arrive(int rank, CollectiveCall call);
  /// Blocks until every rank is done with the buffers of collective @p sequence.
  void depart(int rank, std::int64_t sequence);
  /// After a split's arrive(): this rank's new group and rank in it.
  std::pair<std::shared_ptr<ThreadGroup>, int> split_result(int rank, std::int64_t sequence) const;

  // --- GPU ---
  /// The events through which rank @p rank's stream meets its peers' in a
  /// collective: recorded when its inputs are ready and when its reads are
  /// queued. Slot 0 is the rank's own thread, slot 1 its communication
  /// thread (both may be inside a collective at once). Created by the rank on
  /// its own thread (its device current); they belong to the group, not to
  /// the rank's Comm, because a peer still waits on them after the
  /// collective's last rendezvous, when this rank may already have destroyed
  /// its Comm.
  struct StreamEvents {
    void* ready = nullptr;
    void* done = nullptr;
  };
  const StreamEvents& stream_events(int rank, int slot);

 private:
  /// Where the ranks meet for one collective.
  struct Rendezvous {
    std::vector<CollectiveCall> calls;  // by rank
    int arrived = 0;
    int departed = 0;
    bool complete = false;  // everyone arrived and the calls agree
    std::vector<std::pair<std::shared_ptr<ThreadGroup>, int>> split_result;
  };
  Rendezvous& rendezvous(std::int64_t sequence);
  void complete_arrival(Rendezvous& meeting);  // run by the last rank to arrive, lock held

  std::shared_ptr<ThreadWorld> world_;
  std::vector<int> members_;
  std::vector<std::deque<Message>> mailbox_;                   // per destination
  std::map<std::tuple<int, int, int>, std::int64_t> sent_;     // (dst, src, tag) -> count
  std::map<std::tuple<int, int, int>, std::int64_t> tickets_;  // (dst, src, tag) -> count

  // Collectives some rank has reached and not every rank has left, by sequence.
  std::map<std::int64_t, Rendezvous> rendezvous_;
  // GPU only: [rank][slot]; each rank fills its own entries.
  std::vector<std::array<StreamEvents, 2>> stream_events_;
};

}  // namespace dtp
