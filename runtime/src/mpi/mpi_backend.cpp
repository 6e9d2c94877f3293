// The mpi backend. GPU tensors are staged through host copies (Debian's
// Open MPI is not CUDA-aware). Point to point: a small header (size, dtype, arrival time
// on the alpha-beta clock) travels on tag 2t and the payload on tag 2t+1, so
// posted receives match in order and a size mismatch is caught before any
// data lands. Collectives: every one opens with the check of agreement.h (a
// small polled all-reduce: did every rank call this same collective?), the
// price of a clear error instead of a hang. Once it has passed, every rank is
// inside the same collective, so the data moves in MPI's blocking call: it
// cannot hang there, and Open MPI's blocking collectives are 1.5-2x faster
// than its nonblocking ones (measured from 1 MiB; bench/README.md). The
// nonblocking i* collectives, which overlap with compute, keep MPI's own
// nonblocking calls.
#include "mpi/mpi_backend.h"

#include "comm/fault_internal.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>

#include "dtp/error.h"

namespace dtp::mpi {

namespace {

struct Header {
  double arrival = 0;
  long long numel = 0;
  int dtype = 0;
  int unused = 0;
};

int header_tag(int tag) { return 2 * tag; }
int payload_tag(int tag) { return 2 * tag + 1; }

MPI_Datatype reduction_type(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f32:
      return MPI_FLOAT;
    case DType::i32:
      return MPI_INT;
    default:
      return MPI_DATATYPE_NULL;  // bf16/f16 are reduced in f32
  }
}

MPI_Op reduction_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    default:
      return MPI_SUM;  // avg = sum, then scale
  }
}

int as_int(std::size_t bytes, const char* what) {
  DTP_CHECK(bytes <= static_cast<std::size_t>(INT32_MAX), what, ": ", bytes,
            " bytes is more than one MPI call can move (2^31 - 1)");
  return static_cast<int>(bytes);
}

/// Byte counts and displacements of the chunk_range() split of @p numel elements.
void chunk_layout(long long numel, int parts, std::size_t element_size, std::vector<int>& counts,
                  std::vector<int>& displacements) {
  counts.resize(static_cast<std::size_t>(parts));
  displacements.resize(static_cast<std::size_t>(parts));
  for (int r = 0; r < parts; ++r) {
    ChunkRange range = chunk_range(numel, parts, r);
    counts[r] = as_int(static_cast<std::size_t>(range.length) * element_size, "chunk");
    displacements[r] =
        as_int(static_cast<std::size_t>(range.offset) * element_size, "chunk offset");
  }
}

/// Reductions of bf16/f16 run on an f32 copy.
Tensor widened(const Tensor& x) {
  if (reduction_type(x.dtype()) != MPI_DATATYPE_NULL) return x;
  return Tensor::from_values(x.to_vector(), DType::f32);
}
void narrow_into(Tensor& x, const Tensor& wide) {
  if (wide.shares_storage_with(x)) return;
  for (std::int64_t i = 0; i < x.numel(); ++i) x.set_item(i, wide.item(i));
}

/// Debian's Open MPI cannot read GPU memory: GPU tensors go through a host copy.
bool on_gpu(const Tensor& x) { return x.defined() && x.device().is_cuda(); }
Tensor host_copy(const Tensor& x) { return on_gpu(x) ? x.to(Device::cpu()) : x; }

// An all-gather whose shard is already its own chunk of the output (ZeRO's
// in-place gather) must say MPI_IN_PLACE: MPI forbids overlapping buffers.
const void* send_buffer(const Tensor& shard, const Tensor& full, int displacement_bytes) {
  return shard.raw() == static_cast<const char*>(full.raw()) + displacement_bytes ? MPI_IN_PLACE
                                                                                  : shard.raw();
}

