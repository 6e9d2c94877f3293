// Internal: the shared state of a thread-backend world. Ranks are threads of
// one process; one mutex guards every mailbox, rendezvous and status, which
// keeps waits simple to reason about and lets a blocked rank tell a deadlock
// (nobody left who could wake anyone) from a slow peer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
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

  /// Blocks the calling thread of rank @p rank (lock held) until ready() is
  /// true. ready() must not change state: other ranks evaluate it too, to
  /// detect a deadlock. Throws CommAborted if another rank failed,
  /// CommDeadlock if every unfinished thread is waiting on something no one
  /// can provide, CommTimeout after timeout_seconds. @p describe says what
  /// the thread waits for, for the report.
  void wait_until(std::unique_lock<std::mutex>& lock, int rank, const std::function<bool()>& ready,
                  const std::function<std::string()>& describe);
  /// wait_until() that gives up after @p seconds (>= 0) and returns false
  /// then, without a report. Such a waiter wakes by itself, so it is never
  /// part of a deadlock.
  bool wait_for(std::unique_lock<std::mutex>& lock, int rank, const std::function<bool()>& ready,
                const std::function<std::string()>& describe, double seconds);

  /// True when every rank but @p rank has returned from its function (lock held).
  bool all_others_finished(int rank) const;
  /// Throws CommAborted when the world was aborted (lock held).
  void throw_if_aborted(int rank) const;
  /// Marks the world failed because of @p rank; every waiting rank unwinds.
  void abort(int rank, const std::string& reason);
  /// Records that @p rank returned from its function (lock held); may detect a deadlock.
  void finish(int rank);

  // --- communication threads (lock held) ---
  /// A new communication thread of @p rank; returns its id for the calls below.
  int add_communication_thread(int rank);
  /// Makes the waits of the calling thread count as communication thread @p id.
  static void wait_as_communication_thread(int id);
  /// A job was queued on communication thread @p id: from now on it is busy,
  /// never idle, even before the job starts (it will run and may wake others).
  void job_queued(int id);
  /// A job of communication thread @p id ended; with none left it is idle.
  void job_finished(int id);

  /// Registers a group so reports can list its undelivered messages.
  void add_group(const std::shared_ptr<ThreadGroup>& group);
  std::vector<std::shared_ptr<ThreadGroup>> groups() const;
  /// Undelivered messages of groups that no longer exist (any thread, no lock
  /// needed: a group may die while a rank holds the world's mutex).
  void note_left_behind(const std::string& messages);
  std::string left_behind() const;

  /// What every rank is doing and which messages are waiting (lock held).
  std::string report() const;

 private:
  // A communication thread is idle when it has no job queued or running:
  // like a finished rank, it cannot wake anybody.
  enum class State { running, waiting, finished, idle };
  struct ThreadStatus {
    int rank = 0;
    bool communication_thread = false;
    int jobs = 0;  // communication threads: queued or running
    State state = State::running;
    bool gives_up = false;  // waiting with a deadline of its own (wait_for)
    std::function<bool()> ready;
    std::function<std::string()> describe;
    std::chrono::steady_clock::time_point since;
  };
  bool everyone_stuck() const;
  // The status of the calling thread: its rank's own, or that of the
  // communication thread it is (see wait_as_communication_thread()).
  ThreadStatus& status_of_this_thread(int rank);
  void declare_deadlock();

  World config_;
  // The ranks' own threads first (index = rank), then communication threads.
  // A deque: entries stay put while waiting threads hold references.
  std::deque<ThreadStatus> status_;
  std::vector<std::weak_ptr<ThreadGroup>> groups_;
  mutable std::mutex left_behind_mutex_;
  std::string left_behind_;
  bool aborted_ = false;
  bool deadlocked_ = false;
  std::string abort_reason_;
  std::string deadlock_report_;
};

}  // namespace dtp
