// Internal: the thread backend's CommBackend (see thread_backend.cpp).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/backend.h"

namespace dtp {

class ThreadGroup;
struct CollectiveCall;
struct Message;

class ThreadComm : public CommBackend {
 public:
  ThreadComm(std::shared_ptr<ThreadGroup> group, int rank);
  ~ThreadComm() override;

  int rank() const override { return rank_; }
  int size() const override;
  Device device() const override;
  std::string name() const override { return "thread"; }
  CostModel cost_model() const override;
  double clock() const override;
  void set_clock(double time) override;

  void send(const Tensor& x, int dst, int tag) override;
  std::shared_ptr<RequestState> isend(const Tensor& x, int dst, int tag) override;
  void recv(Tensor& x, int src, int tag) override;
  std::shared_ptr<RequestState> irecv(Tensor& x, int src, int tag) override;
  /// Waits for the message with this (source, tag) ticket and copies it into x.
  void receive(Tensor& x, int src, int tag, std::int64_t ticket);
  int receive_within(Tensor& x, int src, int tag, double seconds) override;
  void wait_for_others_to_leave() override;
  /// Synchronous sends: waits until @p dst has posted the receive matching
  /// message number @p sequence of this rank's (dst, tag) messages.
  void wait_until_received(const Tensor& x, int dst, int tag, std::int64_t sequence);

  void all_reduce(Tensor& x, ReduceOp op) override;
  std::shared_ptr<RequestState> iall_reduce(Tensor& x, ReduceOp op) override;
  std::shared_ptr<RequestState> iall_gather(const Tensor& shard, Tensor& full) override;
  std::shared_ptr<RequestState> ireduce_scatter(const Tensor& full, Tensor& shard,
                                                ReduceOp op) override;
  void broadcast(Tensor& x, int root) override;
  void reduce(Tensor& x, int root, ReduceOp op) override;
  void all_gather(const Tensor& shard, Tensor& full) override;
  void reduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op) override;
  void all_to_all(const Tensor& in, Tensor& out) override;
  void all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts, Tensor& out,
                    const std::vector<std::int64_t>& recv_counts, double cost_bytes) override;
  void gather(const Tensor& shard, Tensor& full, int root) override;
  void scatter(const Tensor& full, Tensor& shard, int root) override;
  void barrier() override;
  std::shared_ptr<CommBackend> split(int color, int key) override;

 private:
  int global_rank() const;
  /// Copies a message taken from the mailbox into @p x (world lock released):
  /// the clock meets its arrival; a size or dtype mismatch throws.
  void deliver(Message message, Tensor& x, int src, int tag);
  /// Copies @p x into dst's mailbox; returns the message's sequence number.
  std::int64_t post_copy(const Tensor& x, int dst, int tag);
  /// Runs one collective: meet, do this rank's share of the work, part.
  /// Blocking collectives take the next sequence number here unless call.sequence
  /// is set (the non-blocking ones took theirs when they were called).
  template <typename Work>
  void collective(CollectiveCall call, Work&& work);
  /// Queues @p run on this rank's communication thread as the collective
  /// with the next sequence number, taken now (in call order, however late
  /// the thread gets to it); it runs inside a trace span named @p span_name.
  std::shared_ptr<RequestState> in_background(const char* span_name,
                                              std::function<void(std::int64_t sequence)> run);
  // The collectives, as collective number @p sequence on this communicator.
  void all_reduce_as(std::int64_t sequence, Tensor& x, ReduceOp op);
  void all_gather_as(std::int64_t sequence, const Tensor& shard, Tensor& full);
  void reduce_scatter_as(std::int64_t sequence, const Tensor& full, Tensor& shard, ReduceOp op);

  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  // The sequence number of this rank's next collective on this communicator
  // (used on the rank's own thread only).
  std::int64_t next_collective_ = 0;
  // This rank's communication thread for this communicator in the world's
  // deadlock bookkeeping; -1 until the first non-blocking collective.
  int communication_thread_ = -1;
};

}  // namespace dtp
