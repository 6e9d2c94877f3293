// Internal: the nccl backend — one GPU per rank, every operation on NCCL.
//
// Ranks are either processes started by mpiexec (the NCCL unique id travels
// over MPI) or threads of one process, one per visible GPU. NCCL work is
// asynchronous on the rank's stream; whenever the host must wait it polls
// the stream, so a wait can time out with a report (the NCCL communicator is
// aborted) or unwind when another rank failed.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/eager_sends.h"
#include "dtp/launch.h"
#include "nccl/nccl_check.h"

namespace dtp::nccl {

/// How ranks learn that another rank failed (shared by a launch's ranks).
class Control {
 public:
  virtual ~Control() = default;
  /// Throws CommAborted when another rank announced a failure.
  virtual void poll(int rank) = 0;
  virtual void announce(int rank, const std::string& message) = 0;
  /// True once any rank announced a failure.
  virtual bool failed() const = 0;
};

/// Ranks that are threads of one process: a flag and the first message.
class ThreadControl : public Control {
 public:
  void poll(int rank) override;
  void announce(int rank, const std::string& message) override;
  bool failed() const override { return failed_rank_ >= 0; }
  int failed_rank() const { return failed_rank_; }
  std::string message() const;

 private:
  std::atomic<int> failed_rank_{-1};
  mutable std::mutex mutex_;
  std::string message_;
};

class NcclComm : public CommBackend {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, Device device, const World& world,
           std::shared_ptr<Control> control, bool owns_comm);
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }
  std::string name() const override { return "nccl"; }
  CostModel cost_model() const override { return world_.cost; }
  /// Settles the receives first: their headers carry the senders' clocks.
  double clock() const override;
  void set_clock(double time) override { *clock_ = time; }
  void* native_handle() override { return &comm_; }

  void send(const Tensor& x, int dst, int tag) override;
  std::shared_ptr<RequestState> isend(const Tensor& x, int dst, int tag) override;
  void recv(Tensor& x, int src, int tag) override;
  std::shared_ptr<RequestState> irecv(Tensor& x, int src, int tag) override;

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

  /// End of launch: sends what is still queued, exchanges every rank's
  /// message counts and reports messages nobody received ("" when none).
  std::string finish();
  /// Waits (polling) until the rank's stream has done everything queued,
  /// then checks the headers of the receives it carried.
  void synchronize(const std::string& what);
  /// Hands every queued send to NCCL and waits until each is received.
  void complete_sends(const std::string& what) { issue(outbox_->plan.flush(), what); }

 private:
  struct Outgoing {
    Tensor payload;   // private copy for send(); the caller's tensor for isend()
    Tensor header;    // numel, dtype, tag, arrival time
    ncclComm_t comm;  // the communicator it was sent on (a split shares the outbox)
  };
  /// A message this rank sent itself: it never goes through NCCL.
  struct ToSelf {
    Tensor payload;  // private copy
    int tag;
    double clock;  // the sender's clock after the send
  };
  /// The rank's messages sent but not yet issued, shared by every
  /// communicator of the rank (split() included): they share the stream, so
  /// whichever of them waits first must issue them all.
  struct Outbox {
    EagerSends plan;
    std::map<int, Outgoing> messages;  // by message id
    int next_id = 0;
  };
  /// A receive whose data is on its way in stream order; its header is
  /// checked at the next host wait (settle_receives).
  struct Incoming {
    Tensor header;
    int src, tag;
    std::int64_t numel;
    DType dtype;
  };
  /// Issues @p plan as one NCCL group (@p collective for its collective call,
  /// @p incoming / @p payload for its receive) and waits if the plan says so.
  void issue(const NcclGroupPlan& plan, const std::string& what,
             const std::function<void()>& collective = nullptr, Incoming* incoming = nullptr,
             Tensor* payload = nullptr);
  /// Checks the headers of the receives issued so far (the stream is done with them).
  void settle_receives();
  /// Throws CommMismatch (announced) unless the message a receive @p want
  /// met holds @p numel x @p dtype with tag @p tag.
  void check_message(const Incoming& want, std::int64_t numel, DType dtype, int tag);
  /// recv() of a message this rank sent itself (send() queued a copy in to_self_).
  void recv_from_self(Tensor& x, int tag);
  double agree(const std::string& signature, const std::string& kind, double cost_bytes);
  void check_device(const char* op, const Tensor& x) const;
  /// The side stream, made to wait until the rank's stream reaches this
  /// point (the inputs of a non-blocking collective are complete there).
  cudaStream_t side_stream_after_inputs();
  /// Queues the NCCL calls of all_gather / reduce_scatter on @p stream.
  void enqueue_all_gather(const Tensor& shard, Tensor& full, cudaStream_t stream);
  void enqueue_reduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op, cudaStream_t stream);

  ncclComm_t comm_;
  int rank_, size_;
  Device device_;
  World world_;
  std::shared_ptr<Control> control_;
  bool owns_comm_;
  cudaStream_t stream_;
  std::shared_ptr<double> clock_ =
      std::make_shared<double>(0.0);        // one per rank, shared by its comms
  std::vector<long long> sent_, received_;  // messages per peer
  std::shared_ptr<Outbox> outbox_ = std::make_shared<Outbox>();
  std::deque<ToSelf> to_self_;          // messages to this rank on this communicator, oldest first
  std::vector<Incoming> unsettled_;     // receives whose headers are not checked yet
  cudaStream_t side_stream_ = nullptr;  // non-blocking collectives run here, beside compute
};

/// Runs fn on every rank of a world on the nccl backend (see launch()).
void launch(const World& world, const std::function<void(Comm&)>& fn);

}  // namespace dtp::nccl