class MpiRecvRequest : public RequestState {
 public:
  MpiRecvRequest(MpiComm* comm, Tensor x, int src, int tag)
      : comm_(comm), x_(std::move(x)), src_(src), tag_(tag) {
    MPI_Comm c = comm_->traffic().comm;
    check(MPI_Irecv(&header_, sizeof(Header), MPI_BYTE, src, header_tag(tag), c, &requests_[0]),
          "MPI_Irecv");
    check(MPI_Irecv(x_.raw(), as_int(x_.nbytes(), "recv"), MPI_BYTE, src, payload_tag(tag), c,
                    &requests_[1]),
          "MPI_Irecv");
  }
  void wait() override {
    Session& session = comm_->session();
    auto describe = [&] {
      std::ostringstream what;
      what << "recv(source rank " << src_ << ", tag " << tag_ << ", " << x_.numel() << " x "
           << dtype_name(x_.dtype()) << ")";
      return what.str();
    };
    std::vector<MPI_Request> header{requests_[0]};
    session.wait(header, describe);
    if (header_.numel != x_.numel() || header_.dtype != static_cast<int>(x_.dtype())) {
      MPI_Cancel(&requests_[1]);
      std::ostringstream what;
      what << "recv on rank " << comm_->rank() << " from rank " << src_ << " (tag " << tag_
           << ") expected " << x_.numel() << " x " << dtype_name(x_.dtype())
           << " but the message holds " << header_.numel << " x "
           << dtype_name(static_cast<DType>(header_.dtype))
           << "; sender and receiver must agree on the size and dtype of every message";
      throw CommMismatch(what.str());
    }
    std::vector<MPI_Request> payload{requests_[1]};
    session.wait(payload, describe);
    session.clock = std::max(session.clock, header_.arrival);
    comm_->traffic().received[static_cast<std::size_t>(src_)] += 1;
  }

 private:
  MpiComm* comm_;
  Tensor x_;
  int src_, tag_;
  Header header_;
  MPI_Request requests_[2];
};

class MpiSendRequest : public RequestState {
 public:
  MpiSendRequest(Session& session, Tensor x, MPI_Request request, std::string what)
      : session_(session), x_(std::move(x)), request_(request), what_(std::move(what)) {}
  void wait() override {
    std::vector<MPI_Request> requests{request_};
    session_.wait(requests, [&] { return what_; });
  }

 private:
  Session& session_;
  Tensor x_;  // keeps the storage alive until MPI is done with it
  MPI_Request request_;
  std::string what_;
};

}  // namespace

MpiComm::MpiComm(std::shared_ptr<Session> session, std::shared_ptr<Traffic> traffic)
    : session_(std::move(session)), traffic_(std::move(traffic)), comm_(traffic_->comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // Which world ranks these are, for the tier of each link (a local lookup).
  MPI_Group mine, world;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(session_->world_comm(), &world);
  std::vector<int> ranks(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) ranks[static_cast<std::size_t>(r)] = r;
  world_ranks_.resize(ranks.size());
  MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_ranks_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
}

// --- point to point -------------------------------------------------------------

void MpiComm::send_header(const Tensor& x, int dst, int tag) {
  session_->reap_sends();
  const CostModel cost = session_->config().cost.for_group(
      {world_ranks_[static_cast<std::size_t>(rank_)], world_ranks_[static_cast<std::size_t>(dst)]});
  auto header = std::make_shared<Header>();
  header->arrival = charge_send(session_->clock, dst, x.nbytes(), cost);
  header->numel = x.numel();
  header->dtype = static_cast<int>(x.dtype());
  MPI_Request request;
  check(MPI_Isend(header.get(), sizeof(Header), MPI_BYTE, dst, header_tag(tag), comm_, &request),
        "MPI_Isend");
  session_->keep_until_sent(header, request);
  traffic_->sent[static_cast<std::size_t>(dst)] += 1;
}

void MpiComm::send(const Tensor& x, int dst, int tag) {
  if (on_gpu(x)) return send(host_copy(x), dst, tag);
  // Synchronous: MPI_Issend, polled like every wait until the receive is posted.
  if (session_->config().send_mode == SendMode::sync) return isend(x, dst, tag)->wait();
  send_header(x, dst, tag);
  // Eager: send a private copy so the caller may reuse x at once.
  std::shared_ptr<void> copy(std::malloc(std::max<std::size_t>(x.nbytes(), 1)), std::free);
  DTP_CHECK(copy != nullptr, "send: out of host memory copying ", x.nbytes(), " bytes");
  if (x.nbytes() > 0) std::memcpy(copy.get(), x.raw(), x.nbytes());
  MPI_Request request;
  check(MPI_Isend(copy.get(), as_int(x.nbytes(), "send"), MPI_BYTE, dst, payload_tag(tag), comm_,
                  &request),
        "MPI_Isend");
  session_->keep_until_sent(copy, request);
}

