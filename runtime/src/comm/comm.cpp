// Comm: the checks, counters and trace spans every backend shares.
#include "dtp/comm.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "dtp/launch.h"

#include "comm/async_worker.h"
#include "comm/backend.h"
#include "comm/rank_context.h"
#include "dtp/error.h"
#include "dtp/trace.h"

namespace dtp {

std::int64_t CommStats::total_collective_calls() const {
  std::int64_t total = 0;
  for (const auto& [kind, calls] : collective_calls) total += calls;
  return total;
}

void Request::wait() {
  if (!state_ || state_->completed) return;
  // A span on the waiting thread: time blocked on communication is visible in
  // the trace (and a DDP that waits during backward is caught by its checker).
  trace::Scope span("wait", "comm");
  state_->wait();
  state_->completed = true;
}

bool Request::completed() const { return !state_ || state_->completed; }

double all_reduce_value(Comm& comm, double value, ReduceOp op) {
  Tensor x = Tensor::from_values({value}, DType::f64).to(comm.device());
  comm.all_reduce(x, op);
  return x.item(0);
}

void wait_all(std::vector<Request>& requests) {
  for (Request& request : requests) request.wait();
}

double collective_cost(const std::string& kind, double bytes, int n, CostModel cost) {
  if (n <= 1) return 0.0;
  const double a = cost.alpha, b = cost.beta;
  const double log_rounds = std::ceil(std::log2(static_cast<double>(n)));
  const double share = static_cast<double>(n - 1) / n;
  if (kind == "all_reduce") return 2 * (n - 1) * a + 2 * share * bytes * b;
  if (kind == "broadcast" || kind == "reduce") return log_rounds * (a + bytes * b);
  if (kind == "all_to_all_v") return (n - 1) * a + bytes * b;
  if (kind == "all_gather" || kind == "reduce_scatter" || kind == "all_to_all" ||
      kind == "gather" || kind == "scatter")
    return (n - 1) * a + share * bytes * b;
  return log_rounds * a;  // barrier, split: a tree of empty messages
}

CostModel CostModel::with_nodes(int ranks, double inside_alpha, double inside_beta) const {
  DTP_CHECK(ranks >= 1, "CostModel::with_nodes: ranks per node must be at least 1, got ", ranks);
  DTP_CHECK(std::isfinite(inside_alpha) && inside_alpha >= 0 && std::isfinite(inside_beta) &&
                inside_beta >= 0,
            "CostModel::with_nodes: the inside link's alpha and beta must be finite and >= 0, "
            "got ",
            inside_alpha, " and ", inside_beta);
  CostModel tiered = *this;
  tiered.ranks_per_node = ranks;
  tiered.node_alpha = inside_alpha;
  tiered.node_beta = inside_beta;
  return tiered;
}

CostModel CostModel::for_group(const std::vector<int>& world_ranks) const {
  CostModel one{alpha, beta, link_per_peer};
  if (ranks_per_node <= 0 || world_ranks.empty()) return one;
  const int node = world_ranks.front() / ranks_per_node;
  for (int r : world_ranks)
    if (r / ranks_per_node != node) return one;
  return {node_alpha, node_beta, link_per_peer};
}

double CommBackend::charge_send(double& clock, int dst, std::int64_t bytes, const CostModel& cost) {
  const double cost_of_message = cost.alpha + cost.beta * static_cast<double>(bytes);
  if (!cost.link_per_peer) {
    clock += cost_of_message;
    return clock;
  }
  if (link_free_.size() <= static_cast<std::size_t>(dst))
    link_free_.resize(static_cast<std::size_t>(dst) + 1, 0.0);
  double& link = link_free_[static_cast<std::size_t>(dst)];
  link = std::max(clock, link) + cost_of_message;
  return link;
}

CommBackend::CommBackend() = default;
CommBackend::~CommBackend() = default;

std::shared_ptr<RequestState> CommBackend::run_in_background(std::function<void()> op) {
  if (!worker_) worker_ = std::make_unique<AsyncWorker>(current_rank());
  return worker_->submit(std::move(op));
}

bool CommBackend::background_work_pending() const { return worker_ && worker_->busy(); }

std::shared_ptr<RequestState> CommBackend::iall_reduce(Tensor& x, ReduceOp op) {
  Tensor target = x;  // a handle: the queued op keeps the storage alive
  return run_in_background([this, target, op]() mutable {
    trace::Scope span("all_reduce", "comm");
    all_reduce(target, op);
  });
}

std::shared_ptr<RequestState> CommBackend::iall_gather(const Tensor& shard, Tensor& full) {
  Tensor input = shard, output = full;  // handles: the queued op keeps both alive
  return run_in_background([this, input, output]() mutable {
    trace::Scope span("all_gather", "comm");
    all_gather(input, output);
  });
}

std::shared_ptr<RequestState> CommBackend::ireduce_scatter(const Tensor& full, Tensor& shard,
                                                           ReduceOp op) {
  Tensor input = full, output = shard;
  return run_in_background([this, input, output, op]() mutable {
    trace::Scope span("reduce_scatter", "comm");
    reduce_scatter(input, output, op);
  });
}

void CommBackend::stop_worker() {
  if (!worker_) return;
  std::exception_ptr unobserved = worker_->stop();
  worker_.reset();
  if (unobserved) detail::note_unobserved_failure(unobserved);
}

namespace {
void check_defined(const char* op, const char* name, const Tensor& t) {
  DTP_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
}
}  // namespace

Comm::Comm(std::shared_ptr<CommBackend> backend) : backend_(std::move(backend)) {
  DTP_CHECK(backend_ != nullptr, "Comm needs a backend");
}

int Comm::rank() const { return backend_->rank(); }
int Comm::size() const { return backend_->size(); }
Device Comm::device() const { return backend_->device(); }
std::string Comm::backend_name() const { return backend_->name(); }
CostModel Comm::cost_model() const { return backend_->cost_model(); }
void* Comm::native_handle() const { return backend_->native_handle(); }

void Comm::check_peer(const char* op, const char* role, int peer) const {
  DTP_CHECK(peer >= 0 && peer < size(), op, ": ", role, " rank ", peer,
            " is outside the communicator (ranks 0..", size() - 1, ")");
}

void Comm::check_tag(const char* op, int tag) const {
  DTP_CHECK(tag >= 0 && tag < kMaxTag, op, ": tag ", tag, " is outside [0, ", kMaxTag, ")");
}

void Comm::send(const Tensor& x, int dst, int tag) {
  check_defined("send", "x", x);
  check_peer("send", "destination", dst);
  check_tag("send", tag);
  check_not_in_flight("send", x, dst, tag, true);
  trace::Scope span("send", "comm");
  if (!std::exchange(backend_->lose_next_send, false)) backend_->send(x, dst, tag);
  backend_->stats.messages_sent += 1;
  backend_->stats.bytes_sent += static_cast<std::int64_t>(x.nbytes());
}

void Comm::recv(Tensor& x, int src, int tag) {
  check_defined("recv", "x", x);
  check_peer("recv", "source", src);
  check_tag("recv", tag);
  check_not_in_flight("recv", x, src, tag, false);
  trace::Scope span("recv", "comm");
  backend_->recv(x, src, tag);
  backend_->stats.messages_received += 1;
  backend_->stats.bytes_received += static_cast<std::int64_t>(x.nbytes());
}

int Comm::recv_any(Tensor& x, int tag) { return receive_within("recv_any", x, -1, tag, -1); }

namespace {
void check_seconds(const char* op, double seconds) {
  DTP_CHECK(std::isfinite(seconds) && seconds >= 0, op,
            ": seconds (how long to wait) must be finite and >= 0, got ", seconds);
}
}  // namespace

bool Comm::recv_for(Tensor& x, int src, int tag, double seconds) {
  check_peer("recv_for", "source", src);
  check_seconds("recv_for", seconds);
  return receive_within("recv_for", x, src, tag, seconds) >= 0;
}

int Comm::recv_any_for(Tensor& x, int tag, double seconds) {
  check_seconds("recv_any_for", seconds);
  return receive_within("recv_any_for", x, -1, tag, seconds);
}

int Comm::receive_within(const char* op, Tensor& x, int src, int tag, double seconds) {
  check_tag(op, tag);
  if (x.defined()) check_not_in_flight(op, x, src, tag, false);  // else: any size, a new tensor
  trace::Scope span(op, "comm");
  const int from = backend_->receive_within(x, src, tag, seconds);
  if (from < 0) return -1;
  backend_->stats.messages_received += 1;
  backend_->stats.bytes_received += static_cast<std::int64_t>(x.nbytes());
  return from;
}

void Comm::wait_for_others_to_leave() { backend_->wait_for_others_to_leave(); }

void Comm::lose_next_send() { backend_->lose_next_send = true; }

void CommBackend::wait_for_others_to_leave() {
  throw Error(detail::concat("an injected hang (DTP_FAULT) is not available on the ", name(),
                             " backend; use DTP_BACKEND=thread or mpi"));
}

int CommBackend::receive_within(Tensor& x, int src, int tag, double seconds) {
  (void)x, (void)src, (void)tag, (void)seconds;
  throw Error(detail::concat("recv_any, recv_for and recv_any_for are not available on the ",
                             name(), " backend; use DTP_BACKEND=thread or mpi"));
}

namespace {
/// An isend the backend finished at once (the thread backend's eager copy):
/// nothing to wait for, but it stays pending until wait(), as on mpi and nccl.
class SentAtOnce : public RequestState {
 public:
  void wait() override {}
};
}  // namespace

Request Comm::isend(const Tensor& x, int dst, int tag) {
  check_defined("isend", "x", x);
  check_peer("isend", "destination", dst);
  check_tag("isend", tag);
  check_not_in_flight("isend", x, dst, tag, true);
  trace::Scope span("isend", "comm");
  std::shared_ptr<RequestState> state;
  if (!std::exchange(backend_->lose_next_send, false)) state = backend_->isend(x, dst, tag);
  if (!state) state = std::make_shared<SentAtOnce>();
  backend_->stats.messages_sent += 1;
  backend_->stats.bytes_sent += static_cast<std::int64_t>(x.nbytes());
  keep_in_flight(state, x, dst, tag, true);
  return Request(std::move(state));
}

void Comm::keep_in_flight(const std::shared_ptr<RequestState>& state, const Tensor& x, int peer,
                          int tag, bool sending) {
  if (!state || x.nbytes() == 0) return;
  const char* begin = static_cast<const char*>(x.raw());
  backend_->pending.push_back({state, begin, begin + x.nbytes(), peer, tag, sending});
}

void Comm::check_not_in_flight(const char* op, const Tensor& x, int peer, int tag, bool sending) {
  auto& pending = backend_->pending;
  std::erase_if(pending, [](const CommBackend::PendingTransfer& p) {
    const auto request = p.request.lock();
    return !request || request->completed;
  });
  if (x.nbytes() == 0 || pending.empty()) return;
  const char* begin = static_cast<const char*>(x.raw());
  const char* end = begin + x.nbytes();
  for (const CommBackend::PendingTransfer& p : pending) {
    if (p.sending == sending || end <= p.begin || p.end <= begin) continue;
    if (sending)
      throw Error(
          detail::concat(op, "(destination rank ", peer, ", tag ", tag, ") on rank ", rank(),
                         " sends bytes that this rank's irecv from rank ", p.peer, " (tag ", p.tag,
                         ") has not finished writing: wait() for that receive first, or send from "
                         "another buffer. The thread backend copies a message at isend, so this "
                         "runs here; on mpi and nccl the send would read half-received data"));
    throw Error(detail::concat(
        op, "(source rank ", peer, ", tag ", tag, ") on rank ", rank(),
        " writes into bytes that this rank's isend to rank ", p.peer, " (tag ", p.tag,
        ") is still sending: wait() for that send first, or receive into another "
        "buffer. The thread backend copies a message at isend, so this runs here; on "
        "mpi and nccl the send reads its buffer until wait() returns and would send "
        "the received data instead"));
  }
}

Request Comm::irecv(Tensor& x, int src, int tag) {
  check_defined("irecv", "x", x);
  check_peer("irecv", "source", src);
  check_tag("irecv", tag);
  check_not_in_flight("irecv", x, src, tag, false);
  auto state = backend_->irecv(x, src, tag);
  backend_->stats.messages_received += 1;
  backend_->stats.bytes_received += static_cast<std::int64_t>(x.nbytes());
  keep_in_flight(state, x, src, tag, false);
  return Request(std::move(state));
}

void Comm::count_collective(const char* kind, const Tensor& buffer) {
  backend_->stats.collective_calls[kind] += 1;
  if (buffer.defined())
    backend_->stats.collective_bytes += static_cast<std::int64_t>(buffer.nbytes());
}

void Comm::check_reduce_op(const char* op_name, const Tensor& x, ReduceOp op) const {
  DTP_CHECK(op != ReduceOp::avg || is_floating(x.dtype()), op_name,
            ": avg needs a floating dtype, got ", x.describe());
}

void Comm::check_shard(const char* op, const Tensor& shard, const Tensor& full, int rank) const {
  ChunkRange range = chunk_range(full.numel(), size(), rank);
  DTP_CHECK(shard.dtype() == full.dtype(), op, ": shard is ", shard.describe(), " but full is ",
            full.describe(), "; dtypes must match");
  DTP_CHECK(shard.numel() == range.length, op, ": rank ", rank, "'s shard must hold chunk ", rank,
            " of ", size(), " of a ", full.numel(), "-element buffer, which is ", range.length,
            " elements, but it holds ", shard.numel());
  // Where shard and full share memory, only the in-place all-gather is defined:
  // the shard is exactly this rank's own chunk of full.
  const auto* shard_begin = static_cast<const char*>(shard.raw());
  const auto* full_begin = static_cast<const char*>(full.raw());
  const bool overlap = shard.device() == full.device() && shard.nbytes() > 0 && full.nbytes() > 0 &&
                       shard_begin < full_begin + full.nbytes() &&
                       full_begin < shard_begin + shard.nbytes();
  if (!overlap) return;
  const bool in_place = shard_begin == full_begin + range.offset * full.element_size();
  const std::string name = op;
  DTP_CHECK(in_place && (name == "all_gather" || name == "iall_gather"), op, ": shard ",
            shard.describe(), " shares memory with full ", full.describe(),
            in_place ? "; only all_gather may work in place (pass a separate shard)"
                     : std::string("; an in-place all_gather passes full's own chunk ") +
                           std::to_string(rank) + " (elements " + std::to_string(range.offset) +
                           ".." + std::to_string(range.offset + range.length) +
                           ") as the shard, any other overlap is an error");
}

void Comm::all_reduce(Tensor& x, ReduceOp op) {
  check_defined("all_reduce", "x", x);
  check_reduce_op("all_reduce", x, op);
  trace::Scope span("all_reduce", "comm");
  backend_->all_reduce(x, op);
  count_collective("all_reduce", x);
}

Request Comm::iall_reduce(Tensor& x, ReduceOp op) {
  check_defined("iall_reduce", "x", x);
  check_reduce_op("iall_reduce", x, op);
  trace::Scope span("iall_reduce", "comm");  // when it was posted, on the caller's lane
  auto state = backend_->iall_reduce(x, op);
  count_collective("all_reduce", x);
  return Request(std::move(state));
}

void Comm::broadcast(Tensor& x, int root) {
  check_defined("broadcast", "x", x);
  check_peer("broadcast", "root", root);
  trace::Scope span("broadcast", "comm");
  backend_->broadcast(x, root);
  count_collective("broadcast", x);
}

void Comm::reduce(Tensor& x, int root, ReduceOp op) {
  check_defined("reduce", "x", x);
  check_peer("reduce", "root", root);
  check_reduce_op("reduce", x, op);
  trace::Scope span("reduce", "comm");
  backend_->reduce(x, root, op);
  count_collective("reduce", x);
}

void Comm::all_gather(const Tensor& shard, Tensor& full) {
  check_defined("all_gather", "shard", shard);
  check_defined("all_gather", "full", full);
  check_shard("all_gather", shard, full, rank());
  trace::Scope span("all_gather", "comm");
  backend_->all_gather(shard, full);
  count_collective("all_gather", full);
}

void Comm::reduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op) {
  check_defined("reduce_scatter", "full", full);
  check_defined("reduce_scatter", "shard", shard);
  check_shard("reduce_scatter", shard, full, rank());
  check_reduce_op("reduce_scatter", full, op);
  trace::Scope span("reduce_scatter", "comm");
  backend_->reduce_scatter(full, shard, op);
  count_collective("reduce_scatter", full);
}

