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
#include <vector>

#include "comm/backend.h"

namespace dtp {

class AsyncWorker {
 public:
  /// @p rank: whose thread this is (for current_rank(), traces and reports);
  /// @p lane: which of the rank's threads (1 communication, 2 copies; see
  /// detail::worker_lane()).
  explicit AsyncWorker(int rank, int lane = 1);
  /// Finishes what is queued, then stops the thread (see stop()).
  ~AsyncWorker();
  AsyncWorker(const AsyncWorker&) = delete;
  AsyncWorker& operator=(const AsyncWorker&) = delete;

  /// Queues @p op; the request's wait() returns when it has run (and rethrows
  /// what it threw).
  std::shared_ptr<RequestState> submit(std::function<void()> op);
  /// True while something is queued or running.
  bool busy() const;
  /// Finishes what is queued and stops the thread. Returns what the first op
  /// that failed and was never waited on threw (nullptr when there is none).
  std::exception_ptr stop();

 private:
  struct Job;
  void run();

  int rank_;
  int lane_;
  std::shared_ptr<MemoryTracker> tracker_;
  void* rank_stream_;  // the rank's GPU stream, or nullptr on the host
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> failed_;  // kept to see whether anyone waited
  int running_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dtp
