// Internal: the state one launch() shares among its MPI communicators.
//
// Each process is one rank. Every wait that could hang polls nonblocking MPI
// requests instead of blocking inside MPI, so that it can (1) time out with a
// report and (2) notice that another rank failed — failures travel as notices
// on a private control communicator — and unwind instead of hanging. (The only
// blocking MPI calls are collectives that every rank has already been checked
// to be inside: see agreement.h.)
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "dtp/launch.h"
#include "mpi/mpi_check.h"

namespace dtp::mpi {

/// Initializes MPI once per process (MPI_Finalize runs at exit).
void ensure_initialized();
int process_rank();
int process_count();
/// The number of processes the launcher started, read from its environment
/// without initializing MPI (1 when not started by mpiexec or srun).
int process_count_without_init();

/// Per-communicator message counts, kept past the Comm's lifetime so the end
/// of launch() can find messages nobody received.
struct Traffic {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm check =
      MPI_COMM_NULL;            // a duplicate that carries only the collective checks (agreement.h)
  std::vector<long long> sent;  // messages sent to each rank
  std::vector<long long> received;  // messages received from each rank
};

class Session {
 public:
  /// @p comm: the processes taking part; the session owns it from now on.
  Session(const World& config, MPI_Comm comm);
  ~Session();

  const World& config() const { return config_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm world_comm() const { return comm_; }

  /// This process's simulated time.
  double clock = 0.0;
  /// This rank's device: the host, or one GPU (round-robin over the visible ones).
  Device device = Device::cpu();

  /// Polls until every request completes. Throws CommAborted when another
  /// rank failed, CommTimeout (after telling every rank) past the timeout.
  /// @p describe says what this rank waits for.
  void wait(std::vector<MPI_Request>& requests, const std::function<std::string()>& describe,
            std::vector<MPI_Status>* statuses = nullptr);
  /// Polls @p done until it is true (returns true), as wait() does: throws
  /// CommAborted when another rank failed and CommTimeout past the timeout;
  /// with @p give_up_seconds >= 0 returns false once that long has passed.
  bool poll_until(const std::function<bool()>& done, const std::function<std::string()>& describe,
                  double give_up_seconds);
  /// Throws CommAborted when another rank announced a failure.
  void throw_if_peer_failed();
  /// This rank has returned from its function (or an injected hang stops
  /// it): waits until every rank has said so, however long that takes; a
  /// failure elsewhere still throws CommAborted. Once per launch: a second
  /// call returns at once.
  void leave();
  /// Tells every other rank that this one failed, so their waits unwind.
  void announce_failure(const std::string& message);
  /// The failure another rank announced, if any ("" when none).
  int failed_rank() const { return failed_rank_; }
  const std::string& failure_message() const { return failure_message_; }

  /// Keeps an eager send's private copy alive until MPI is done with it.
  void keep_until_sent(std::shared_ptr<void> buffer, MPI_Request request);
  /// Frees the copies of sends that completed.
  void reap_sends();
  /// Waits for every eager send (end of launch).
  void finish_sends();

  /// Message counts of every communicator of this launch, the world's first.
  std::vector<std::shared_ptr<Traffic>> traffic;

 private:
  void poll_notices();

  World config_;
  MPI_Comm comm_;     // the launch's world: data traffic
  MPI_Comm control_;  // failure notices only
  MPI_Comm exit_;     // leave()'s barrier
  bool left_ = false;
  int rank_ = 0, size_ = 1;
  int failed_rank_ = -1;
  std::string failure_message_;
  struct PendingSend {
    std::shared_ptr<void> buffer;
    MPI_Request request;
  };
  std::vector<PendingSend> sends_;
};

/// What runs on one process's rank: the Comm backend fn gets, and the
/// end-of-launch check (returns a description of messages nobody received).
struct RankBackend {
  std::shared_ptr<CommBackend> backend;
  std::function<std::string()> finish;
};
using BackendFactory = std::function<RankBackend(const std::shared_ptr<Session>&)>;

/// Runs fn on this process's rank of the processes mpiexec started, with the
/// backend @p make builds on the session (mpi, or nccl bootstrapped over MPI).
void launch_on_processes(const World& world, const std::function<void(Comm&)>& fn,
                         const BackendFactory& make);

/// Runs fn on this process's rank of an MPI world (see launch()).
void launch(const World& world, const std::function<void(Comm&)>& fn);

}  // namespace dtp::mpi
