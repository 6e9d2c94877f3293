// The nccl backend's operations. Two things NCCL does not do are added here:
// - Eager sends. NCCL sends complete only when the peer receives, so send()
//   copies and queues the message; queued sends go out in one NCCL group with
//   the next receive or collective, which lets a ring of "send, then receive"
//   work as it does on the other backends. Which group carries what, and
//   when the host may wait, is decided in comm/eager_sends.h.
// - Checks. Each message carries a small header (size, dtype, tag, clock)
//   that the receiver checks at its next wait, and every collective starts
//   with a tiny all-reduce of a signature, so mismatches give a clear error
//   instead of a GPU that waits forever. NCCL has no tags: messages between
//   two ranks arrive in the order they were sent, whatever their tags.
#include "nccl/nccl_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <sstream>
#include <thread>

#include "cuda/cuda_check.h"
#include "cuda/device_api.h"
#include "dtp/error.h"

namespace dtp::nccl {

void check(ncclResult_t code, const char* call, const char* file, int line) {
  if (code == ncclSuccess || code == ncclInProgress) return;
  throw Error(std::string("NCCL error: ") + call + " failed at " + file + ":" +
              std::to_string(line) + ": " + ncclGetErrorString(code));
}

void ThreadControl::poll(int rank) {
  const int failed = failed_rank_.load();
  if (failed >= 0 && failed != rank)
    throw CommAborted("rank " + std::to_string(rank) + " stopped because rank " +
                      std::to_string(failed) + " failed: " + message());
}

void ThreadControl::announce(int rank, const std::string& text) {
  std::lock_guard lock(mutex_);
  int expected = -1;
  if (failed_rank_.compare_exchange_strong(expected, rank)) message_ = text;
}

std::string ThreadControl::message() const {
  std::lock_guard lock(mutex_);
  return message_;
}

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return ncclFloat64;
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

char* bytes_of(Tensor& x, std::int64_t element) {
  return static_cast<char*>(x.raw()) + element * static_cast<std::int64_t>(x.element_size());
}

constexpr int kHeaderFields = 4;  // numel, dtype, tag, arrival time

class NcclSendRequest : public RequestState {
 public:
  NcclSendRequest(NcclComm* comm, Tensor x) : comm_(comm), x_(std::move(x)) {}
  void wait() override { comm_->complete_sends("an isend to be received"); }

 private:
  NcclComm* comm_;
  Tensor x_;  // stays alive until the send is done
};

// A send to self is copied at isend(): nothing is left to wait for.
class CompleteRequest : public RequestState {
 public:
  void wait() override {}
};

// The receive is issued at wait(): NCCL has no way to post it earlier without
// pinning every later call of the rank behind it.
class NcclRecvRequest : public RequestState {
 public:
  NcclRecvRequest(NcclComm* comm, Tensor x, int src, int tag)
      : comm_(comm), x_(std::move(x)), src_(src), tag_(tag) {}
  void wait() override { comm_->recv(x_, src_, tag_); }

 private:
  NcclComm* comm_;
  Tensor x_;
  int src_, tag_;
};

}  // namespace

NcclComm::NcclComm(ncclComm_t comm, int rank, int size, Device device, const World& world,
                   std::shared_ptr<Control> control, bool owns_comm)
    : comm_(comm),
      rank_(rank),
      size_(size),
      device_(device),
      world_(world),
      control_(std::move(control)),
      owns_comm_(owns_comm),
      stream_(static_cast<cudaStream_t>(cuda::current_stream())),
      sent_(static_cast<std::size_t>(size), 0),
      received_(static_cast<std::size_t>(size), 0) {}

NcclComm::~NcclComm() {
  stop_worker();
  if (side_stream_ != nullptr) cuda::destroy_stream(side_stream_);
  if (!owns_comm_) return;
  // After a failure GPU work may never finish: abort rather than wait for it.
  // A failure of this rank may not be announced yet when the unwinding
  // destroys the backend (the launcher announces in its catch): an exception
  // in flight counts as one, as in ThreadComm.
  if (control_->failed() || std::uncaught_exceptions() > 0)
    ncclCommAbort(comm_);
  else
    ncclCommDestroy(comm_);
}

double NcclComm::clock() const {
  if (!unsettled_.empty())
    const_cast<NcclComm*>(this)->synchronize("its receives, to read their clocks");
  return *clock_;
}