std::shared_ptr<RequestState> MpiComm::isend(const Tensor& x, int dst, int tag) {
  if (on_gpu(x)) return isend(host_copy(x), dst, tag);  // the request keeps the copy alive
  send_header(x, dst, tag);
  MPI_Request request;
  std::ostringstream what;
  if (session_->config().send_mode == SendMode::sync) {
    // Completes only once the receiver has posted the payload's receive
    // (MpiRecvRequest posts header and payload receives together).
    check(MPI_Issend(x.raw(), as_int(x.nbytes(), "isend"), MPI_BYTE, dst, payload_tag(tag), comm_,
                     &request),
          "MPI_Issend");
    what << "send(destination rank " << dst << ", tag " << tag << ", " << x.numel() << " x "
         << dtype_name(x.dtype()) << ") to be matched by a recv (DTP_SEND=sync)";
  } else {
    check(MPI_Isend(x.raw(), as_int(x.nbytes(), "isend"), MPI_BYTE, dst, payload_tag(tag), comm_,
                    &request),
          "MPI_Isend");
    what << "isend to rank " << dst << " to be received";
  }
  return std::make_shared<MpiSendRequest>(*session_, x, request, what.str());
}

namespace {
/// Receives into a host buffer, then copies to the GPU tensor.
class StagedRecvRequest : public RequestState {
 public:
  StagedRecvRequest(std::shared_ptr<RequestState> inner, Tensor host, Tensor device)
      : inner_(std::move(inner)), host_(std::move(host)), device_(std::move(device)) {}
  void wait() override {
    inner_->wait();
    device_.copy_from(host_);
  }

 private:
  std::shared_ptr<RequestState> inner_;
  Tensor host_, device_;
};
}  // namespace

std::shared_ptr<RequestState> MpiComm::irecv(Tensor& x, int src, int tag) {
  if (on_gpu(x)) {
    Tensor host = Tensor::empty(x.shape(), x.dtype(), Device::cpu(), MemoryCategory::comm);
    return std::make_shared<StagedRecvRequest>(
        std::make_shared<MpiRecvRequest>(this, host, src, tag), host, x);
  }
  return std::make_shared<MpiRecvRequest>(this, x, src, tag);
}

void MpiComm::recv(Tensor& x, int src, int tag) { irecv(x, src, tag)->wait(); }

void MpiComm::wait_for_others_to_leave() { session_->leave(); }

// A wildcard or timed receive posts nothing until a header is there (a
// probe), so giving up leaves no receive behind; then it receives from the
// header's source as recv does.
int MpiComm::receive_within(Tensor& x, int src, int tag, double seconds) {
  MPI_Status status;
  const bool arrived = session_->poll_until(
      [&] {
        int found = 0;
        check(MPI_Iprobe(src < 0 ? MPI_ANY_SOURCE : src, header_tag(tag), comm_, &found, &status),
              "MPI_Iprobe");
        return found != 0;
      },
      [&] {
        std::ostringstream what;
        what << (src < 0 ? std::string("recv_any(")
                         : "recv_for(source rank " + std::to_string(src) + ", ")
             << "tag " << tag << ", " << x.numel() << " x " << dtype_name(x.dtype()) << ")";
        return what.str();
      },
      seconds);
  if (!arrived) return -1;
  const int from = status.MPI_SOURCE;
  if (x.defined()) {
    recv(x, from, tag);
    return from;
  }
  // Any size: the header says how much to allocate, then the payload comes.
  Header header;
  MPI_Request request;
  check(MPI_Irecv(&header, sizeof(Header), MPI_BYTE, from, header_tag(tag), comm_, &request),
        "MPI_Irecv");
  finish(request, [&] { return "the header of a message from rank " + std::to_string(from); });
  x = Tensor::empty(Shape{header.numel}, static_cast<DType>(header.dtype), Device::cpu(),
                    MemoryCategory::comm);
  check(MPI_Irecv(x.raw(), as_int(x.nbytes(), "recv"), MPI_BYTE, from, payload_tag(tag), comm_,
                  &request),
        "MPI_Irecv");
  finish(request, [&] { return "the payload of a message from rank " + std::to_string(from); });
  session_->clock = std::max(session_->clock, header.arrival);
  traffic_->received[static_cast<std::size_t>(from)] += 1;
  if (session_->device.is_cuda()) x = x.to(session_->device);
  return from;
}

