#include "comm/thread_world.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "comm/fault_internal.h"
#include "comm/thread_group.h"
#include "comm/timeout.h"
#include "dtp/error.h"

namespace dtp {

namespace {
// -1 on a rank's own thread; the id of the communication thread otherwise.
thread_local int this_communication_thread = -1;
}  // namespace

ThreadWorld::ThreadWorld(const World& world) : config_(world) {
  clocks.assign(static_cast<std::size_t>(world.size), 0.0);
  for (int r = 0; r < world.size; ++r) {
    status_.emplace_back();
    status_.back().rank = r;
  }
}

ThreadWorld::ThreadStatus& ThreadWorld::status_of_this_thread(int rank) {
  return this_communication_thread >= 0 ? status_[this_communication_thread] : status_[rank];
}

int ThreadWorld::add_communication_thread(int rank) {
  ThreadStatus& thread = status_.emplace_back();
  thread.rank = rank;
  thread.communication_thread = true;
  thread.state = State::idle;
  return static_cast<int>(status_.size()) - 1;
}

void ThreadWorld::wait_as_communication_thread(int id) { this_communication_thread = id; }

void ThreadWorld::job_queued(int id) {
  ThreadStatus& thread = status_[id];
  ++thread.jobs;
  // A waiting thread stays waiting: the new job runs only after the current one.
  if (thread.state == State::idle) thread.state = State::running;
}

void ThreadWorld::job_finished(int id) {
  ThreadStatus& thread = status_[id];
  if (--thread.jobs > 0) return;
  thread.state = State::idle;
  if (!aborted_ && everyone_stuck()) declare_deadlock();
  changed.notify_all();
}

void ThreadWorld::declare_deadlock() {
  bool anyone_waiting = false;
  for (const ThreadStatus& s : status_) anyone_waiting |= s.state == State::waiting;
  if (!anyone_waiting) return;
  deadlocked_ = aborted_ = true;
  abort_reason_ = "of a deadlock";
  deadlock_report_ =
      "deadlock: every rank still running waits for something no rank can send.\n" + report();
}

Device ThreadWorld::device_of(int rank) const {
  if (config_.device.is_cpu()) return Device::cpu();
  const int gpus = std::max(1, cuda_device_count());
  return Device::cuda((config_.device.index + rank) % gpus);
}

void ThreadWorld::add_group(const std::shared_ptr<ThreadGroup>& group) { groups_.push_back(group); }

void ThreadWorld::note_left_behind(const std::string& messages) {
  std::lock_guard lock(left_behind_mutex_);
  left_behind_ += messages;
}

std::string ThreadWorld::left_behind() const {
  std::lock_guard lock(left_behind_mutex_);
  return left_behind_;
}

std::vector<std::shared_ptr<ThreadGroup>> ThreadWorld::groups() const {
  std::vector<std::shared_ptr<ThreadGroup>> alive;
  for (const auto& weak : groups_)
    if (auto group = weak.lock()) alive.push_back(group);
  return alive;
}

void ThreadWorld::throw_if_aborted(int rank) const {
  if (deadlocked_) throw CommDeadlock(deadlock_report_);
  if (aborted_)
    throw CommAborted("rank " + std::to_string(rank) + " stopped because " + abort_reason_);
}

void ThreadWorld::abort(int rank, const std::string& reason) {
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = "rank " + std::to_string(rank) + " failed: " + reason;
  }
  changed.notify_all();
}

bool ThreadWorld::all_others_finished(int rank) const {
  for (int r = 0; r < size(); ++r)
    if (r != rank && status_[static_cast<std::size_t>(r)].state != State::finished) return false;
  return true;
}

bool ThreadWorld::everyone_stuck() const {
  for (const ThreadStatus& s : status_) {
    if (s.state == State::running) return false;
    if (s.state == State::waiting && (s.gives_up || s.ready())) return false;
  }
  return true;
}

void ThreadWorld::finish(int rank) {
  status_[rank].state = State::finished;
  // The last running rank leaving can strand the others for good.
  if (!aborted_ && everyone_stuck()) declare_deadlock();
  changed.notify_all();
}

void ThreadWorld::wait_until(std::unique_lock<std::mutex>& lock, int rank,
                             const std::function<bool()>& ready,
                             const std::function<std::string()>& describe) {
  throw_if_aborted(rank);
  if (ready()) return;
  ThreadStatus& me = status_of_this_thread(rank);
  me.state = State::waiting;
  me.ready = ready;
  me.describe = describe;
  me.since = std::chrono::steady_clock::now();
  struct BackToRunning {
    ThreadStatus& status;
    ~BackToRunning() { status.state = State::running; }
  } back_to_running{me};

  if (everyone_stuck()) {
    declare_deadlock();
    changed.notify_all();
    throw CommDeadlock(deadlock_report_);
  }
  const auto deadline = me.since + timeout_duration(config_.timeout_seconds);
  while (!ready()) {
    throw_if_aborted(rank);
    if (changed.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
      throw_if_aborted(rank);
      char head[160];
      std::snprintf(head, sizeof head, "timeout: rank %d waited %.1f s (DTP_TIMEOUT) for %s\n",
                    rank, config_.timeout_seconds, describe().c_str());
      std::string message = head + report();
      abort(rank, "it timed out");
      throw CommTimeout(message);
    }
  }
  throw_if_aborted(rank);
}

bool ThreadWorld::wait_for(std::unique_lock<std::mutex>& lock, int rank,
                           const std::function<bool()>& ready,
                           const std::function<std::string()>& describe, double seconds) {
  throw_if_aborted(rank);
  if (ready()) return true;
  ThreadStatus& me = status_of_this_thread(rank);
  me.state = State::waiting;
  me.gives_up = true;
  me.ready = ready;
  me.describe = describe;
  me.since = std::chrono::steady_clock::now();
  struct BackToRunning {
    ThreadStatus& status;
    ~BackToRunning() {
      status.state = State::running;
      status.gives_up = false;
    }
  } back_to_running{me};
  const auto deadline = me.since + timeout_duration(seconds);
  while (!ready()) {
    throw_if_aborted(rank);
    if (changed.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
      throw_if_aborted(rank);
      return false;
    }
  }
  throw_if_aborted(rank);
  return true;
}

std::string ThreadWorld::report() const {
  std::ostringstream out;
  out << "What every rank is doing:\n";
  const auto now = std::chrono::steady_clock::now();
  for (const ThreadStatus& s : status_) {
    if (s.communication_thread) {
      if (s.state == State::idle) continue;  // communication threads matter only when busy
      out << "  rank " << s.rank << "'s communication thread: ";
    } else {
      out << "  rank " << s.rank << ": ";
    }
    switch (s.state) {
      case State::running:
        out << (s.communication_thread ? "running a queued collective"
                                       : "running (not inside a communication call)");
        break;
      case State::finished:
        out << (!s.communication_thread && fault::detail::is_down(s.rank)
                    ? "left: an injected crash or hang (DTP_FAULT)"
                    : "finished");
        break;
      case State::idle:
        out << "idle";
        break;
      case State::waiting: {
        double waited = std::chrono::duration<double>(now - s.since).count();
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%.1f", waited);
        out << "waiting " << seconds << " s for " << s.describe();
        break;
      }
    }
    out << "\n";
  }
  std::string pending;
  for (const auto& group : groups()) pending += group->describe_undelivered();
  if (pending.empty()) {
    out << "No message is waiting to be received.\n";
  } else {
    out << "Sent but not yet received (a tag, size or peer mismatch?):\n" << pending;
  }
  return out.str();
}

}  // namespace dtp