std::string NcclComm::finish() {
  // Everyone learns how many messages each peer sent it. The sends still
  // queued go in the same group: receives posted for them are ahead of this
  // exchange on the peers' streams. (A message nobody receives therefore
  // never completes here: the timeout reports it; the thread and mpi
  // backends name the message.)
  Tensor mine = Tensor::zeros({size_}, DType::f64),
         theirs = Tensor::zeros({size_}, DType::f64, device_);
  for (int r = 0; r < size_; ++r) mine.set_item(r, static_cast<double>(sent_[r]));
  Tensor counts = mine.to(device_);
  issue(outbox_->plan.collective(),
        "the end of the launch (its last sends to be received, and every rank's message counts)",
        [&] {
          for (int r = 0; r < size_; ++r) {
            DTP_NCCL_CHECK(ncclSend(bytes_of(counts, r), 1, ncclFloat64, r, comm_, stream_));
            DTP_NCCL_CHECK(ncclRecv(bytes_of(theirs, r), 1, ncclFloat64, r, comm_, stream_));
          }
        });
  const std::vector<double> expected = theirs.to_vector();
  std::ostringstream report;
  for (int r = 0; r < size_; ++r) {
    const long long missing = static_cast<long long>(expected[r]) - received_[r];
    if (missing > 0)
      report << "  rank " << r << " -> rank " << rank_ << ": " << missing << " message(s)\n";
  }
  return report.str();
}

void NcclComm::check_device(const char* op, const Tensor& x) const {
  DTP_CHECK(x.device() == device_, op, " on the nccl backend needs tensors on this rank's GPU ",
            device_.str(), ", got ", x.describe());
}

void NcclComm::synchronize(const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  for (long spins = 0;; ++spins) {
    cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaSuccess) return settle_receives();
    if (status != cudaErrorNotReady) DTP_CUDA_CHECK(status);
    if (spins % 64 == 0) {
      control_->poll(rank_);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > world_.timeout_seconds) {
        ncclCommAbort(comm_);  // the GPU work can never finish: free the stream
        owns_comm_ = false;
        std::ostringstream report;
        report << "timeout: rank " << rank_ << " waited " << world_.timeout_seconds
               << " s (DTP_TIMEOUT) on " << device_.str() << " for " << what
               << "; the NCCL communicator was aborted. The other ranks report what they were "
                  "waiting for.";
        for (const Incoming& in : unsettled_)
          report << "\n  still in flight: recv(source rank " << in.src << ", tag " << in.tag << ", "
                 << in.numel << " x " << dtype_name(in.dtype)
                 << "): on nccl a receive never completes if the message"
                 << " sent to it has another size, or if its sender waits in a collective first";
        control_->announce(rank_, report.str());
        throw CommTimeout(report.str());
      }
    }
    std::this_thread::yield();
  }
}

void NcclComm::issue(const NcclGroupPlan& plan, const std::string& what,
                     const std::function<void()>& collective, Incoming* incoming, Tensor* payload) {
  DTP_NCCL_CHECK(ncclGroupStart());
  for (const P2pCall& call : plan.calls) {
    switch (call.kind) {
      case P2pCall::Kind::send_header: {
        Outgoing& out = outbox_->messages.at(call.message);
        DTP_NCCL_CHECK(
            ncclSend(out.header.raw(), kHeaderFields, ncclFloat64, call.peer, out.comm, stream_));
        break;
      }
      case P2pCall::Kind::send_payload: {
        Outgoing& out = outbox_->messages.at(call.message);
        DTP_NCCL_CHECK(ncclSend(out.payload.raw(), out.payload.nbytes(), ncclUint8, call.peer,
                                out.comm, stream_));
        break;
      }
      case P2pCall::Kind::recv_header:
        DTP_NCCL_CHECK(ncclRecv(incoming->header.raw(), kHeaderFields, ncclFloat64, call.peer,
                                comm_, stream_));
        break;
      case P2pCall::Kind::recv_payload:
        DTP_NCCL_CHECK(
            ncclRecv(payload->raw(), payload->nbytes(), ncclUint8, call.peer, comm_, stream_));
        break;
      case P2pCall::Kind::collective:
        collective();
        break;
    }
  }
  DTP_NCCL_CHECK(ncclGroupEnd());
  // The issued messages' buffers may be freed now: their frees are ordered
  // after the sends on this stream.
  for (const P2pCall& call : plan.calls)
    if (call.kind == P2pCall::Kind::send_payload) outbox_->messages.erase(call.message);
  if (plan.host_waits) synchronize(what);
}

