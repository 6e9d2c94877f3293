/// @file comm.h
/// @brief Comm: point-to-point messages and library collectives among ranks.
///
/// One interface, several backends (thread, mpi, nccl). Every backend keeps
/// CommStats and an alpha-beta clock: a send costs `alpha + beta * bytes` on
/// the sender's clock and the message carries its arrival time; a recv sets
/// the receiver's clock to max(own clock, arrival). With alpha=1, beta=0 the
/// clock counts latency rounds; with alpha=0, beta=1 it counts bytes on the
/// critical path.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtp/ops.h"
#include "dtp/tensor.h"

namespace dtp {

/// Costs of the alpha-beta model, in seconds (or any unit you like).
struct CostModel {
  double alpha = 0.0;  ///< cost of one message (latency)
  double beta = 0.0;   ///< cost of one byte (inverse bandwidth)
  /// false (one link per rank, like one network card): a rank's sends leave
  /// one after another, each advancing its clock by alpha + beta * bytes.
  /// true (a link to every peer, like a full-bisection switch): a send
  /// arrives alpha + beta * bytes after it was posted, or after the previous
  /// send to the same peer arrived, but the sender's clock stays put, so sends
  /// to different peers travel at once. Point-to-point messages only: library
  /// collectives are charged as collective_cost's algorithms either way.
  bool link_per_peer = false;
  /// alpha=1, beta=0: the clock counts rounds of messages on the critical path.
  static CostModel latency_rounds() { return {1.0, 0.0}; }
  /// alpha=0, beta=1: the clock counts bytes sent on the critical path.
  static CostModel bytes() { return {0.0, 1.0}; }
  /// This model with a link to every peer (see link_per_peer).
  CostModel with_link_per_peer() const { return {alpha, beta, true}; }

  /// Two tiers of links, as in a cluster of nodes: with ranks_per_node = G
  /// above 0, world ranks r and s share a node when r / G == s / G. A
  /// collective whose ranks all share one node, and a send between two
  /// ranks of one node, cost node_alpha + node_beta * bytes; everything else
  /// alpha + beta * bytes. 0: one tier, alpha and beta everywhere. The
  /// thread and mpi backends charge both tiers; nccl refuses a model with
  /// two (Error at launch).
  int ranks_per_node = 0;
  double node_alpha = 0.0;  ///< a message's cost inside a node
  double node_beta = 0.0;   ///< a byte's cost inside a node
  /// This model with nodes of @p ranks (>= 1) and their inside link.
  /// Throws dtp::Error for ranks below 1 or a negative or non-finite cost.
  CostModel with_nodes(int ranks, double inside_alpha, double inside_beta) const;
  /// The one-tier model that a communicator of world ranks @p world_ranks
  /// is charged: the node's alpha and beta when they all share one node,
  /// this model's otherwise (ranks_per_node 0 in both).
  CostModel for_group(const std::vector<int>& world_ranks) const;
};

/// Simulated time of one library collective of @p kind ("all_reduce",
/// "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v",
/// "broadcast", "reduce", "gather", "scatter", "barrier", "split") among
/// @p world_size ranks under the one-tier @p cost, as the bandwidth-optimal
/// algorithm of chapter 01 would take: rings for all-reduce, all-gather,
/// reduce-scatter and all-to-all, binomial trees for broadcast, reduce and
/// barrier, the root's link for gather and scatter. @p bytes is the whole
/// buffer (all_reduce's x, all_gather's full); for all_to_all_v, the
/// busiest rank's off-rank bytes. What every backend charges the clock, so
/// a planner that calls it predicts the executed clock exactly (pass
/// CostModel::for_group's model for a group inside a node).
double collective_cost(const std::string& kind, double bytes, int world_size, CostModel cost);

/// What one rank's Comm did since construction or reset_stats().
struct CommStats {
  std::int64_t messages_sent = 0;      ///< send and isend calls (library collectives not counted)
  std::int64_t bytes_sent = 0;         ///< payload bytes of those sends
  std::int64_t messages_received = 0;  ///< recv and irecv calls (irecv counts when posted)
  std::int64_t bytes_received = 0;     ///< payload bytes of those receives
  /// Library collective calls by kind ("all_reduce", "broadcast", ...).
  std::map<std::string, std::int64_t> collective_calls;
  /// Payload bytes of library collectives (each call's buffer size on this rank).
  std::int64_t collective_bytes = 0;
  /// This rank's simulated time (see CostModel).
  double clock = 0.0;
  /// Sum of collective_calls over all kinds.
  std::int64_t total_collective_calls() const;
};

class CommBackend;
class RequestState;

/// Handle to a non-blocking operation. wait() completes it (and rethrows its error).
class Request {
 public:
  Request() = default;
  /// Wraps a backend's pending operation; Comm::isend and Comm::irecv make these.
  explicit Request(std::shared_ptr<RequestState> state) : state_(std::move(state)) {}
  /// Blocks until the operation is complete; times out like recv.
  void wait();
  /// True once wait() has returned (or the operation needed no waiting).
  bool completed() const;
  /// False for a default-constructed Request; wait() on one returns at once.
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<RequestState> state_;
};

/// Waits for every request in order.
void wait_all(std::vector<Request>& requests);

/// A communicator: this rank's view of a group of ranks.
class Comm {
 public:
  /// Wraps one rank's backend (launch() does this); throws dtp::Error if it is null.
  explicit Comm(std::shared_ptr<CommBackend> backend);