// --- collectives ----------------------------------------------------------------

MpiComm::Agreement MpiComm::agree(const CallSignature& call, double cost_bytes, double root_numel,
                                  const CarriedReduction& carried) {
  AgreementPacket packet(call, session_->clock, root_numel, carried);
  combine_everyones(packet, traffic_->check, [&](std::vector<MPI_Request>& requests) {
    session_->wait(requests, [&] { return call.describe() + " with the other ranks"; });
  });
  if (!packet.agreed()) {
    MPI_Request request;
    // Rare and about to fail: now spell out every rank's call.
    constexpr int kWidth = 128;
    std::vector<char> mine(kWidth, '\0'), everyone(static_cast<std::size_t>(kWidth * size_));
    std::strncpy(mine.data(), call.describe().c_str(), kWidth - 1);
    check(MPI_Iallgather(mine.data(), kWidth, MPI_CHAR, everyone.data(), kWidth, MPI_CHAR, comm_,
                         &request),
          "MPI_Iallgather");
    finish(request, [] { return std::string("the mismatch report"); });
    std::ostringstream message;
    message << "collective mismatch: ranks called different collectives at the same step:\n";
    for (int r = 0; r < size_; ++r)
      message << "  rank " << r << ": " << &everyone[static_cast<std::size_t>(r * kWidth)] << "\n";
    message << "Every rank must call the same collective with the same kind, element count, dtype, "
               "root and op.";
    throw CommMismatch(message.str());
  }
  packet.unpack(carried);
  session_->clock = packet.clock + collective_cost(call.kind, cost_bytes, size_, cost_model());
  return {packet.root_numel};
}

void MpiComm::finish(MPI_Request request, const std::function<std::string()>& describe) {
  std::vector<MPI_Request> requests{request};
  session_->wait(requests, [&] { return describe() + " with the other ranks"; });
}

void MpiComm::all_reduce(Tensor& x, ReduceOp op) {
  if (on_gpu(x)) {
    Tensor host = host_copy(x);
    all_reduce(host, op);
    return x.copy_from(host);
  }
  const CallSignature call("all_reduce", x, -1, reduce_op_name(op));
  Tensor work = widened(x);
  if (CarriedReduction::fits(work)) {
    agree(call, static_cast<double>(x.nbytes()), -1, {&work, op});  // the data rode with the check
  } else {
    agree(call, static_cast<double>(x.nbytes()));
    check(MPI_Allreduce(MPI_IN_PLACE, work.raw(),
                        as_int(static_cast<std::size_t>(work.numel()), "all_reduce"),
                        reduction_type(work.dtype()), reduction_op(op), comm_),
          "MPI_Allreduce");
  }
  if (op == ReduceOp::avg) ops::scale(work, 1.0 / size_);
  narrow_into(x, work);
}

namespace {
/// MPI's own nonblocking all-reduce; wait() polls it like every MPI wait.
class MpiCollectiveRequest : public RequestState {
 public:
  MpiCollectiveRequest(Session& session, MPI_Request request, Tensor x, Tensor work, double scale)
      : session_(session),
        request_(request),
        x_(std::move(x)),
        work_(std::move(work)),
        scale_(scale) {}
  void wait() override {
    std::vector<MPI_Request> requests{request_};
    session_.wait(requests,
                  [] { return std::string("a non-blocking all_reduce with the other ranks"); });
    if (scale_ != 1.0) ops::scale(work_, scale_);
    narrow_into(x_, work_);
  }

