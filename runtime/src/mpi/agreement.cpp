#include "mpi/agreement.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "dtp/error.h"
#include "mpi/mpi_check.h"

namespace dtp::mpi {

CallSignature::CallSignature(const char* kind, const Tensor& x, int root, const char* detail)
    : kind(kind), root(root), detail(detail) {
  if (x.defined()) numel = x.numel(), dtype = static_cast<int>(x.dtype());
}

std::uint64_t CallSignature::hash() const {
  // FNV-1a over the parts: no allocation, a few nanoseconds per call.
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  mix(kind, std::strlen(kind));
  mix(&numel, sizeof numel);
  mix(&dtype, sizeof dtype);
  mix(&root, sizeof root);
  if (detail) mix(detail, std::strlen(detail));
  return h & ((1ull << 52) - 1);
}

std::string CallSignature::describe() const {
  std::ostringstream out;
  const char* separator = "";
  out << kind << "(";
  if (numel >= 0) out << numel << " x " << dtype_name(static_cast<DType>(dtype)), separator = ", ";
  if (root >= 0) out << separator << "root " << root, separator = ", ";
  if (detail) out << separator << detail;
  out << ")";
  return out.str();
}

AgreementPacket::AgreementPacket(const CallSignature& call, double clock, double root_numel,
                                 const CarriedReduction& carried)
    : clock(clock), root_numel(root_numel) {
  const double h = static_cast<double>(call.hash());
  hash_max = h;
  hash_min_negated = -h;
  if (!carried.data) return;
  const Tensor& x = *carried.data;
  DTP_CHECK(CarriedReduction::fits(x), "the collective check carries at most ",
            CarriedReduction::kCarriedBytes, " bytes, not ", x.nbytes());
  payload_dtype = static_cast<std::int32_t>(x.dtype());
  payload_op = static_cast<std::int32_t>(carried.op == ReduceOp::avg ? ReduceOp::sum : carried.op);
  payload_count = static_cast<std::int32_t>(x.numel());
  if (x.nbytes() > 0) std::memcpy(payload, x.raw(), x.nbytes());
}

void AgreementPacket::unpack(const CarriedReduction& carried) const {
  if (carried.data && carried.data->nbytes() > 0)
    std::memcpy(carried.data->raw(), payload, carried.data->nbytes());
}

namespace {

/// high = low (op) high over the payload's elements. Packets are plain
/// aligned structs here, so the payload is read as T directly.
template <typename T>
void reduce_payload(const unsigned char* low_bytes, unsigned char* high_bytes, int count,
                    ReduceOp op) {
  const auto* low = reinterpret_cast<const T*>(low_bytes);
  auto* high = reinterpret_cast<T*>(high_bytes);
  for (int i = 0; i < count; ++i) {
    const T a = low[i], b = high[i];
    high[i] = op == ReduceOp::max   ? std::max(a, b)
              : op == ReduceOp::min ? std::min(a, b)
                                    : static_cast<T>(a + b);
  }
}

/// high = low (op) high, every field. Both partners of a round call it with
/// the lower rank's packet first, so both hold the same bits afterwards.
void combine_into(const AgreementPacket& low, AgreementPacket& high) {
  // Reduce the data only while every rank seen so far made the same call:
  // then the payloads hold the same count of the same dtype.
  if (low.agreed() && high.agreed() && low.hash_max == high.hash_max && low.payload_count > 0) {
    const auto op = static_cast<ReduceOp>(low.payload_op);
    switch (static_cast<DType>(low.payload_dtype)) {
      case DType::f32:
        reduce_payload<float>(low.payload, high.payload, low.payload_count, op);
        break;
      case DType::f64:
        reduce_payload<double>(low.payload, high.payload, low.payload_count, op);
        break;
      case DType::i32:
        reduce_payload<std::int32_t>(low.payload, high.payload, low.payload_count, op);
        break;
      default:
        break;  // bf16 and f16 are widened to f32 before they travel
    }
  }
  high.hash_max = std::max(low.hash_max, high.hash_max);
  high.hash_min_negated = std::max(low.hash_min_negated, high.hash_min_negated);
  high.clock = std::max(low.clock, high.clock);
  high.root_numel = std::max(low.root_numel, high.root_numel);
}

constexpr int kPacketTag = 0;
constexpr int kPacketBytes = static_cast<int>(sizeof(AgreementPacket));

}  // namespace

void combine_everyones(AgreementPacket& packet, MPI_Comm comm, const WaitFor& wait) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int doubling = 1;  // the largest power of two <= size
  while (doubling * 2 <= size) doubling *= 2;
  const int extra = size - doubling;  // rank doubling + i folds into rank i first

  AgreementPacket theirs;
  std::vector<MPI_Request> requests;
  requests.reserve(2);
  auto exchange = [&](int peer, bool send, bool receive) {
    requests.clear();
    if (receive) {
      requests.emplace_back();
      check(MPI_Irecv(&theirs, kPacketBytes, MPI_BYTE, peer, kPacketTag, comm, &requests.back()),
            "MPI_Irecv");
    }
    if (send) {
      requests.emplace_back();
      check(MPI_Isend(&packet, kPacketBytes, MPI_BYTE, peer, kPacketTag, comm, &requests.back()),
            "MPI_Isend");
    }
    wait(requests);
  };
  auto keep_combined = [&](int peer) {  // both partners: lower rank's packet first
    if (rank < peer) {
      combine_into(packet, theirs);
      packet = theirs;
    } else {
      combine_into(theirs, packet);
    }
  };

  if (rank >= doubling) {  // hand this packet over, then receive everyone's
    exchange(rank - doubling, /*send=*/true, /*receive=*/false);
    exchange(rank - doubling, /*send=*/false, /*receive=*/true);
    packet = theirs;
    return;
  }
  if (rank < extra) {
    exchange(rank + doubling, false, true);
    keep_combined(rank + doubling);
  }
  for (int mask = 1; mask < doubling; mask *= 2) {
    exchange(rank ^ mask, true, true);
    keep_combined(rank ^ mask);
  }
  if (rank < extra) exchange(rank + doubling, true, false);
}

}  // namespace dtp::mpi
