// Internal: the mpi backend's CommBackend. One process is one rank; host
// buffers go straight to MPI (Debian's Open MPI is not CUDA-aware).
#pragma once

#include <memory>
#include <vector>

#include "comm/backend.h"
#include "mpi/agreement.h"
#include "mpi/mpi_session.h"

namespace dtp::mpi {

class MpiComm : public CommBackend {
 public:
  MpiComm(std::shared_ptr<Session> session, std::shared_ptr<Traffic> traffic);
  ~MpiComm() override { stop_worker(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return session_->device; }
  std::string name() const override { return "mpi"; }
  /// The world's cost for this communicator's ranks (CostModel::for_group).
  CostModel cost_model() const override { return session_->config().cost.for_group(world_ranks_); }
  double clock() const override { return session_->clock; }
  void set_clock(double time) override { session_->clock = time; }
  void* native_handle() override { return &traffic_->comm; }

  void send(const Tensor& x, int dst, int tag) override;
  std::shared_ptr<RequestState> isend(const Tensor& x, int dst, int tag) override;
  void recv(Tensor& x, int src, int tag) override;
  int receive_within(Tensor& x, int src, int tag, double seconds) override;
  void wait_for_others_to_leave() override;
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

  Session& session() { return *session_; }
  Traffic& traffic() { return *traffic_; }

 private:
  struct Agreement {
    double root_numel = -1;  // the root's full.numel() for gather and scatter
  };
  /// Every rank checks that all called the same collective (else CommMismatch
  /// listing each rank's call) and the clocks meet and pay the cost; an
  /// all-reduce small enough is @p carried and done by the check itself.
  Agreement agree(const CallSignature& call, double cost_bytes, double root_numel = -1,
                  const CarriedReduction& carried = {});
  void send_header(const Tensor& x, int dst, int tag);
  /// Runs one nonblocking MPI collective to completion.
  void finish(MPI_Request request, const std::function<std::string()>& describe);

  std::shared_ptr<Session> session_;
  std::shared_ptr<Traffic> traffic_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;  // each member's rank in the session's world, in order
};

/// End of launch: finds messages nobody received (and receives them so every
/// send completes), then waits for this rank's sends. Returns a description
/// of what this rank never received ("" when all is well).
std::string collect_undelivered(Session& session);

}  // namespace dtp::mpi