void NcclComm::check_message(const Incoming& want, std::int64_t numel, DType dtype, int tag) {
  if (numel == want.numel && dtype == want.dtype && tag == want.tag) return;
  std::ostringstream message;
  message << "recv on rank " << rank_ << " from rank " << want.src << " expected tag " << want.tag
          << " with " << want.numel << " x " << dtype_name(want.dtype)
          << " but the next message holds tag " << tag << " with " << numel << " x "
          << dtype_name(dtype)
          << "; on nccl, messages between two ranks arrive in the order they were sent";
  control_->announce(rank_, message.str());
  throw CommMismatch(message.str());
}

void NcclComm::settle_receives() {
  std::vector<Incoming> settled;
  settled.swap(unsettled_);
  for (const Incoming& in : settled) {
    const std::vector<double> h = in.header.to_vector();
    check_message(in, static_cast<std::int64_t>(h[0]), static_cast<DType>(static_cast<int>(h[1])),
                  static_cast<int>(h[2]));
    *clock_ = std::max(*clock_, h[3]);
  }
}

// --- point to point -------------------------------------------------------------

namespace {
Tensor make_header(const Tensor& x, int tag, double arrival, Device device) {
  return Tensor::from_values({static_cast<double>(x.numel()),
                              static_cast<double>(static_cast<int>(x.dtype())),
                              static_cast<double>(tag), arrival})
      .to(device);
}
}  // namespace

void NcclComm::send(const Tensor& x, int dst, int tag) {
  check_device("send", x);
  const double arrival = charge_send(*clock_, dst, x.nbytes(), world_.cost);
  sent_[dst] += 1;
  Tensor copy = Tensor::empty(x.shape(), x.dtype(), device_, MemoryCategory::comm);
  copy.copy_from(x);
  if (dst == rank_) {  // never through NCCL: recv_from_self takes it
    to_self_.push_back({copy, tag, arrival});
    return;
  }
  const int id = outbox_->next_id++;
  outbox_->messages.emplace(id, Outgoing{copy, make_header(x, tag, arrival, device_), comm_});
  outbox_->plan.queue(dst, id);
}

std::shared_ptr<RequestState> NcclComm::isend(const Tensor& x, int dst, int tag) {
  check_device("isend", x);
  if (dst == rank_) {  // copied at once: complete already
    send(x, dst, tag);
    return std::make_shared<CompleteRequest>();
  }
  const double arrival = charge_send(*clock_, dst, x.nbytes(), world_.cost);
  const int id = outbox_->next_id++;
  // No copy: x must stay unchanged until wait().
  outbox_->messages.emplace(id, Outgoing{x, make_header(x, tag, arrival, device_), comm_});
  outbox_->plan.queue(dst, id);
  sent_[dst] += 1;
  return std::make_shared<NcclSendRequest>(this, x);
}

void NcclComm::recv(Tensor& x, int src, int tag) {
  check_device("recv", x);
  if (src == rank_) return recv_from_self(x, tag);
  Incoming incoming{Tensor::zeros({kHeaderFields}, DType::f64, device_, MemoryCategory::comm), src,
                    tag, x.numel(), x.dtype()};
  std::ostringstream what;
  what << "recv(source rank " << src << ", tag " << tag << ", " << x.numel() << " x "
       << dtype_name(x.dtype()) << ")";
  // No wait: the data lands before anything later on this stream reads it.
  issue(outbox_->plan.receive(src, outbox_->next_id++), what.str(), nullptr, &incoming, &x);
  unsettled_.push_back(std::move(incoming));
  received_[src] += 1;
}

void NcclComm::recv_from_self(Tensor& x, int tag) {
  const Incoming want{Tensor(), rank_, tag, x.numel(), x.dtype()};
  if (to_self_.empty()) {
    std::ostringstream message;
    message << "recv on rank " << rank_ << " from itself (tag " << tag << ", " << x.numel() << " x "
            << dtype_name(x.dtype())
            << ") but it has no message to itself left to receive: a message to "
            << "self must be sent before it is received (it would wait forever)";
    control_->announce(rank_, message.str());
    throw CommMismatch(message.str());
  }
  const ToSelf message = std::move(to_self_.front());
  to_self_.pop_front();
  check_message(want, message.payload.numel(), message.payload.dtype(), message.tag);
  x.copy_from(
      message.payload);  // on the stream: ordered after the send's copy, before any later reader
  received_[rank_] += 1;
  *clock_ = std::max(*clock_, message.clock);
}

