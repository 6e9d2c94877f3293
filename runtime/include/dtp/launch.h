/// @file launch.h
/// @brief launch(): run a function on every rank of a world and report failures.
#pragma once

#include <exception>
#include <functional>
#include <stdexcept>
#include <string>

#include "dtp/comm.h"

namespace dtp {

/// Which implementation of Comm a world uses.
enum class Backend { thread, mpi, nccl };
/// "thread", "mpi" or "nccl".
const char* backend_name(Backend backend);
/// Parses a name written by backend_name(); throws dtp::Error otherwise.
Backend parse_backend(const std::string& name);

/// Seconds a blocking call waits before it fails: DTP_TIMEOUT, or 60.
/// Throws dtp::Error unless it is a positive, finite number; values above
/// 10^7 s (about four months) are clamped to that.
double default_timeout_seconds();

/// What send() waits for. Real MPI sends small messages eagerly (copied into
/// a buffer, send returns at once) and large ones by rendezvous (send returns
/// only once the receiver has posted the matching receive). A program that is
/// correct only because sends are buffered deadlocks on a cluster; run it
/// under sync to see that here.
enum class SendMode {
  eager,  ///< send copies the message and returns at once
  sync,   ///< send (and isend's wait) returns once the matching receive is posted, as MPI_Ssend
};
/// "eager" or "sync".
const char* send_mode_name(SendMode mode);
/// DTP_SEND: "eager" (the default) or "sync"; anything else throws dtp::Error.
SendMode default_send_mode();

/// How many ranks, on what, and how the clock counts.
struct World {
  int size = 1;                       ///< number of ranks, 1 to max_world_size(backend)
  Backend backend = Backend::thread;  ///< which Comm implementation connects the ranks
  Device device = Device::cpu();      ///< cpu, or cuda: ranks are spread over the visible GPUs
  CostModel cost{};  ///< costs for the simulated clocks; the default (0, 0) keeps them at 0
  double timeout_seconds = default_timeout_seconds();  ///< wait before CommTimeout; must be > 0
  SendMode send_mode =
      default_send_mode();  ///< eager, or sync to find orderings that need buffering

  /// A world of @p size ranks on the backend and device named by DTP_BACKEND
  /// and DTP_DEVICE (defaults "thread" and "cpu").
  static World from_env(int size);
};

/// What launch() throws when a rank failed: the rank that failed first and
/// its message. Deliberately not a dtp::Error (see NotSolved).
class RankFailure : public std::runtime_error {
 public:
  /// what() becomes "rank <rank>: <message>"; @p original is what the rank threw.
  RankFailure(int rank, const std::string& message, std::exception_ptr original);
  /// The rank (in the launched world) that failed first.
  int rank() const { return rank_; }
  /// The exception the rank threw.
  std::exception_ptr original() const { return original_; }
  /// Rethrows the rank's own exception.
  [[noreturn]] void rethrow_original() const;

 private:
  int rank_;
  std::exception_ptr original_;
};

/// Runs fn(comm) on every rank of @p world and returns when all are done.
/// If any rank throws, the others are unwound and RankFailure names the first.
/// A rank that ends with messages nobody received is also a failure, and so
/// is a non-blocking operation that failed although nobody waited on it.
/// thread: one thread per rank. mpi: this process is one rank of the processes
/// mpiexec started; with world.size below that count, the processes past
/// world.size sit this launch out. Every process must make the same launch()
/// calls in the same order.
void launch(const World& world, const std::function<void(Comm&)>& fn);

/// The largest world launch() can start on @p backend: 1024 threads; under
/// mpi, the number of processes mpiexec started; 0 when not built in.
int max_world_size(Backend backend);

/// The calling thread's rank inside launch(), or -1 outside.
int current_rank();

}  // namespace dtp
