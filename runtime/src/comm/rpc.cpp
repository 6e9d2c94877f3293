// Requests and responses over point-to-point messages (dtp/rpc.h).
#include "dtp/rpc.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>

namespace dtp::rpc {
namespace {

// Header fields, in order.
enum Field { kMethodOrStatus, kKey, kVersion, kElements, kCall };

Tensor header_of(std::int64_t method_or_status, std::int64_t key, std::int64_t version,
                 std::int64_t elements, std::int64_t call, Device device) {
  std::vector<double> values(kHeaderSize);
  values[kMethodOrStatus] = static_cast<double>(method_or_status);
  values[kKey] = static_cast<double>(key);
  values[kVersion] = static_cast<double>(version);
  values[kElements] = static_cast<double>(elements);
  values[kCall] = static_cast<double>(call);
  return Tensor::from_values(values, DType::f64, device);
}

std::int64_t field(const std::vector<double>& header, Field f) {
  return static_cast<std::int64_t>(header[static_cast<std::size_t>(f)]);
}

std::string name_of(const std::vector<std::string>& methods, int method) {
  if (method >= 0 && method < static_cast<int>(methods.size()))
    return methods[static_cast<std::size_t>(method)];
  return "method " + std::to_string(method) + " (unknown)";
}

std::string list_of(const std::vector<std::string>& methods) {
  std::string out;
  for (std::size_t i = 0; i < methods.size(); ++i)
    out += (i ? ", " : "") + std::to_string(i) + " " + methods[i];
  return out;
}

// The payload a header announces, received from @p source on @p tag.
Tensor receive_payload(Comm& comm, std::int64_t elements, DType dtype, int source, int tag) {
  if (elements == 0) return Tensor();
  Tensor payload = Tensor::empty(Shape{elements}, dtype, comm.device(), MemoryCategory::comm);
  comm.recv(payload, source, tag);
  return payload;
}

}  // namespace

// --- server ----------------------------------------------------------------------------

Server::Server(Comm& comm, std::vector<std::string> methods, DType dtype)
    : comm_(comm), methods_(std::move(methods)), dtype_(dtype), received_(methods_.size(), 0) {
  DTP_CHECK(!methods_.empty(), "rpc::Server: give at least one method name");
}

std::string Server::method_name(int method) const { return name_of(methods_, method); }

std::optional<Request> Server::next(double seconds) {
  DTP_CHECK(!(seconds >= 0) || std::isfinite(seconds),
            "rpc::Server::next: seconds must be finite, got ", seconds);
  const auto start = std::chrono::steady_clock::now();
  Tensor header =
      Tensor::empty(Shape{kHeaderSize}, DType::f64, comm_.device(), MemoryCategory::comm);
  for (;;) {
    int from;
    if (seconds < 0) {
      from = comm_.recv_any(header, kRequestTag);
    } else {
      const double left =
          seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      from = comm_.recv_any_for(header, kRequestTag, std::max(0.0, left));
      if (from < 0) return std::nullopt;
    }
    const std::vector<double> h = header.to_vector();
    Request request;
    request.client = from;
    request.method = static_cast<int>(field(h, kMethodOrStatus));
    request.key = field(h, kKey);
    request.version = field(h, kVersion);
    request.call = field(h, kCall);
    request.payload = receive_payload(comm_, field(h, kElements), dtype_, from, kRequestPayloadTag);
    if (request.method < 0 || request.method >= static_cast<int>(methods_.size())) {
      ++unknown_;
      respond(request, Status::unknown_method, Tensor(), 0);
      continue;
    }
    ++received_[static_cast<std::size_t>(request.method)];
    return request;
  }
}

void Server::reply(const Request& request, const Tensor& payload, std::int64_t version) {
  respond(request, Status::ok, payload, version);
}

void Server::refuse(const Request& request, std::int64_t version) {
  respond(request, Status::refused, Tensor(), version);
}

void Server::respond(const Request& request, Status status, const Tensor& payload,
                     std::int64_t version) {
  DTP_CHECK(!payload.defined() || payload.dtype() == dtype_, "rpc::Server: a ",
            method_name(request.method), " reply of ", dtype_name(payload.dtype()),
            "; this server's payloads are ", dtype_name(dtype_));
  const std::int64_t elements = payload.defined() ? payload.numel() : 0;
  comm_.send(header_of(static_cast<std::int64_t>(status), request.key, version, elements,
                       request.call, comm_.device()),
             request.client, kResponseTag);
  if (elements > 0) comm_.send(payload.flatten(), request.client, kResponsePayloadTag);
}

// --- client ----------------------------------------------------------------------------

Client::Client(Comm& comm, int server, std::vector<std::string> methods, DType dtype,
               double timeout_seconds)
    : comm_(comm),
      server_(server),
      methods_(std::move(methods)),
      dtype_(dtype),
      timeout_seconds_(timeout_seconds) {
  DTP_CHECK(server >= 0 && server < comm.size(), "rpc::Client: server rank ", server,
            " is not a rank of a communicator of ", comm.size());
  DTP_CHECK(server != comm.rank(), "rpc::Client: rank ", comm.rank(),
            " cannot be a client of itself");
  DTP_CHECK(std::isfinite(timeout_seconds) && timeout_seconds > 0,
            "rpc::Client: timeout_seconds must be finite and > 0, got ", timeout_seconds);
}

Response Client::call(int method, std::int64_t key, std::int64_t version, const Tensor& payload) {
  DTP_CHECK(!payload.defined() || payload.dtype() == dtype_, "rpc::Client: a ",
            name_of(methods_, method), " request of ", dtype_name(payload.dtype()),
            "; this client's payloads are ", dtype_name(dtype_));
  const std::int64_t number = ++calls_;
  const std::int64_t elements = payload.defined() ? payload.numel() : 0;
  comm_.send(header_of(method, key, version, elements, number, comm_.device()), server_,
             kRequestTag);
  if (elements > 0) comm_.send(payload.flatten(), server_, kRequestPayloadTag);

  const auto start = std::chrono::steady_clock::now();
  Tensor header =
      Tensor::empty(Shape{kHeaderSize}, DType::f64, comm_.device(), MemoryCategory::comm);
  for (;;) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!comm_.recv_for(header, server_, kResponseTag, std::max(0.0, timeout_seconds_ - waited))) {
      char text[160];
      std::snprintf(text, sizeof text, "%.3g", timeout_seconds_);
      throw Timeout("rpc: rank " + std::to_string(comm_.rank()) + " called " +
                    name_of(methods_, method) + "(key " + std::to_string(key) +
                    ") on server rank " + std::to_string(server_) + " and got no answer in " +
                    text + " s: the server is down, stopped serving, or busy for longer");
    }
    const std::vector<double> h = header.to_vector();
    Response response;
    response.status = static_cast<Status>(field(h, kMethodOrStatus));
    response.version = field(h, kVersion);
    response.payload =
        receive_payload(comm_, field(h, kElements), dtype_, server_, kResponsePayloadTag);
    if (field(h, kCall) != number) continue;  // the late answer of a call that timed out
    if (response.status == Status::unknown_method)
      throw Error("rpc: server rank " + std::to_string(server_) + " does not serve " +
                  name_of(methods_, method) + " (number " + std::to_string(method) +
                  ") that rank " + std::to_string(comm_.rank()) + " called; this client knows " +
                  list_of(methods_));
    return response;
  }
}

}  // namespace dtp::rpc