Request Comm::iall_gather(const Tensor& shard, Tensor& full) {
  check_defined("iall_gather", "shard", shard);
  check_defined("iall_gather", "full", full);
  check_shard("iall_gather", shard, full, rank());
  trace::Scope span("iall_gather", "comm");  // when it was posted, on the caller's lane
  auto state = backend_->iall_gather(shard, full);
  count_collective("all_gather", full);  // the same collective as all_gather, counted alike
  return Request(std::move(state));
}

Request Comm::ireduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op) {
  check_defined("ireduce_scatter", "full", full);
  check_defined("ireduce_scatter", "shard", shard);
  check_shard("ireduce_scatter", shard, full, rank());
  check_reduce_op("ireduce_scatter", full, op);
  trace::Scope span("ireduce_scatter", "comm");  // when it was posted, on the caller's lane
  auto state = backend_->ireduce_scatter(full, shard, op);
  count_collective("reduce_scatter", full);
  return Request(std::move(state));
}

void Comm::all_to_all(const Tensor& in, Tensor& out) {
  check_defined("all_to_all", "in", in);
  check_defined("all_to_all", "out", out);
  DTP_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel(),
            "all_to_all: in and out must have the same dtype and element count, got ",
            in.describe(), " and ", out.describe());
  DTP_CHECK(in.numel() % size() == 0, "all_to_all: the element count ", in.numel(),
            " must divide by the world size ", size(),
            " (every rank sends every rank one equal chunk)");
  trace::Scope span("all_to_all", "comm");
  backend_->all_to_all(in, out);
  count_collective("all_to_all", in);
}