  /// This rank's index in the communicator, in [0, size()).
  int rank() const;
  /// Number of ranks in the communicator.
  int size() const;
  /// Where this rank's tensors live: cpu, or its own GPU.
  Device device() const;
  /// "thread", "mpi" or "nccl".
  std::string backend_name() const;

  // --- point to point ----------------------------------------------------
  // Tags are in [0, kMaxTag). Messages from one source with one tag arrive in
  // the order they were sent.
  static constexpr int kMaxTag = 1 << 20;  ///< a tag outside [0, kMaxTag) throws dtp::Error
  /// Sends a copy of @p x to @p dst. Eager by default: returns at once, never
  /// blocks. Under SendMode::sync (DTP_SEND=sync) it returns only once @p dst
  /// has posted the matching receive, as MPI_Ssend; waiting too long is a
  /// timeout, and a send nobody can ever receive is reported as a deadlock.
  void send(const Tensor& x, int dst, int tag = 0);
  /// Receives the next message from @p src with @p tag into @p x. Blocks; the
  /// message must have exactly x's dtype and element count. Times out after
  /// DTP_TIMEOUT seconds with a report of what every rank is waiting for.
  void recv(Tensor& x, int src, int tag = 0);
  /// Starts sending @p x without copying it where the backend can (mpi, nccl):
  /// x must not change until the request's wait() returns. The thread backend
  /// copies anyway; a recv or irecv into those bytes before wait() is an
  /// error on every backend, as is an isend of bytes a pending irecv writes.
  /// Under SendMode::sync the request's wait() returns only once the
  /// matching receive has been posted.
  Request isend(const Tensor& x, int dst, int tag = 0);
  /// Posts a receive; @p x is written when the request's wait() returns.
  Request irecv(Tensor& x, int src, int tag = 0);
  /// Receives the next message with @p tag from any rank into @p x and
  /// returns the rank it came from: what a server that answers whoever asks
  /// first waits with. Each source's messages still arrive in the order it
  /// sent them; among sources whose messages are waiting the lowest rank
  /// goes first. Blocks and times out as recv. Thread and mpi backends only
  /// (nccl throws dtp::Error), and not under SendMode::sync. With @p x
  /// undefined (Tensor()) it takes the message whatever its size and dtype:
  /// x becomes a new tensor on comm.device() holding it (here and in
  /// recv_for and recv_any_for).
  int recv_any(Tensor& x, int tag = 0);
  /// recv() that gives up after @p seconds (>= 0): false when no message
  /// from @p src with @p tag arrived in time. Nothing is received then and
  /// nothing fails: a failure detector's wait. A later message is received
  /// by the next receive. Backends as recv_any.
  bool recv_for(Tensor& x, int src, int tag, double seconds);
  /// recv_any() that gives up after @p seconds (>= 0): the source, or -1.
  int recv_any_for(Tensor& x, int tag, double seconds);