std::shared_ptr<RequestState> NcclComm::irecv(Tensor& x, int src, int tag) {
  check_device("irecv", x);
  return std::make_shared<NcclRecvRequest>(this, x, src, tag);
}

// --- collectives ----------------------------------------------------------------

double NcclComm::agree(const std::string& signature, const std::string& kind, double cost_bytes) {
  const double h = static_cast<double>(std::hash<std::string>{}(signature) & ((1ull << 52) - 1));
  Tensor votes = Tensor::from_values({h, -h, *clock_}).to(device_);
  issue(outbox_->plan.collective(), "the other ranks to join " + signature, [&] {
    DTP_NCCL_CHECK(
        ncclAllReduce(votes.raw(), votes.raw(), 3, ncclFloat64, ncclMax, comm_, stream_));
  });
  const std::vector<double> v = votes.to_vector();
  if (v[0] != -v[1]) {
    constexpr int kWidth = 128;
    Tensor mine = Tensor::zeros({kWidth}, DType::i32);
    for (int i = 0; i < kWidth - 1 && i < static_cast<int>(signature.size()); ++i)
      mine.set_item(i, signature[i]);
    Tensor gpu_mine = mine.to(device_),
           everyone = Tensor::zeros({kWidth * size_}, DType::i32, device_);
    DTP_NCCL_CHECK(
        ncclAllGather(gpu_mine.raw(), everyone.raw(), kWidth, ncclInt32, comm_, stream_));
    synchronize("the mismatch report");
    const std::vector<double> text = everyone.to_vector();
    std::ostringstream message;
    message << "collective mismatch: ranks called different collectives at the same step:\n";
    for (int r = 0; r < size_; ++r) {
      message << "  rank " << r << ": ";
      for (int i = 0; i < kWidth && text[r * kWidth + i] != 0; ++i)
        message << static_cast<char>(text[r * kWidth + i]);
      message << "\n";
    }
    message << "Every rank must call the same collective with the same kind, element count, dtype, "
               "root and op.";
    throw CommMismatch(message.str());
  }
  *clock_ = v[2] + collective_cost(kind, cost_bytes, size_, world_.cost);
  return v[2];
}

namespace {
std::string signature(const std::string& kind, const Tensor& x, int root, const char* op) {
  std::ostringstream out;
  out << kind << "(" << x.numel() << " x " << dtype_name(x.dtype());
  if (root >= 0) out << ", root " << root;
  if (op) out << ", " << op;
  out << ")";
  return out.str();
}
}  // namespace

void NcclComm::all_reduce(Tensor& x, ReduceOp op) {
  check_device("all_reduce", x);
  agree(signature("all_reduce", x, -1, reduce_op_name(op)), "all_reduce",
        static_cast<double>(x.nbytes()));
  DTP_NCCL_CHECK(ncclAllReduce(x.raw(), x.raw(), x.numel(), nccl_type(x.dtype()), nccl_op(op),
                               comm_, stream_));
}

namespace {
/// The rank's stream waits for the side stream's collective at wait().
class SideStreamRequest : public RequestState {
 public:
  SideStreamRequest(std::vector<Tensor> buffers, void* done)
      : buffers_(std::move(buffers)), done_(done) {}
  ~SideStreamRequest() override {
    // Dropped without wait(): the buffers' frees are ordered on the rank's
    // stream, so that stream must first wait for the side stream's reads.
    // (No throw from a destructor: an error here is the stream's, reported by its next call.)
    if (!waited_)
      cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda::current_stream()),
                          static_cast<cudaEvent_t>(done_), 0);
    cuda::destroy_event(done_);
  }
  void wait() override {
    cuda::wait(done_);
    waited_ = true;
  }

 private:
  std::vector<Tensor> buffers_;  // kept alive until the side stream is done with them
  void* done_;
  bool waited_ = false;
};

/// Records the end of the work queued on @p side so far.
std::shared_ptr<RequestState> finished_on(cudaStream_t side, std::vector<Tensor> buffers) {
  void* done = cuda::create_event();
  DTP_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(done), side));
  return std::make_shared<SideStreamRequest>(std::move(buffers), done);
}
}  // namespace

cudaStream_t NcclComm::side_stream_after_inputs() {
  if (side_stream_ == nullptr)
    side_stream_ = static_cast<cudaStream_t>(cuda::create_stream(device_));
  void* inputs_ready = cuda::create_event();
  cuda::record(inputs_ready);  // on the rank's stream: the inputs are complete here
  DTP_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, static_cast<cudaEvent_t>(inputs_ready), 0));
  cuda::destroy_event(inputs_ready);
  return side_stream_;
}