void Comm::gather(const Tensor& shard, Tensor& full, int root) {
  check_defined("gather", "shard", shard);
  check_peer("gather", "root", root);
  if (rank() == root) {
    check_defined("gather", "root's full", full);
    check_shard("gather", shard, full, rank());
  }
  trace::Scope span("gather", "comm");
  backend_->gather(shard, full, root);
  count_collective("gather", shard);
}

void Comm::scatter(const Tensor& full, Tensor& shard, int root) {
  check_defined("scatter", "shard", shard);
  check_peer("scatter", "root", root);
  if (rank() == root) {
    check_defined("scatter", "root's full", full);
    check_shard("scatter", shard, full, rank());
  }
  trace::Scope span("scatter", "comm");
  backend_->scatter(full, shard, root);
  count_collective("scatter", shard);
}

void Comm::barrier() {
  trace::Scope span("barrier", "comm");
  backend_->barrier();
  count_collective("barrier", Tensor());
}

Comm Comm::split(int color, int key) {
  DTP_CHECK(color >= 0, "split: color must be >= 0, got ", color);
  Comm sub(backend_->split(color, key));
  count_collective("split", Tensor());
  return sub;
}

CommStats Comm::stats() const {
  CommStats out = backend_->stats;
  out.clock = backend_->clock();
  return out;
}

void Comm::reset_stats() {
  backend_->stats = CommStats{};
  backend_->set_clock(0.0);
  backend_->reset_links();
}

void Comm::advance_clock(double time) {
  DTP_CHECK(std::isfinite(time) && time >= 0,
            "advance_clock: the time must be finite and >= 0, got ", time);
  backend_->set_clock(backend_->clock() + time);
}

}  // namespace dtp
