// Internal: what a Comm backend implements. Comm (comm.cpp) validates
// arguments, counts statistics and records trace spans once for every backend,
// so a backend only moves data and keeps its clock.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtp/comm.h"

namespace dtp {

/// The part of a non-blocking operation a backend completes in wait().
class AsyncWorker;

class RequestState {
 public:
  virtual ~RequestState() = default;
  virtual void wait() = 0;
  bool completed = false;
};

/// One rank's end of a communicator.
class CommBackend {
 public:
  CommBackend();
  virtual ~CommBackend();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  virtual CostModel cost_model() const = 0;
  /// This rank's simulated time.
  virtual double clock() const = 0;
  virtual void set_clock(double time) = 0;
  /// See Comm::native_handle().
  virtual void* native_handle() { return nullptr; }

  virtual void send(const Tensor& x, int dst, int tag) = 0;
  virtual void recv(Tensor& x, int src, int tag) = 0;
  virtual std::shared_ptr<RequestState> irecv(Tensor& x, int src, int tag) = 0;
  /// The next message with @p tag from @p src (-1: any source) into @p x;
  /// returns its source. @p seconds < 0: wait as recv does (timeout, deadlock
  /// and abort reports); >= 0: give up after that long and return -1.
  /// Default: throws dtp::Error (the backend cannot receive so).
  virtual int receive_within(Tensor& x, int src, int tag, double seconds);
  /// Blocks until every other rank has returned from its function (see
  /// Comm::wait_for_others_to_leave). Default: throws dtp::Error.
  virtual void wait_for_others_to_leave();
  /// Set by Comm::lose_next_send(); the next send clears it and is dropped.
  bool lose_next_send = false;
  /// Default: an eager send, complete at once.
  virtual std::shared_ptr<RequestState> isend(const Tensor& x, int dst, int tag) {
    send(x, dst, tag);
    return nullptr;
  }

  virtual void all_reduce(Tensor& x, ReduceOp op) = 0;
  /// Starts all_reduce(x, op) and returns at once. Default: runs it on this
  /// rank's communication thread (see AsyncWorker), in call order.
  virtual std::shared_ptr<RequestState> iall_reduce(Tensor& x, ReduceOp op);
  virtual void broadcast(Tensor& x, int root) = 0;
  virtual void reduce(Tensor& x, int root, ReduceOp op) = 0;
  virtual void all_gather(const Tensor& shard, Tensor& full) = 0;
  virtual void reduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op) = 0;
  /// Starts all_gather(shard, full) and returns at once. Default: runs it on
  /// this rank's communication thread, like iall_reduce.
  virtual std::shared_ptr<RequestState> iall_gather(const Tensor& shard, Tensor& full);
  /// Starts reduce_scatter(full, shard, op) and returns at once. Default: the
  /// communication thread, like iall_reduce.
  virtual std::shared_ptr<RequestState> ireduce_scatter(const Tensor& full, Tensor& shard,
                                                        ReduceOp op);
  virtual void all_to_all(const Tensor& in, Tensor& out) = 0;
  /// Comm::all_to_all_v with the counts already checked across ranks;
  /// @p cost_bytes (the same on every rank) is what the clock charges for.
  virtual void all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                            Tensor& out, const std::vector<std::int64_t>& recv_counts,
                            double cost_bytes) = 0;
  virtual void gather(const Tensor& shard, Tensor& full, int root) = 0;
  virtual void scatter(const Tensor& full, Tensor& shard, int root) = 0;
  virtual void barrier() = 0;
  virtual std::shared_ptr<CommBackend> split(int color, int key) = 0;

  /// Counters kept by Comm on the backend's behalf.
  CommStats stats;
  /// Forgets when each link to a peer is next free (Comm::reset_stats).
  void reset_links() { link_free_.clear(); }

  /// An isend or irecv whose wait() has not returned, and the bytes it reads
  /// or writes: on mpi and nccl they are in use until then, so sending bytes
  /// a receive is writing, or receiving into bytes a send is reading, is an
  /// error on every backend (Comm checks it; the thread backend would hide
  /// it, copying each message at isend).
  struct PendingTransfer {
    std::weak_ptr<RequestState> request;
    const char* begin;
    const char* end;
    int peer, tag;
    bool sending;
  };
  std::vector<PendingTransfer> pending;

 protected:
  /// Charges a send of @p bytes to peer @p dst under @p cost, advancing
  /// @p clock (this rank's) unless the model has a link per peer, and
  /// returns the message's arrival time (see CostModel::link_per_peer).
  double charge_send(double& clock, int dst, std::int64_t bytes, const CostModel& cost);
  /// Queues @p op on this rank's communication thread, behind the ops queued
  /// before it; the request's wait() returns once it ran (and rethrows).
  std::shared_ptr<RequestState> run_in_background(std::function<void()> op);
  /// True while an op is queued or running on the communication thread.
  bool background_work_pending() const;
  /// Derived destructors call this first: the queued work uses their members.
  /// It lets the queued ops finish; one that failed and was never waited on
  /// is handed to the rank's launch (detail::note_unobserved_failure), which
  /// reports it: a failure must not vanish because nobody asked.
  void stop_worker();

 private:
  std::unique_ptr<AsyncWorker> worker_;
  std::vector<double> link_free_;  // per peer, when its link is next free (link_per_peer)
};

}  // namespace dtp
