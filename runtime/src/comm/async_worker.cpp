#include "comm/async_worker.h"

#include "comm/rank_context.h"
#include "cuda/device_api.h"
#include "dtp/launch.h"

namespace dtp {

struct AsyncWorker::Job {
  std::function<void()> op;
  std::mutex mutex;
  std::condition_variable done_changed;
  bool done = false;
  bool waited = false;  // someone called wait(): an error has reached them
  std::exception_ptr error;
  void* inputs_ready = nullptr;  // GPU: the rank's stream reached the submit
  void* finished = nullptr;      // GPU: the collective's work is done
};

namespace {
class AsyncRequest : public RequestState {
 public:
  explicit AsyncRequest(std::shared_ptr<void> job, std::function<void()> wait)
      : job_(std::move(job)), wait_(std::move(wait)) {}
  void wait() override { wait_(); }

 private:
  std::shared_ptr<void> job_;
  std::function<void()> wait_;
};
}  // namespace

AsyncWorker::AsyncWorker(int rank, int lane)
    : rank_(rank),
      lane_(lane),
      tracker_(current_memory_tracker()),
      rank_stream_(cuda::current_stream()) {
  thread_ = std::thread([this] { run(); });
}

AsyncWorker::~AsyncWorker() { stop(); }

std::exception_ptr AsyncWorker::stop() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  for (const std::shared_ptr<Job>& job : failed_) {
    std::lock_guard lock(job->mutex);
    if (!job->waited) return job->error;
  }
  return nullptr;
}

bool AsyncWorker::busy() const {
  std::lock_guard lock(mutex_);
  return running_ > 0 || !queue_.empty();
}

std::shared_ptr<RequestState> AsyncWorker::submit(std::function<void()> op) {
  auto job = std::make_shared<Job>();
  job->op = std::move(op);
  if (rank_stream_ != nullptr) {
    // The collective must see everything the rank queued before calling it.
    job->inputs_ready = cuda::create_event();
    job->finished = cuda::create_event();
    cuda::record(job->inputs_ready);
  }
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(job);
  }
  wake_.notify_all();
  void* rank_stream = rank_stream_;
  return std::make_shared<AsyncRequest>(job, [job, rank_stream] {
    {
      std::unique_lock lock(job->mutex);
      // The op's own waits are bounded by DTP_TIMEOUT, so this one is too.
      job->done_changed.wait(lock, [&] { return job->done; });
      job->waited = true;
    }
    if (rank_stream != nullptr) {
      cuda::wait(job->finished);  // later work on the rank's stream sees the result
      cuda::destroy_event(job->inputs_ready);
      cuda::destroy_event(job->finished);
    }
    if (job->error) std::rethrow_exception(job->error);
  });
}

void AsyncWorker::run() {
  detail::set_current_rank(rank_);
  detail::set_worker_lane(lane_);
  set_current_memory_tracker(tracker_);
  void* stream = nullptr;
  if (rank_stream_ != nullptr) {
    // Its own stream on the rank's GPU, so the collective runs beside compute.
    stream = cuda::create_stream(Device::cuda(cuda::stream_device(rank_stream_)));
    cuda::set_current_stream(stream);
  }
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping, and nothing left to do
      job = queue_.front();
      queue_.pop_front();
      ++running_;
    }
    try {
      if (job->inputs_ready) cuda::wait(job->inputs_ready);
      job->op();
    } catch (...) {
      job->error = std::current_exception();
    }
    try {
      if (job->finished) cuda::record(job->finished);
    } catch (...) {
      if (!job->error) job->error = std::current_exception();
    }
    job->op = nullptr;  // release the buffers it holds
    {
      std::lock_guard lock(mutex_);
      --running_;
      if (job->error) failed_.push_back(job);
    }
    {
      std::lock_guard lock(job->mutex);
      job->done = true;
    }
    job->done_changed.notify_all();
  }
  cuda::set_current_stream(nullptr);
  cuda::destroy_stream(stream);
  set_current_memory_tracker(nullptr);
}

}  // namespace dtp
