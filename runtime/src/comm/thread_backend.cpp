// The thread backend: ranks are threads of one process sharing memory.
// Point-to-point messages are eager copies dropped in the receiver's mailbox.
// Library collectives do not loop over send/recv: after the ranks meet, each
// rank reduces or copies its own chunk straight out of the others' buffers,
// so every byte is read once and written once, spread over all ranks.
#include "comm/thread_backend.h"

#include <algorithm>
#include <exception>
#include <numeric>
#include <sstream>

#include "comm/rank_context.h"
#include "comm/thread_group.h"
#include "cpu/reduce_into_all.h"
#include "cuda/device_api.h"
#include "dtp/error.h"
#include "dtp/parallel.h"
#include "dtp/trace.h"

namespace dtp {

ThreadComm::ThreadComm(std::shared_ptr<ThreadGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {
  // Made here, on the rank's thread, so that they belong to its device.
  if (device().is_cuda())
    for (int slot : {0, 1}) (void)group_->stream_events(rank_, slot);
}

ThreadComm::~ThreadComm() {
  if (std::uncaught_exceptions() > 0 && background_work_pending()) {
    // This rank is failing with collectives still queued on its communication
    // thread: they wait for peers that may be waiting for this rank. Release
    // everyone now instead of after the timeout. With nothing pending there
    // is nobody to release, and the rank may yet catch the exception.
    std::lock_guard lock(group_->world().mutex);
    group_->world().abort(global_rank(), "it failed with non-blocking collectives pending");
  }
  stop_worker();
}

int ThreadComm::size() const { return group_->size(); }
Device ThreadComm::device() const { return group_->world().device_of(global_rank()); }
CostModel ThreadComm::cost_model() const { return group_->cost(); }
int ThreadComm::global_rank() const { return group_->global_rank(rank_); }

double ThreadComm::clock() const {
  std::lock_guard lock(group_->world().mutex);
  return group_->world().clocks[global_rank()];
}

void ThreadComm::set_clock(double time) {
  std::lock_guard lock(group_->world().mutex);
  group_->world().clocks[global_rank()] = time;
}

// --- point to point -------------------------------------------------------------

std::int64_t ThreadComm::post_copy(const Tensor& x, int dst, int tag) {
  // Copy first, outside the lock: the caller may reuse x as soon as we return.
  Message message;
  message.source = rank_;
  message.tag = tag;
  message.payload = Tensor::empty(x.shape(), x.dtype(), x.device(), MemoryCategory::comm);
  message.payload.copy_from(x);
  if (x.device().is_cuda()) {
    // The copy is queued on the sender's stream; the receiver's stream waits
    // for this event instead of the host waiting for the copy.
    void* event = cuda::create_event();
    cuda::record(event);
    message.ready = std::shared_ptr<void>(event, cuda::destroy_event);
  }

  ThreadWorld& world = group_->world();
  std::lock_guard lock(world.mutex);
  world.throw_if_aborted(global_rank());
  const CostModel cost = world.config().cost.for_group({global_rank(), group_->global_rank(dst)});
  message.arrival = charge_send(world.clocks[global_rank()], dst, x.nbytes(), cost);
  const std::int64_t sequence = group_->post(dst, std::move(message));
  world.changed.notify_all();
  return sequence;
}

void ThreadComm::send(const Tensor& x, int dst, int tag) {
  const std::int64_t sequence = post_copy(x, dst, tag);
  if (group_->world().config().send_mode == SendMode::sync)
    wait_until_received(x, dst, tag, sequence);
}

void ThreadComm::wait_until_received(const Tensor& x, int dst, int tag, std::int64_t sequence) {
  ThreadWorld& world = group_->world();
  std::unique_lock lock(world.mutex);
  std::ostringstream what;
  what << "send(destination rank " << group_->global_rank(dst) << ", tag " << tag << ", "
       << x.numel() << " x " << dtype_name(x.dtype())
       << ") to be matched by a recv (DTP_SEND=sync)";
  if (group_->name() != "the world") what << " on " << group_->name();
  world.wait_until(
      lock, global_rank(), [&] { return group_->receive_posted(dst, rank_, tag, sequence); },
      [description = what.str()] { return description; });
}

namespace {
/// An isend under DTP_SEND=sync: the message is already in the mailbox; the
/// request completes once the receiver has posted the matching receive.
class ThreadSyncSendRequest : public RequestState {
 public:
  ThreadSyncSendRequest(ThreadComm* comm, Tensor x, int dst, int tag, std::int64_t sequence)
      : comm_(comm), x_(std::move(x)), dst_(dst), tag_(tag), sequence_(sequence) {}
  void wait() override { comm_->wait_until_received(x_, dst_, tag_, sequence_); }

 private:
  ThreadComm* comm_;
  Tensor x_;  // for the report only: the message holds its own copy
  int dst_, tag_;
  std::int64_t sequence_;
};
}  // namespace

std::shared_ptr<RequestState> ThreadComm::isend(const Tensor& x, int dst, int tag) {
  const std::int64_t sequence = post_copy(x, dst, tag);
  if (group_->world().config().send_mode != SendMode::sync) return nullptr;  // eager: done
  return std::make_shared<ThreadSyncSendRequest>(this, x, dst, tag, sequence);
}

void ThreadComm::receive(Tensor& x, int src, int tag, std::int64_t ticket) {
  ThreadWorld& world = group_->world();
  std::unique_lock lock(world.mutex);
  world.wait_until(
      lock, global_rank(), [&] { return group_->has_message(rank_, src, tag, ticket); },
      [&, src, tag] {
        std::ostringstream what;
        what << "recv(source rank " << group_->global_rank(src) << ", tag " << tag << ", "
             << x.numel() << " x " << dtype_name(x.dtype()) << ")";
        if (group_->name() != "the world") what << " on " << group_->name();
        return what.str();
      });
  Message message = group_->take_message(rank_, src, tag, ticket);
  lock.unlock();
  deliver(std::move(message), x, src, tag);
}

int ThreadComm::receive_within(Tensor& x, int src, int tag, double seconds) {
  ThreadWorld& world = group_->world();
  std::unique_lock lock(world.mutex);
  DTP_CHECK(world.config().send_mode != SendMode::sync,
            "recv_any, recv_for and recv_any_for need eager sends: under DTP_SEND=sync a send "
            "waits for a posted receive, and these post none until a message is there");
  const auto ready = [&] { return group_->next_ready_source(rank_, src, tag) >= 0; };
  const auto describe = [&, src, tag] {
    std::ostringstream what;
    what << (src < 0 ? std::string("recv_any(")
                     : "recv_for(source rank " + std::to_string(group_->global_rank(src)) + ", ")
         << "tag " << tag << ", " << x.numel() << " x " << dtype_name(x.dtype()) << ")";
    if (group_->name() != "the world") what << " on " << group_->name();
    return what.str();
  };
  if (seconds < 0)
    world.wait_until(lock, global_rank(), ready, describe);
  else if (!world.wait_for(lock, global_rank(), ready, describe, seconds))
    return -1;
  const int from = group_->next_ready_source(rank_, src, tag);
  const std::int64_t ticket = group_->take_ticket(rank_, from, tag);
  Message message = group_->take_message(rank_, from, tag, ticket);
  lock.unlock();
  if (!x.defined())
    x = Tensor::empty(message.payload.shape(), message.payload.dtype(), device(),
                      MemoryCategory::comm);
  deliver(std::move(message), x, from, tag);
  return from;
}

// Waits in slices of a second, each of which gives up by itself: the others
// may run for longer than DTP_TIMEOUT, and a rank that will wake is never
// part of a deadlock (the others, if they wait for it, time out instead).
void ThreadComm::wait_for_others_to_leave() {
  ThreadWorld& world = group_->world();
  std::unique_lock lock(world.mutex);
  const int me = global_rank();
  while (!world.wait_for(
      lock, me, [&] { return world.all_others_finished(me); },
      [] { return std::string("an injected hang (DTP_FAULT): every other rank to return"); },
      1.0)) {
  }
}

void ThreadComm::deliver(Message message, Tensor& x, int src, int tag) {
  {
    ThreadWorld& world = group_->world();
    std::lock_guard lock(world.mutex);
    double& clock = world.clocks[global_rank()];
    clock = std::max(clock, message.arrival);
  }
  const Tensor& payload = message.payload;
  if (payload.dtype() != x.dtype() || payload.numel() != x.numel()) {
    std::ostringstream what;
    what << "recv on rank " << global_rank() << " from rank " << group_->global_rank(src)
         << " (tag " << tag << ") expected " << x.numel() << " x " << dtype_name(x.dtype())
         << " but the message holds " << payload.numel() << " x " << dtype_name(payload.dtype())
         << "; sender and receiver must agree on the size and dtype of every message";
    throw CommMismatch(what.str());
  }
  if (message.ready) cuda::wait(message.ready.get());
  x.copy_from(payload);
}

void ThreadComm::recv(Tensor& x, int src, int tag) {
  std::int64_t ticket;
  {
    std::lock_guard lock(group_->world().mutex);
    ticket = group_->take_ticket(rank_, src, tag);
    if (group_->world().config().send_mode == SendMode::sync) group_->world().changed.notify_all();
  }
  receive(x, src, tag, ticket);
}

namespace {
/// A posted receive: its place in the (source, tag) queue is fixed at post
/// time, so receives complete in the order they were posted, as in MPI.
class ThreadRecvRequest : public RequestState {
 public:
  ThreadRecvRequest(ThreadComm* comm, Tensor x, int src, int tag, std::int64_t ticket)
      : comm_(comm), x_(std::move(x)), src_(src), tag_(tag), ticket_(ticket) {}
  void wait() override { comm_->receive(x_, src_, tag_, ticket_); }

 private:
  ThreadComm* comm_;
  Tensor x_;  // shares storage with the caller's tensor
  int src_, tag_;
  std::int64_t ticket_;
};
}  // namespace

std::shared_ptr<RequestState> ThreadComm::irecv(Tensor& x, int src, int tag) {
  std::int64_t ticket;
  {
    std::lock_guard lock(group_->world().mutex);
    group_->world().throw_if_aborted(global_rank());
    ticket = group_->take_ticket(rank_, src, tag);
    // A synchronous sender waiting for this receive may go on.
    if (group_->world().config().send_mode == SendMode::sync) group_->world().changed.notify_all();
  }
  return std::make_shared<ThreadRecvRequest>(this, x, src, tag, ticket);
}

// --- collectives ----------------------------------------------------------------

namespace {
CollectiveCall make_call(const char* kind, const Tensor& buffer, double cost_bytes) {
  CollectiveCall call;
  call.kind = kind;
  if (buffer.defined()) {
    call.dtype = buffer.dtype();
    call.count = buffer.numel();
  }
  call.cost_bytes = cost_bytes;
  return call;
}
CollectiveCall with_op(CollectiveCall call, ReduceOp op) {
  call.uses_op = true;
  call.op = op;
  return call;
}
}  // namespace

template <typename Work>
void ThreadComm::collective(CollectiveCall call, Work&& work) {
  if (call.sequence < 0) call.sequence = next_collective_++;
  const std::int64_t sequence = call.sequence;
  const bool gpu = device().is_cuda();
  ThreadGroup::StreamEvents events;
  if (gpu) {
    events = group_->stream_events(rank_, detail::is_comm_worker() ? 1 : 0);
    cuda::record(events.ready);
    call.ready_event = events.ready;
    call.done_event = events.done;
  }
  const std::vector<CollectiveCall>& calls = group_->arrive(rank_, std::move(call));
  // On a GPU the host only queues work: this rank's stream first waits until
  // every peer's inputs are ready, and afterwards every peer's stream waits
  // until this rank's reads of its buffers are done.
  std::vector<void*> peers_done;
  if (gpu) {
    for (int r = 0; r < size(); ++r) {
      if (r == rank_) continue;
      cuda::wait(calls[r].ready_event);
      peers_done.push_back(calls[r].done_event);
    }
  }
  work(calls);
  if (gpu) cuda::record(events.done);
  group_->depart(rank_, sequence);
  for (void* event : peers_done) cuda::wait(event);
}

void ThreadComm::all_reduce(Tensor& x, ReduceOp op) { all_reduce_as(next_collective_++, x, op); }

std::shared_ptr<RequestState> ThreadComm::in_background(const char* span_name,
                                                        std::function<void(std::int64_t)> run) {
  // Its place among this communicator's collectives is fixed now, in call
  // order, however late the communication thread gets to run it.
  const std::int64_t sequence = next_collective_++;
  ThreadWorld& world = group_->world();
  int thread;
  {
    std::lock_guard lock(world.mutex);
    world.throw_if_aborted(global_rank());
    if (communication_thread_ < 0)
      communication_thread_ = world.add_communication_thread(global_rank());
    thread = communication_thread_;
    world.job_queued(thread);  // busy from now on, not only once it starts
  }
  return run_in_background([this, span_name, run = std::move(run), sequence, thread] {
    ThreadWorld::wait_as_communication_thread(thread);
    struct JobFinished {
      ThreadWorld& world;
      int thread;
      ~JobFinished() {
        std::lock_guard lock(world.mutex);
        world.job_finished(thread);
      }
    } job_finished{group_->world(), thread};
    trace::Scope span(span_name, "comm");
    run(sequence);
  });
}

// The queued work holds handles to the caller's tensors, which keeps their
// storage alive until it has run.
std::shared_ptr<RequestState> ThreadComm::iall_reduce(Tensor& x, ReduceOp op) {
  return in_background("all_reduce", [this, target = x, op](std::int64_t sequence) mutable {
    all_reduce_as(sequence, target, op);
  });
}

std::shared_ptr<RequestState> ThreadComm::iall_gather(const Tensor& shard, Tensor& full) {
  return in_background("all_gather",
                       [this, input = shard, output = full](std::int64_t sequence) mutable {
                         all_gather_as(sequence, input, output);
                       });
}

std::shared_ptr<RequestState> ThreadComm::ireduce_scatter(const Tensor& full, Tensor& shard,
                                                          ReduceOp op) {
  return in_background("reduce_scatter",
                       [this, input = full, output = shard, op](std::int64_t sequence) mutable {
                         reduce_scatter_as(sequence, input, output, op);
                       });
}

void ThreadComm::all_reduce_as(std::int64_t sequence, Tensor& x, ReduceOp op) {
  CollectiveCall call = with_op(make_call("all_reduce", x, static_cast<double>(x.nbytes())), op);
  call.sequence = sequence;
  call.first = x.flatten();
  collective(std::move(call), [&](const std::vector<CollectiveCall>& calls) {
    // This rank owns a chunk: reduce it from every rank's copy and write the
    // result back into everyone's copy. Chunks are disjoint.
    const int n = size();
    // One fused pass (a kernel on the GPU, cache tiles on the host): n reads
    // and n writes per element of this rank's chunk.
    std::vector<void*> buffers;
    for (const CollectiveCall& c : calls)
      buffers.push_back(Tensor(c.first).raw());  // a handle: writable view
    if (x.device().is_cuda()) {
      ChunkRange mine = chunk_range(x.numel(), n, rank_);
      cuda::reduce_into_all(buffers.data(), n, mine.offset, mine.length, x.dtype(), op);
    } else {
      // With more rank threads than the process has cores (4 ranks on a
      // 2-core laptop), the first `cores` ranks split the work and the rest
      // only wait: n threads taking turns on fewer cores would evict each
      // other's tiles. Every element is still summed in rank order.
      const int workers = std::min(n, default_compute_threads());
      if (rank_ < workers) {
        ChunkRange mine = chunk_range(x.numel(), workers, rank_);
        cpu::reduce_into_all(buffers, mine.offset, mine.length, x.dtype(), op);
      }
    }
  });
}

void ThreadComm::broadcast(Tensor& x, int root) {
  CollectiveCall call = make_call("broadcast", x, static_cast<double>(x.nbytes()));
  call.root = root;
  call.first = x;
  collective(std::move(call), [&](const std::vector<CollectiveCall>& calls) {
    if (rank_ != root) x.copy_from(calls[root].first);
  });
}

void ThreadComm::reduce(Tensor& x, int root, ReduceOp op) {
  CollectiveCall call = with_op(make_call("reduce", x, static_cast<double>(x.nbytes())), op);
  call.root = root;
  call.first = x.flatten();
  collective(std::move(call), [&](const std::vector<CollectiveCall>& calls) {
    // Each rank reduces one chunk into the root's buffer; other buffers are only read.
    const int n = size();
    Tensor target = calls[root].first.chunk(n)[rank_];
    for (int r = 0; r < n; ++r)
      if (r != root)
        ops::accumulate(target, calls[r].first.chunk(n)[rank_],
                        op == ReduceOp::avg ? ReduceOp::sum : op);
    if (op == ReduceOp::avg) ops::scale(target, 1.0 / n);
  });
}

void ThreadComm::all_gather(const Tensor& shard, Tensor& full) {
  all_gather_as(next_collective_++, shard, full);
}

void ThreadComm::all_gather_as(std::int64_t sequence, const Tensor& shard, Tensor& full) {
  CollectiveCall call = make_call("all_gather", full, static_cast<double>(full.nbytes()));
  call.sequence = sequence;
  call.first = shard;
  collective(std::move(call), [&](const std::vector<CollectiveCall>& calls) {
    std::vector<Tensor> parts = full.flatten().chunk(size());
    for (int r = 0; r < size(); ++r) parts[r].copy_from(calls[r].first);
  });
}

void ThreadComm::reduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op) {
  reduce_scatter_as(next_collective_++, full, shard, op);
}

void ThreadComm::reduce_scatter_as(std::int64_t sequence, const Tensor& full, Tensor& shard,
                                   ReduceOp op) {
  CollectiveCall call =
      with_op(make_call("reduce_scatter", full, static_cast<double>(full.nbytes())), op);
  call.sequence = sequence;
  call.first = full.flatten();
  collective(std::move(call), [&](const std::vector<CollectiveCall>& calls) {
    const int n = size();
    Tensor out = shard.flatten();
    if (out.device().is_cuda()) {
      std::vector<const void*> inputs;
      for (const CollectiveCall& c : calls) inputs.push_back(c.first.raw());
      ChunkRange mine = chunk_range(full.numel(), n, rank_);
      cuda::reduce_from_all(out.raw(), inputs.data(), n, mine.offset, mine.length, out.dtype(), op);
      return;
    }
    out.copy_from(calls[0].first.chunk(n)[rank_]);
    for (int r = 1; r < n; ++r)
      ops::accumulate(out, calls[r].first.chunk(n)[rank_],
                      op == ReduceOp::avg ? ReduceOp::sum : op);
    if (op == ReduceOp::avg) ops::scale(out, 1.0 / n);
  });
}

void ThreadComm::all_to_all(const Tensor& in, Tensor& out) {
  CollectiveCall call = make_call("all_to_all", in, static_cast<double>(in.nbytes()));
  call.first = in.flatten();
  collective(std::move(call), [&](const std::vector<CollectiveCall>& calls) {
    std::vector<Tensor> parts = out.flatten().chunk(size());
    for (int r = 0; r < size(); ++r) parts[r].copy_from(calls[r].first.chunk(size())[rank_]);
  });
}

void ThreadComm::all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                              Tensor& out, const std::vector<std::int64_t>& recv_counts,
                              double cost_bytes) {
  CollectiveCall call = make_call("all_to_all_v", Tensor(), cost_bytes);
  call.dtype = in.dtype();
  call.first = in.flatten();
  call.send_counts = send_counts;
  collective(std::move(call), [&](const std::vector<CollectiveCall>& calls) {
    // Each rank pulls its block out of every sender's buffer: the block
    // starts after what that sender sends to the ranks before this one.
    Tensor target = out.flatten();
    std::int64_t at = 0;
    for (int r = 0; r < size(); ++r) {
      const std::vector<std::int64_t>& theirs = calls[r].send_counts;
      const std::int64_t from =
          std::accumulate(theirs.begin(), theirs.begin() + rank_, std::int64_t{0});
      if (recv_counts[r] > 0)
        target.slice(at, recv_counts[r]).copy_from(calls[r].first.slice(from, recv_counts[r]));
      at += recv_counts[r];
    }
  });
}

