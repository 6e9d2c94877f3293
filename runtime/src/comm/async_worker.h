// Internal: a rank's communication thread. Non-blocking collectives are
// queued here and run one after another, in the order the rank called them,
// while the rank's own thread goes on computing (DDP overlaps the gradient
// all-reduce with the rest of backward this way).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/backend.h"

namespace dtp {

class AsyncWorker {
 public:
  /// @p rank: whose thread this is (for current_rank(), traces and reports).
  explicit AsyncWorker(int rank);
  /// Finishes what is queued, then stops the thread.
  ~AsyncWorker();
  AsyncWorker(const AsyncWorker&) = delete;
  AsyncWorker& operator=(const AsyncWorker&) = delete;

  /// Queues @p op; the request's wait() returns when it has run (and rethrows
  /// what it threw). @p on_busy(true/false) brackets the op on the worker.
  std::shared_ptr<RequestState> submit(std::function<void()> op, std::function<void(bool)> on_busy);
  /// True while something is queued or running.
  bool busy() const;

 private:
  struct Job;
  void run();

  int rank_;
  std::shared_ptr<MemoryTracker> tracker_;
  void* rank_stream_;  // the rank's GPU stream, or nullptr on the host
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  int running_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dtp