 private:
  Session& session_;
  MPI_Request request_;
  Tensor x_, work_;
  double scale_;
};
}  // namespace

std::shared_ptr<RequestState> MpiComm::iall_reduce(Tensor& x, ReduceOp op) {
  // The check meets the other ranks first; the reduction itself then
  // proceeds while this rank computes (MPI advances it in every MPI call).
  // A small one is already done when the check returns.
  DTP_CHECK(
      !on_gpu(x),
      "iall_reduce on the mpi backend needs a host tensor (GPU tensors: use the nccl backend)");
  const CallSignature call("all_reduce", x, -1, reduce_op_name(op));
  Tensor work = widened(x);
  MPI_Request request = MPI_REQUEST_NULL;
  if (CarriedReduction::fits(work)) {
    agree(call, static_cast<double>(x.nbytes()), -1, {&work, op});
  } else {
    agree(call, static_cast<double>(x.nbytes()));
    check(MPI_Iallreduce(MPI_IN_PLACE, work.raw(),
                         as_int(static_cast<std::size_t>(work.numel()), "iall_reduce"),
                         reduction_type(work.dtype()), reduction_op(op), comm_, &request),
          "MPI_Iallreduce");
  }
  return std::make_shared<MpiCollectiveRequest>(*session_, request, x, work,
                                                op == ReduceOp::avg ? 1.0 / size_ : 1.0);
}

namespace {
/// A started MPI_Iallgatherv or MPI_Ireduce_scatter. MPI reads the buffers and
/// the count arrays until the request completes, so this keeps them alive;
/// wait() polls like every MPI wait, then runs @p finish (scale, narrow,
/// copy a staged result to the GPU).
class MpiShardedRequest : public RequestState {
 public:
  MpiShardedRequest(Session& session, std::string what)
      : session_(session), what_(std::move(what)) {}
  void wait() override {
    std::vector<MPI_Request> requests{request};
    session_.wait(requests, [&] { return "a non-blocking " + what_ + " with the other ranks"; });
    if (finish) finish();
  }

  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<Tensor> buffers;             // what MPI reads or writes
  std::vector<int> counts, displacements;  // MPI's v-collectives read these until completion
  std::function<void()> finish;

 private:
  Session& session_;
  std::string what_;
};
}  // namespace

std::shared_ptr<RequestState> MpiComm::iall_gather(const Tensor& shard, Tensor& full) {
  // As iall_reduce: the signature check meets the other ranks now, the data
  // moves while this rank computes. GPU tensors are staged through the host.
  agree(CallSignature("all_gather", full, -1, nullptr), static_cast<double>(full.nbytes()));
  auto pending = std::make_shared<MpiShardedRequest>(*session_, "all_gather");
  Tensor input = host_copy(shard);
  Tensor output =
      on_gpu(full) ? Tensor::empty(full.shape(), full.dtype(), Device::cpu(), MemoryCategory::comm)
                   : full;
  chunk_layout(full.numel(), size_, full.element_size(), pending->counts, pending->displacements);
  check(MPI_Iallgatherv(send_buffer(input, output, pending->displacements[rank_]),
                        pending->counts[rank_], MPI_BYTE, output.raw(), pending->counts.data(),
                        pending->displacements.data(), MPI_BYTE, comm_, &pending->request),
        "MPI_Iallgatherv");
  pending->buffers = {input, output};
  if (on_gpu(full))
    pending->finish = [target = full, output]() mutable { target.copy_from(output); };
  return pending;
}