std::shared_ptr<RequestState> NcclComm::iall_reduce(Tensor& x, ReduceOp op) {
  check_device("iall_reduce", x);
  agree(signature("all_reduce", x, -1, reduce_op_name(op)), "all_reduce",
        static_cast<double>(x.nbytes()));
  cudaStream_t side = side_stream_after_inputs();
  DTP_NCCL_CHECK(
      ncclAllReduce(x.raw(), x.raw(), x.numel(), nccl_type(x.dtype()), nccl_op(op), comm_, side));
  return finished_on(side, {x});
}

std::shared_ptr<RequestState> NcclComm::iall_gather(const Tensor& shard, Tensor& full) {
  check_device("iall_gather", full);
  check_device("iall_gather", shard);
  agree(signature("all_gather", full, -1, nullptr), "all_gather",
        static_cast<double>(full.nbytes()));
  cudaStream_t side = side_stream_after_inputs();
  enqueue_all_gather(shard, full, side);
  return finished_on(side, {shard, full});
}

std::shared_ptr<RequestState> NcclComm::ireduce_scatter(const Tensor& full, Tensor& shard,
                                                        ReduceOp op) {
  check_device("ireduce_scatter", full);
  check_device("ireduce_scatter", shard);
  agree(signature("reduce_scatter", full, -1, reduce_op_name(op)), "reduce_scatter",
        static_cast<double>(full.nbytes()));
  cudaStream_t side = side_stream_after_inputs();
  enqueue_reduce_scatter(full, shard, op, side);
  return finished_on(side, {full, shard});
}

void NcclComm::broadcast(Tensor& x, int root) {
  check_device("broadcast", x);
  agree(signature("broadcast", x, root, nullptr), "broadcast", static_cast<double>(x.nbytes()));
  DTP_NCCL_CHECK(ncclBroadcast(x.raw(), x.raw(), x.nbytes(), ncclUint8, root, comm_, stream_));
}

void NcclComm::reduce(Tensor& x, int root, ReduceOp op) {
  check_device("reduce", x);
  agree(signature("reduce", x, root, reduce_op_name(op)), "reduce",
        static_cast<double>(x.nbytes()));
  // The receive buffer is used on the root only: everyone passes x.
  DTP_NCCL_CHECK(ncclReduce(x.raw(), x.raw(), x.numel(), nccl_type(x.dtype()), nccl_op(op), root,
                            comm_, stream_));
}

void NcclComm::all_gather(const Tensor& shard, Tensor& full) {
  check_device("all_gather", full);
  check_device("all_gather", shard);
  agree(signature("all_gather", full, -1, nullptr), "all_gather",
        static_cast<double>(full.nbytes()));
  enqueue_all_gather(shard, full, stream_);
}

void NcclComm::enqueue_all_gather(const Tensor& shard, Tensor& full, cudaStream_t stream) {
  Tensor in = shard;
  if (full.numel() % size_ == 0) {
    DTP_NCCL_CHECK(ncclAllGather(in.raw(), full.raw(), shard.nbytes(), ncclUint8, comm_, stream));
    return;
  }
  // Uneven chunks: one broadcast per rank's chunk, in one group.
  DTP_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    ChunkRange range = chunk_range(full.numel(), size_, r);
    void* target = bytes_of(full, range.offset);
    DTP_NCCL_CHECK(ncclBroadcast(r == rank_ ? in.raw() : target, target,
                                 range.length * full.element_size(), ncclUint8, r, comm_, stream));
  }
  DTP_NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::reduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op) {
  check_device("reduce_scatter", full);
  check_device("reduce_scatter", shard);
  agree(signature("reduce_scatter", full, -1, reduce_op_name(op)), "reduce_scatter",
        static_cast<double>(full.nbytes()));
  enqueue_reduce_scatter(full, shard, op, stream_);
}