  // --- library collectives (chapters 02+; chapter 01 rebuilds them) -------
  /// Every rank's x becomes the element-wise reduction over all ranks.
  void all_reduce(Tensor& x, ReduceOp op = ReduceOp::sum);
  /// Non-blocking all_reduce: returns at once; x holds the result when the
  /// request's wait() returns, and must not be touched before. Ranks must
  /// start their non-blocking collectives in the same order. On thread and
  /// mpi it runs on the rank's communication thread (or MPI's nonblocking
  /// collective), overlapping the rank's computation; on nccl, on a side stream.
  Request iall_reduce(Tensor& x, ReduceOp op = ReduceOp::sum);
  /// Every rank's x becomes root's x.
  void broadcast(Tensor& x, int root);
  /// Root's x becomes the reduction over all ranks; other ranks' x is unchanged.
  void reduce(Tensor& x, int root, ReduceOp op = ReduceOp::sum);
  /// full = the concatenation of every rank's shard; rank r's shard has
  /// chunk_range(full.numel(), size(), r).length elements.
  void all_gather(const Tensor& shard, Tensor& full);
  /// shard = chunk r (chunk_range) of the reduction of every rank's full.
  void reduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op = ReduceOp::sum);
  /// Non-blocking all_gather: same layout and checks, same statistics
  /// ("all_gather", full's bytes) and the same alpha-beta cost. Returns at
  /// once; @p shard must not change and @p full must not be read until the
  /// request's wait() returns. Non-blocking collectives, blocking ones
  /// included, meet in the order each rank calls them, so ranks must call
  /// them in the same order. On thread it runs on the rank's communication
  /// thread (a trace span "all_gather" on lane 1); on mpi it is MPI's
  /// nonblocking collective; on nccl, a side stream. FSDP prefetches the next
  /// unit's parameters with it while the current unit computes.
  Request iall_gather(const Tensor& shard, Tensor& full);
  /// Non-blocking reduce_scatter: same layout, checks, statistics
  /// ("reduce_scatter", full's bytes) and cost. Returns at once; @p full must
  /// not change and @p shard must not be read until the request's wait()
  /// returns. Ordering and where it runs as iall_gather. ZeRO-2/3 and FSDP
  /// reduce a unit's gradients with it while backward goes on.
  Request ireduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op = ReduceOp::sum);
  /// Chunk j of rank i's @p in lands as chunk i of rank j's @p out.
  /// in.numel() and out.numel() must be equal and divisible by size().
  void all_to_all(const Tensor& in, Tensor& out);
  /// All-to-all with a different count per peer (MPI_Alltoallv, packed): this
  /// rank sends send_counts[j] elements to rank j, taken from @p in in rank
  /// order (the block for rank 0, then rank 1, ...), and receives
  /// recv_counts[i] elements from rank i into @p out, in rank order. Counts
  /// are elements of the flattened tensors and may be 0; in.numel() must be
  /// the sum of send_counts and out.numel() that of recv_counts. Rank j's
  /// recv_counts[i] must equal rank i's send_counts[j]: every rank checks the
  /// whole count matrix first (one small all-gather, not counted in stats()
  /// and not charged to the clock) and a disagreement is a CommMismatch on
  /// every rank naming both ranks and both counts. Counted as "all_to_all_v"
  /// with this rank's in bytes; the clock charges (n - 1) latencies plus the
  /// busiest rank's off-rank bytes (the larger of what it sends and receives).
  /// Mixture-of-experts layers dispatch tokens to their experts with it.
  void all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts, Tensor& out,
                    const std::vector<std::int64_t>& recv_counts);
  /// Root's full = concatenation of every rank's shard (shapes as all_gather).
  /// Other ranks pass an undefined or any tensor as full; it is not touched.
  void gather(const Tensor& shard, Tensor& full, int root);
  /// Rank r's shard = chunk r of root's full (shapes as all_gather).
  void scatter(const Tensor& full, Tensor& shard, int root);
  /// Returns once every rank has called barrier().
  void barrier();
  /// A new communicator of the ranks that passed the same @p color, ordered by
  /// (key, old rank). Every rank must call it.
  Comm split(int color, int key);

  // --- fault injection (dtp/fault.h) -------------------------------------------
  /// Blocks until every other rank of this communicator has returned from
  /// its function: what an injected hang does. Thread and mpi backends.
  void wait_for_others_to_leave();
  /// The next send or isend of this rank is lost: counted in stats() as
  /// sent, never delivered (an injected drop-message).
  void lose_next_send();

  // --- measurement ---------------------------------------------------------
  /// This rank's counters and simulated clock.
  CommStats stats() const;
  /// Zeroes the counters and this rank's clock.
  void reset_stats();
  /// Adds @p time of local work (compute) to this rank's simulated clock, so
  /// the clock tells when each rank is busy, not only when it talks: a
  /// pipeline stage charges each forward and backward here. Throws
  /// dtp::Error when @p time is negative or not finite.
  void advance_clock(double time);
  /// The cost model of the world this communicator belongs to.
  CostModel cost_model() const;
  /// The backend's own communicator, for measuring against native
  /// collectives: an MPI_Comm* on mpi, a ncclComm_t* on nccl, nullptr on thread.
  void* native_handle() const;

 private:
  void check_peer(const char* op, const char* role, int peer) const;
  /// recv_any, recv_for and recv_any_for: checks, then the backend's
  /// receive_within (src -1: any; seconds < 0: no deadline of its own).
  int receive_within(const char* op, Tensor& x, int src, int tag, double seconds);
  void check_tag(const char* op, int tag) const;
  void check_reduce_op(const char* op_name, const Tensor& x, ReduceOp op) const;
  void check_shard(const char* op, const Tensor& shard, const Tensor& full, int rank) const;
  /// Throws when @p x overlaps the bytes of an isend (for a receive) or of
  /// an irecv (for a send) of this rank whose wait() has not returned.
  void check_not_in_flight(const char* op, const Tensor& x, int peer, int tag, bool sending);
  /// Remembers @p x's bytes as in use by @p state until its wait() returns.
  void keep_in_flight(const std::shared_ptr<RequestState>& state, const Tensor& x, int peer,
                      int tag, bool sending);
  void count_collective(const char* kind, const Tensor& buffer);
  std::shared_ptr<CommBackend> backend_;
};

/// One number reduced over @p comm's ranks with @p op (a loss, a sum of
/// squares): all_reduce of a one-element f64 tensor on the communicator's
/// device, since NCCL moves device memory only.
double all_reduce_value(Comm& comm, double value, ReduceOp op);

}  // namespace dtp