std::shared_ptr<RequestState> MpiComm::ireduce_scatter(const Tensor& full, Tensor& shard,
                                                       ReduceOp op) {
  agree(CallSignature("reduce_scatter", full, -1, reduce_op_name(op)),
        static_cast<double>(full.nbytes()));
  auto pending = std::make_shared<MpiShardedRequest>(*session_, "reduce_scatter");
  // bf16/f16 reduce in f32; GPU tensors through the host. Either way MPI
  // works on a host buffer of its own and finish() writes the shard.
  Tensor input = widened(host_copy(full));
  const bool direct = !on_gpu(shard) && reduction_type(shard.dtype()) != MPI_DATATYPE_NULL;
  Tensor output =
      direct ? shard
             : Tensor::zeros({shard.numel()}, input.dtype(), Device::cpu(), MemoryCategory::comm);
  pending->counts.resize(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r)
    pending->counts[r] = static_cast<int>(chunk_range(full.numel(), size_, r).length);
  check(MPI_Ireduce_scatter(input.raw(), output.raw(), pending->counts.data(),
                            reduction_type(input.dtype()), reduction_op(op), comm_,
                            &pending->request),
        "MPI_Ireduce_scatter");
  pending->buffers = {input, output};
  const double scale = op == ReduceOp::avg ? 1.0 / size_ : 1.0;
  pending->finish = [target = shard, output, scale, direct]() mutable {
    if (scale != 1.0) ops::scale(output, scale);
    if (direct) return;
    if (output.dtype() == target.dtype()) return target.copy_from(output);  // a staged GPU shard
    Tensor narrow = on_gpu(target) ? Tensor::empty(target.shape(), target.dtype(), Device::cpu(),
                                                   MemoryCategory::comm)
                                   : target;
    narrow_into(narrow, output);
    if (on_gpu(target)) target.copy_from(narrow);
  };
  return pending;
}

void MpiComm::broadcast(Tensor& x, int root) {
  if (on_gpu(x)) {
    Tensor host = host_copy(x);
    broadcast(host, root);
    return x.copy_from(host);
  }
  agree(CallSignature("broadcast", x, root, nullptr), static_cast<double>(x.nbytes()));
  check(MPI_Bcast(x.raw(), as_int(x.nbytes(), "broadcast"), MPI_BYTE, root, comm_), "MPI_Bcast");
}

void MpiComm::reduce(Tensor& x, int root, ReduceOp op) {
  if (on_gpu(x)) {
    Tensor host = host_copy(x);
    reduce(host, root, op);
    return x.copy_from(host);
  }
  Tensor work = widened(x);
  agree(CallSignature("reduce", x, root, reduce_op_name(op)), static_cast<double>(x.nbytes()));
  const int count = as_int(static_cast<std::size_t>(work.numel()), "reduce");
  if (rank_ == root) {
    check(MPI_Reduce(MPI_IN_PLACE, work.raw(), count, reduction_type(work.dtype()),
                     reduction_op(op), root, comm_),
          "MPI_Reduce");
  } else {
    check(MPI_Reduce(work.raw(), nullptr, count, reduction_type(work.dtype()), reduction_op(op),
                     root, comm_),
          "MPI_Reduce");
  }
  if (rank_ == root) {
    if (op == ReduceOp::avg) ops::scale(work, 1.0 / size_);
    narrow_into(x, work);
  }
}

void MpiComm::all_gather(const Tensor& shard, Tensor& full) {
  if (on_gpu(full) || on_gpu(shard)) {
    Tensor host = host_copy(full);
    all_gather(host_copy(shard), host);
    return full.copy_from(host);
  }
  agree(CallSignature("all_gather", full, -1, nullptr), static_cast<double>(full.nbytes()));
  std::vector<int> counts, displacements;
  chunk_layout(full.numel(), size_, full.element_size(), counts, displacements);
  check(MPI_Allgatherv(send_buffer(shard, full, displacements[rank_]), counts[rank_], MPI_BYTE,
                       full.raw(), counts.data(), displacements.data(), MPI_BYTE, comm_),
        "MPI_Allgatherv");
}

void MpiComm::reduce_scatter(const Tensor& full, Tensor& shard, ReduceOp op) {
  if (on_gpu(full) || on_gpu(shard)) {
    Tensor host = host_copy(shard);
    reduce_scatter(host_copy(full), host, op);
    return shard.copy_from(host);
  }
  Tensor in = widened(full);
  Tensor out = reduction_type(shard.dtype()) == MPI_DATATYPE_NULL
                   ? Tensor::zeros({shard.numel()}, DType::f32)
                   : shard;
  agree(CallSignature("reduce_scatter", full, -1, reduce_op_name(op)),
        static_cast<double>(full.nbytes()));
  std::vector<int> counts(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r)
    counts[r] = static_cast<int>(chunk_range(full.numel(), size_, r).length);
  check(MPI_Reduce_scatter(in.raw(), out.raw(), counts.data(), reduction_type(in.dtype()),
                           reduction_op(op), comm_),
        "MPI_Reduce_scatter");
  if (op == ReduceOp::avg) ops::scale(out, 1.0 / size_);
  narrow_into(shard, out);
}