void ThreadComm::gather(const Tensor& shard, Tensor& full, int root) {
  CollectiveCall call = make_call("gather", Tensor(), static_cast<double>(shard.nbytes()) * size());
  call.dtype = shard.dtype();
  call.root = root;
  call.first = shard;
  if (rank_ == root) call.second = full.flatten();
  collective(std::move(call), [&](const std::vector<CollectiveCall>& calls) {
    calls[root].second.chunk(size())[rank_].copy_from(shard);
  });
}

void ThreadComm::scatter(const Tensor& full, Tensor& shard, int root) {
  CollectiveCall call =
      make_call("scatter", Tensor(), static_cast<double>(shard.nbytes()) * size());
  call.dtype = shard.dtype();
  call.root = root;
  call.first = shard;
  if (rank_ == root) call.second = full.flatten();
  collective(std::move(call), [&](const std::vector<CollectiveCall>& calls) {
    shard.flatten().copy_from(calls[root].second.chunk(size())[rank_]);
  });
}

void ThreadComm::barrier() {
  collective(make_call("barrier", Tensor(), 0), [](const std::vector<CollectiveCall>&) {});
}

std::shared_ptr<CommBackend> ThreadComm::split(int color, int key) {
  CollectiveCall call = make_call("split", Tensor(), 0);
  call.color = color;
  call.key = key;
  const std::int64_t sequence = call.sequence = next_collective_++;
  group_->arrive(rank_, std::move(call));
  auto [group, rank] = group_->split_result(rank_, sequence);
  group_->depart(rank_, sequence);
  return std::make_shared<ThreadComm>(group, rank);
}

}  // namespace dtp
