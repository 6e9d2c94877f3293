// Requests and responses over point-to-point messages (dtp/rpc.h).
#include "dtp/rpc.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>

#include "dtp/nn_ops.h"

namespace dtp::rpc {
namespace {

// Header fields, in order.
enum Field { kMethodOrStatus, kKey, kVersion, kElements, kCall };

// One message: the header's five numbers, then the payload as f64.
Tensor message_of(std::int64_t method_or_status, std::int64_t key, std::int64_t version,
                  const Tensor& payload, std::int64_t call, Device device) {
  const std::int64_t elements = payload.defined() ? payload.numel() : 0;
  Tensor message =
      Tensor::empty(Shape{kHeaderSize + elements}, DType::f64, device, MemoryCategory::comm);
  message.slice(0, kHeaderSize)
      .copy_from(Tensor::from_values(
          {static_cast<double>(method_or_status), static_cast<double>(key),
           static_cast<double>(version), static_cast<double>(elements), static_cast<double>(call)},
          DType::f64));
  if (elements > 0) {
    Tensor values = message.slice(kHeaderSize, elements);
    ops::cast(payload.flatten(), values);
  }
  return message;
}

// A received message's header fields.
std::vector<double> header_of(const Tensor& message) {
  DTP_CHECK(message.dtype() == DType::f64 && message.numel() >= kHeaderSize, "rpc: a message of ",
            message.numel(), " x ", dtype_name(message.dtype()), " is not a request or response (",
            kHeaderSize, " f64 header values first)");
  return message.slice(0, kHeaderSize).to_vector();
}

std::int64_t field(const std::vector<double>& header, Field f) {
  return static_cast<std::int64_t>(header[static_cast<std::size_t>(f)]);
}

// The payload a message carries, in @p dtype (undefined when none).
Tensor payload_of(const Tensor& message, const std::vector<double>& header, DType dtype) {
  const std::int64_t elements = field(header, kElements);
  DTP_CHECK(message.numel() == kHeaderSize + elements, "rpc: a message announces ", elements,
            " payload values but carries ", message.numel() - kHeaderSize);
  if (elements == 0) return Tensor();
  Tensor payload = Tensor::empty(Shape{elements}, dtype, message.device(), MemoryCategory::comm);
  ops::cast(message.slice(kHeaderSize, elements), payload);
  return payload;
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

}  // namespace

// --- server ----------------------------------------------------------------------------

Server::Server(Comm& comm, std::vector<std::string> methods, DType dtype)
    : comm_(comm), methods_(std::move(methods)), dtype_(dtype), received_(methods_.size(), 0) {
  DTP_CHECK(!methods_.empty(), "rpc::Server: give at least one method name");
}

std::string Server::method_name(int method) const { return name_of(methods_, method); }

std::optional<Request> Server::next(double seconds) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    Tensor message;  // any size: the request's header and payload
    int from;
    if (seconds < 0) {
      from = comm_.recv_any(message, kRequestTag);
    } else {
      const double left =
          seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      from = comm_.recv_any_for(message, kRequestTag, std::max(0.0, left));
      if (from < 0) return std::nullopt;
    }
    const std::vector<double> h = header_of(message);
    Request request;
    request.client = from;
    request.method = static_cast<int>(field(h, kMethodOrStatus));
    request.key = field(h, kKey);
    request.version = field(h, kVersion);
    request.call = field(h, kCall);
    request.payload = payload_of(message, h, dtype_);
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
  comm_.send(message_of(static_cast<std::int64_t>(status), request.key, version, payload,
                        request.call, comm_.device()),
             request.client, kResponseTag);
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
  comm_.send(message_of(method, key, version, payload, number, comm_.device()), server_,
             kRequestTag);

  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Tensor message;  // any size
    if (!comm_.recv_for(message, server_, kResponseTag, std::max(0.0, timeout_seconds_ - waited))) {
      char text[160];
      std::snprintf(text, sizeof text, "%.3g", timeout_seconds_);
      throw Timeout("rpc: rank " + std::to_string(comm_.rank()) + " called " +
                    name_of(methods_, method) + "(key " + std::to_string(key) +
                    ") on server rank " + std::to_string(server_) + " and got no answer in " +
                    text + " s: the server is down, stopped serving, or busy for longer");
    }
    const std::vector<double> h = header_of(message);
    if (field(h, kCall) != number) continue;  // the late answer of a call that timed out
    Response response;
    response.status = static_cast<Status>(field(h, kMethodOrStatus));
    response.version = field(h, kVersion);
    response.payload = payload_of(message, h, dtype_);
    if (response.status == Status::unknown_method)
      throw Error("rpc: server rank " + std::to_string(server_) + " does not serve " +
                  name_of(methods_, method) + " (number " + std::to_string(method) +
                  ") that rank " + std::to_string(comm_.rank()) + " called; this client knows " +
                  list_of(methods_));
    return response;
  }
}

}  // namespace dtp::rpc
