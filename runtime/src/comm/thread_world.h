// Internal: the shared state of a thread-backend world. Ranks are threads of
// one process; one mutex guards every mailbox, rendezvous and status, which
// keeps waits simple to reason about and lets a blocked rank tell a deadlock
// (nobody left who could wake anyone) from a slow peer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtp/launch.h"

namespace dtp {

class ThreadGroup;

class ThreadWorld {
 public:
  explicit ThreadWorld(const World& world);

  const World& config() const { return config_; }
  /// The device of @p rank: the host, or on cuda the visible GPUs round-robin
  /// from the World's device index (one GPU: every rank shares it).
  Device device_of(int rank) const;
  int size() const { return config_.size; }

  /// Guards everything below and every ThreadGroup of this world.
  std::mutex mutex;
  /// Notified whenever a message arrives, a rendezvous moves or a rank ends.
  std::condition_variable changed;

  /// Simulated time of each (global) rank.
  std::vector<double> clocks;

  /// Blocks rank @p rank (lock held) until ready() is true. ready() must not
  /// change state: other ranks evaluate it too, to detect a deadlock. Throws CommAborted
  /// if another rank failed, CommDeadlock if every unfinished rank is waiting
  /// on something no one can provide, CommTimeout after timeout_seconds.
  /// @p describe says what the rank waits for, for the report.
  void wait_until(std::unique_lock<std::mutex>& lock, int rank,
                  const std::function<bool()>& ready,
                  const std::function<std::string()>& describe);

  /// Throws CommAborted when the world was aborted (lock held).
  void throw_if_aborted(int rank) const;
  /// Marks the world failed because of @p rank; every waiting rank unwinds.
  void abort(int rank, const std::string& reason);
  /// Records that @p rank returned from its function (lock held); may detect a deadlock.
  void finish(int rank);
  /// Rank @p rank's communication thread starts (busy) or ends (idle) a
  /// queued operation (lock held).
  void set_worker_busy(int rank, bool busy);

  /// Registers a group so reports can list its undelivered messages.
  void add_group(const std::shared_ptr<ThreadGroup>& group);
  std::vector<std::shared_ptr<ThreadGroup>> groups() const;

  /// What every rank is doing and which messages are waiting (lock held).
  std::string report() const;

 private:
  // A rank's communication thread is idle when it has nothing queued: like a
  // finished rank, it cannot wake anybody.
  enum class State { running, waiting, finished, idle };
  struct RankStatus {
    State state = State::running;
    std::function<bool()> ready;
    std::function<std::string()> describe;
    std::chrono::steady_clock::time_point since;
  };
  bool everyone_stuck() const;
  // Slots 0..size-1 are the ranks' own threads, size..2*size-1 their
  // communication threads (see detail::is_comm_worker()).
  int slot(int rank) const;
  void declare_deadlock();

  World config_;
  std::vector<RankStatus> status_;
  std::vector<std::weak_ptr<ThreadGroup>> groups_;
  bool aborted_ = false;
  bool deadlocked_ = false;
  std::string abort_reason_;
  std::string deadlock_report_;
};

}  // namespace dtp