void MpiComm::all_to_all(const Tensor& in, Tensor& out) {
  if (on_gpu(in) || on_gpu(out)) {
    Tensor host = host_copy(out);
    all_to_all(host_copy(in), host);
    return out.copy_from(host);
  }
  agree(CallSignature("all_to_all", in, -1, nullptr), static_cast<double>(in.nbytes()));
  const int bytes_each = as_int(in.nbytes() / static_cast<std::size_t>(size_), "all_to_all");
  check(MPI_Alltoall(in.raw(), bytes_each, MPI_BYTE, out.raw(), bytes_each, MPI_BYTE, comm_),
        "MPI_Alltoall");
}

void MpiComm::all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                           Tensor& out, const std::vector<std::int64_t>& recv_counts,
                           double cost_bytes) {
  if (on_gpu(in) || on_gpu(out)) {
    Tensor host = host_copy(out);
    all_to_all_v(host_copy(in), send_counts, host, recv_counts, cost_bytes);
    return out.copy_from(host);
  }
  agree(CallSignature("all_to_all_v", dtype_name(in.dtype())), cost_bytes);
  // MPI counts in bytes, as ints, with explicit displacements.
  auto layout = [&](const std::vector<std::int64_t>& counts, std::vector<int>& bytes,
                    std::vector<int>& at) {
    std::size_t offset = 0;
    for (std::int64_t c : counts) {
      const std::size_t b = static_cast<std::size_t>(c) * in.element_size();
      bytes.push_back(as_int(b, "all_to_all_v"));
      at.push_back(as_int(offset, "all_to_all_v"));
      offset += b;
    }
  };
  std::vector<int> send_bytes, send_at, recv_bytes, recv_at;
  layout(send_counts, send_bytes, send_at);
  layout(recv_counts, recv_bytes, recv_at);
  check(MPI_Alltoallv(in.raw(), send_bytes.data(), send_at.data(), MPI_BYTE, out.raw(),
                      recv_bytes.data(), recv_at.data(), MPI_BYTE, comm_),
        "MPI_Alltoallv");
}

void MpiComm::gather(const Tensor& shard, Tensor& full, int root) {
  if (on_gpu(shard) || on_gpu(full)) {
    Tensor host = host_copy(full);
    gather(host_copy(shard), host, root);
    if (rank_ == root) full.copy_from(host);
    return;
  }
  Agreement agreed = agree(CallSignature("gather", Tensor(), root, dtype_name(shard.dtype())),
                           static_cast<double>(shard.nbytes()) * size_,
                           rank_ == root ? static_cast<double>(full.numel()) : -1);
  const auto root_numel = static_cast<long long>(agreed.root_numel);
  DTP_CHECK(shard.numel() == chunk_range(root_numel, size_, rank_).length, "gather: rank ", rank_,
            "'s shard holds ", shard.numel(), " elements but chunk ", rank_, " of root's ",
            root_numel, "-element buffer has ", chunk_range(root_numel, size_, rank_).length);
  std::vector<int> counts, displacements;
  chunk_layout(root_numel, size_, shard.element_size(), counts, displacements);
  // Nonblocking and polled: a rank whose shard failed the check above has
  // thrown, and the others must not wait for it inside MPI.
  MPI_Request request;
  check(MPI_Igatherv(shard.raw(), counts[rank_], MPI_BYTE, rank_ == root ? full.raw() : nullptr,
                     counts.data(), displacements.data(), MPI_BYTE, root, comm_, &request),
        "MPI_Igatherv");
  finish(request, [] { return std::string("gather"); });
}