void NcclComm::enqueue_reduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op,
                                      cudaStream_t stream) {
  Tensor in = full;
  if (full.numel() % size_ == 0) {
    DTP_NCCL_CHECK(ncclReduceScatter(in.raw(), shard.raw(), shard.numel(), nccl_type(full.dtype()),
                                     nccl_op(op), comm_, stream));
    return;
  }
  // Uneven chunks: one reduce per chunk to its owner, in one group.
  DTP_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    ChunkRange range = chunk_range(full.numel(), size_, r);
    void* source = bytes_of(in, range.offset);
    DTP_NCCL_CHECK(ncclReduce(source, r == rank_ ? shard.raw() : source, range.length,
                              nccl_type(full.dtype()), nccl_op(op), r, comm_, stream));
  }
  DTP_NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::all_to_all(const Tensor& in, Tensor& out) {
  check_device("all_to_all", in);
  check_device("all_to_all", out);
  agree(signature("all_to_all", in, -1, nullptr), "all_to_all", static_cast<double>(in.nbytes()));
  Tensor source = in;
  const std::int64_t each = in.numel() / size_;
  DTP_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    DTP_NCCL_CHECK(ncclSend(bytes_of(source, r * each), each * in.element_size(), ncclUint8, r,
                            comm_, stream_));
    DTP_NCCL_CHECK(
        ncclRecv(bytes_of(out, r * each), each * out.element_size(), ncclUint8, r, comm_, stream_));
  }
  DTP_NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                            Tensor& out, const std::vector<std::int64_t>& recv_counts,
                            double cost_bytes) {
  check_device("all_to_all_v", in);
  check_device("all_to_all_v", out);
  agree(std::string("all_to_all_v(") + dtype_name(in.dtype()) + ")", "all_to_all_v", cost_bytes);
  // NCCL has no all-to-all-v: one grouped send and receive per peer. The
  // counts agree (Comm checked them), so both sides skip the same empty pairs.
  Tensor source = in;
  std::int64_t sent = 0, received = 0;
  DTP_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    if (send_counts[r] > 0)
      DTP_NCCL_CHECK(ncclSend(bytes_of(source, sent), send_counts[r] * in.element_size(), ncclUint8,
                              r, comm_, stream_));
    if (recv_counts[r] > 0)
      DTP_NCCL_CHECK(ncclRecv(bytes_of(out, received), recv_counts[r] * out.element_size(),
                              ncclUint8, r, comm_, stream_));
    sent += send_counts[r];
    received += recv_counts[r];
  }
  DTP_NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::gather(const Tensor& shard, Tensor& full, int root) {
  check_device("gather", shard);
  agree(signature("gather", shard, root, nullptr), "gather",
        static_cast<double>(shard.nbytes()) * size_);
  Tensor mine = shard;
  DTP_NCCL_CHECK(ncclGroupStart());
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      ChunkRange range = chunk_range(full.numel(), size_, r);
      if (r == root) continue;
      DTP_NCCL_CHECK(ncclRecv(bytes_of(full, range.offset), range.length * full.element_size(),
                              ncclUint8, r, comm_, stream_));
    }
  } else {
    DTP_NCCL_CHECK(ncclSend(mine.raw(), mine.nbytes(), ncclUint8, root, comm_, stream_));
  }
  DTP_NCCL_CHECK(ncclGroupEnd());
  if (rank_ == root) full.flatten().chunk(size_)[rank_].copy_from(shard);
}

void NcclComm::scatter(const Tensor& full, Tensor& shard, int root) {
  check_device("scatter", shard);
  agree(signature("scatter", shard, root, nullptr), "scatter",
        static_cast<double>(shard.nbytes()) * size_);
  Tensor source = full;
  DTP_NCCL_CHECK(ncclGroupStart());
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      ChunkRange range = chunk_range(full.numel(), size_, r);
      if (r == root) continue;
      DTP_NCCL_CHECK(ncclSend(bytes_of(source, range.offset), range.length * full.element_size(),
                              ncclUint8, r, comm_, stream_));
    }
  } else {
    DTP_NCCL_CHECK(ncclRecv(shard.raw(), shard.nbytes(), ncclUint8, root, comm_, stream_));
  }
  DTP_NCCL_CHECK(ncclGroupEnd());
  if (rank_ == root) shard.copy_from(source.flatten().chunk(size_)[rank_]);
}

void NcclComm::barrier() { agree("barrier()", "barrier", 0); }

std::shared_ptr<CommBackend> NcclComm::split(int color, int key) {
  agree("split()", "split", 0);
  ncclComm_t sub = nullptr;
  DTP_NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub, nullptr));
  int sub_rank = 0, sub_size = 0;
  DTP_NCCL_CHECK(ncclCommUserRank(sub, &sub_rank));
  DTP_NCCL_CHECK(ncclCommCount(sub, &sub_size));
  auto child = std::make_shared<NcclComm>(sub, sub_rank, sub_size, device_, world_, control_, true);
  child->clock_ = clock_;    // the same rank: the same clock
  child->outbox_ = outbox_;  // and the same stream
  return child;
}

}  // namespace dtp::nccl
