/// @file rpc.h
/// @brief Requests and responses over point-to-point messages: a server
/// rank answers whichever client asks first, in any order (the RPC a
/// parameter server stands on).
///
/// A request is one message, an f64 tensor: a header of kHeaderSize whole
/// numbers (exact below 2^53: method, key, version, payload elements and
/// the client's call number), then the payload's values. A response is the
/// same with a status in place of the method. Requests travel on
/// kRequestTag and responses on kResponseTag, the two highest tags, out of
/// the chapters' way; a lost message loses a whole request or response,
/// never half of one. The server
/// receives messages of any size (Comm::recv_any into an undefined
/// tensor); a payload travels as f64 (exact for f32) and arrives in the
/// server's dtype, on comm.device().
///
/// Nothing waits forever: Server::next() and Client::call() take how long
/// to wait. A client whose call timed out may still get that call's answer
/// later; it recognizes it by the call number and drops it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/tensor.h"

namespace dtp::rpc {

inline constexpr int kRequestTag = Comm::kMaxTag - 2;   ///< client -> server
inline constexpr int kResponseTag = Comm::kMaxTag - 1;  ///< server -> client
inline constexpr std::int64_t kHeaderSize = 5;          ///< values before the payload

/// What a response says of its request.
enum class Status : std::int64_t {
  ok = 0,              ///< answered
  unknown_method = 1,  ///< the server has no method of that number
  refused = 2,         ///< the server will not do it now (Server::refuse)
};

/// One request, as the server receives it.
struct Request {
  int client = -1;           ///< the rank that sent it
  int method = 0;            ///< index into the server's method names
  std::int64_t key = 0;      ///< what it is about (a unit's index, say)
  std::int64_t version = 0;  ///< the client's version of it
  std::int64_t call = 0;     ///< the client's call number (its responses carry it back)
  Tensor payload;            ///< undefined when the request carried none
};

/// What a call returns.
struct Response {
  Status status = Status::ok;  ///< answered, unknown method, or refused
  std::int64_t version = 0;    ///< the server's version (Server::reply's)
  Tensor payload;              ///< undefined when the response carried none
};

/// A client's call that got no answer in time.
class Timeout : public Error {
 public:
  using Error::Error;
};

/// The answering side. Methods are numbered by their place in the names
/// given (for the messages).
class Server {
 public:
  /// Serves on @p comm; payloads are of @p dtype. @p methods names each
  /// method number (at least one).
  Server(Comm& comm, std::vector<std::string> methods, DType dtype);

  /// The next request from any rank, waiting at most @p seconds (>= 0), or
  /// without a limit of its own when @p seconds is negative (then as
  /// Comm::recv_any: DTP_TIMEOUT's report). std::nullopt when none came. A
  /// request for a method the server does not have is answered with
  /// Status::unknown_method at once (its client throws) and counted in
  /// unknown(); next() goes on waiting for a good one.
  std::optional<Request> next(double seconds = -1);
  /// Answers @p request with @p payload (undefined: none) and @p version.
  void reply(const Request& request, const Tensor& payload, std::int64_t version);
  /// Answers @p request with Status::refused and @p version: the client's
  /// call returns the status (it does not throw).
  void refuse(const Request& request, std::int64_t version);

  /// Requests received so far, per method (the good ones).
  const std::vector<std::int64_t>& received() const { return received_; }
  /// Requests for unknown methods received so far.
  std::int64_t unknown() const { return unknown_; }
  /// "pull" for method 0, ...; "method 7 (unknown)" outside the list.
  std::string method_name(int method) const;

 private:
  void respond(const Request& request, Status status, const Tensor& payload, std::int64_t version);

  Comm& comm_;
  std::vector<std::string> methods_;
  DType dtype_;
  std::vector<std::int64_t> received_;
  std::int64_t unknown_ = 0;
};

/// The calling side.
class Client {
 public:
  /// Calls go to rank @p server of @p comm and wait at most
  /// @p timeout_seconds (> 0) for their answer; payloads are of @p dtype.
  /// @p methods names the method numbers, for the messages.
  Client(Comm& comm, int server, std::vector<std::string> methods, DType dtype,
         double timeout_seconds);

  /// Sends the request and waits for its response. Throws rpc::Timeout
  /// naming this rank, the server, the method, the key and the time waited
  /// when none came; dtp::Error when the server does not know the method.
  /// A refusal is returned (Response::status).
  Response call(int method, std::int64_t key, std::int64_t version, const Tensor& payload);

  /// Calls made so far.
  std::int64_t calls() const { return calls_; }

 private:
  Comm& comm_;
  int server_;
  std::vector<std::string> methods_;
  DType dtype_;
  double timeout_seconds_;
  std::int64_t calls_ = 0;
};

}  // namespace dtp::rpc