void MpiComm::scatter(const Tensor& full, Tensor& shard, int root) {
  if (on_gpu(shard) || on_gpu(full)) {
    Tensor host = host_copy(shard);
    scatter(host_copy(full), host, root);
    return shard.copy_from(host);
  }
  Agreement agreed = agree(CallSignature("scatter", Tensor(), root, dtype_name(shard.dtype())),
                           static_cast<double>(shard.nbytes()) * size_,
                           rank_ == root ? static_cast<double>(full.numel()) : -1);
  const auto root_numel = static_cast<long long>(agreed.root_numel);
  DTP_CHECK(shard.numel() == chunk_range(root_numel, size_, rank_).length, "scatter: rank ", rank_,
            "'s shard holds ", shard.numel(), " elements but chunk ", rank_, " of root's ",
            root_numel, "-element buffer has ", chunk_range(root_numel, size_, rank_).length);
  std::vector<int> counts, displacements;
  chunk_layout(root_numel, size_, shard.element_size(), counts, displacements);
  MPI_Request request;  // polled, as in gather
  check(MPI_Iscatterv(rank_ == root ? full.raw() : nullptr, counts.data(), displacements.data(),
                      MPI_BYTE, shard.raw(), counts[rank_], MPI_BYTE, root, comm_, &request),
        "MPI_Iscatterv");
  finish(request, [] { return std::string("scatter"); });
}

void MpiComm::barrier() {
  // The check is an all-reduce, which no rank leaves before every rank has
  // entered it: it is the barrier.
  agree(CallSignature("barrier", nullptr), 0);
}

std::shared_ptr<CommBackend> MpiComm::split(int color, int key) {
  // Once every rank agreed it is inside split, the blocking call cannot hang.
  agree(CallSignature("split", nullptr), 0);
  auto traffic = std::make_shared<Traffic>();
  check(MPI_Comm_split(comm_, color, key, &traffic->comm), "MPI_Comm_split");
  MPI_Comm_set_errhandler(traffic->comm, MPI_ERRORS_RETURN);
  check(MPI_Comm_dup(traffic->comm, &traffic->check), "MPI_Comm_dup");
  int size = 1;
  MPI_Comm_size(traffic->comm, &size);
  traffic->sent.assign(static_cast<std::size_t>(size), 0);
  traffic->received.assign(static_cast<std::size_t>(size), 0);
  session_->traffic.push_back(traffic);
  return std::make_shared<MpiComm>(session_, traffic);
}

// --- end of launch --------------------------------------------------------------

std::string collect_undelivered(Session& session) {
  std::ostringstream report;
  for (const auto& t : session.traffic) {
    int size = 0, rank = 0;
    MPI_Comm_size(t->comm, &size);
    MPI_Comm_rank(t->comm, &rank);
    std::vector<long long> expected(static_cast<std::size_t>(size));
    MPI_Request request;
    check(MPI_Ialltoall(t->sent.data(), 1, MPI_LONG_LONG, expected.data(), 1, MPI_LONG_LONG,
                        t->comm, &request),
          "MPI_Ialltoall");
    std::vector<MPI_Request> requests{request};
    session.wait(requests, [] { return std::string("the end-of-launch message count"); });
    for (int source = 0; source < size; ++source) {
      for (long long k = t->received[source]; k < expected[source]; ++k) {
        // Receive the leftover header and payload so the sender can finish.
        Header header;
        MPI_Status status;
        check(MPI_Recv(&header, sizeof(Header), MPI_BYTE, source, MPI_ANY_TAG, t->comm, &status),
              "MPI_Recv");
        std::vector<char> sink(static_cast<std::size_t>(header.numel) *
                                   dtype_size(static_cast<DType>(header.dtype)) +
                               1);
        check(MPI_Recv(sink.data(), static_cast<int>(sink.size()), MPI_BYTE, source,
                       status.MPI_TAG + 1, t->comm, MPI_STATUS_IGNORE),
              "MPI_Recv");
        if (fault::detail::is_down(session.rank())) continue;  // it left: nobody was to receive
        report << "  rank " << source << " -> rank " << rank << ", tag " << status.MPI_TAG / 2
               << ": " << header.numel << " x " << dtype_name(static_cast<DType>(header.dtype))
               << "\n";
      }
    }
  }
  session.finish_sends();
  return report.str();
}

}  // namespace dtp::mpi
