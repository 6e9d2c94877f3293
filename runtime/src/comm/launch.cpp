// launch(): one thread per rank on the thread backend; the first failure is
// reported with its rank, the other ranks are unwound, and messages nobody
// received are reported as a failure too.
#include "dtp/launch.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "comm/fault_internal.h"
#include "comm/rank_context.h"
#include "comm/thread_backend.h"
#include "comm/thread_group.h"
#include "comm/thread_world.h"
#include "comm/timeout.h"
#include "cuda/device_api.h"
#include "dtp/error.h"
#include "dtp/fault.h"
#include "dtp/parallel.h"
#ifdef DTP_HAVE_MPI
#include "mpi/mpi_session.h"
#endif
#ifdef DTP_HAVE_NCCL
#include "nccl/nccl_backend.h"
#endif

namespace dtp {

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::thread:
      return "thread";
    case Backend::mpi:
      return "mpi";
    case Backend::nccl:
      return "nccl";
  }
  return "?";
}

Backend parse_backend(const std::string& name) {
  for (Backend b : {Backend::thread, Backend::mpi, Backend::nccl})
    if (name == backend_name(b)) return b;
  DTP_CHECK(false, "unknown backend '", name, "': expected thread, mpi or nccl");
  return Backend::thread;
}

double default_timeout_seconds() {
  const char* text = std::getenv("DTP_TIMEOUT");
  if (text == nullptr || *text == '\0') return 60.0;
  char* end = nullptr;
  double seconds = std::strtod(text, &end);
  DTP_CHECK(*end == '\0' && std::isfinite(seconds) && seconds > 0,
            "DTP_TIMEOUT must be a positive, finite number of seconds (for example 60), got '",
            text, "'");
  return std::min(seconds, kLongestTimeoutSeconds);
}

const char* send_mode_name(SendMode mode) { return mode == SendMode::sync ? "sync" : "eager"; }

SendMode default_send_mode() {
  const char* text = std::getenv("DTP_SEND");
  if (text == nullptr || *text == '\0') return SendMode::eager;
  for (SendMode mode : {SendMode::eager, SendMode::sync})
    if (std::string(text) == send_mode_name(mode)) return mode;
  DTP_CHECK(false, "DTP_SEND must be eager or sync, got '", text, "'");
  return SendMode::eager;
}

World World::from_env(int size) {
  World world;
  world.size = size;
  if (const char* b = std::getenv("DTP_BACKEND"); b && *b) world.backend = parse_backend(b);
  if (const char* d = std::getenv("DTP_DEVICE"); d && *d) world.device = parse_device(d);
  return world;
}

RankFailure::RankFailure(int rank, const std::string& message, std::exception_ptr original)
    : std::runtime_error("rank " + std::to_string(rank) + ": " + message),
      rank_(rank),
      original_(std::move(original)) {}

void RankFailure::rethrow_original() const { std::rethrow_exception(original_); }

namespace {
thread_local int this_thread_rank = -1;

struct Failure {
  int rank;
  std::string message;
  std::exception_ptr error;
  bool secondary;  // unwound because another rank failed first
};

std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}
}  // namespace

thread_local int this_thread_lane = 0;
thread_local std::exception_ptr this_thread_unobserved_failure;

int current_rank() { return this_thread_rank; }
void detail::set_current_rank(int rank) { this_thread_rank = rank; }
int detail::worker_lane() { return this_thread_lane; }
void detail::set_worker_lane(int lane) { this_thread_lane = lane; }
bool detail::is_comm_worker() { return this_thread_lane == 1; }
void detail::note_unobserved_failure(std::exception_ptr error) {
  if (!this_thread_unobserved_failure) this_thread_unobserved_failure = std::move(error);
}
std::exception_ptr detail::take_unobserved_failure() {
  return std::exchange(this_thread_unobserved_failure, nullptr);
}

int max_world_size(Backend backend) {
  if (backend == Backend::mpi) {
#ifdef DTP_HAVE_MPI
    return mpi::process_count();
#else
    return 0;
#endif
  }
  if (backend == Backend::nccl) {
#ifdef DTP_HAVE_NCCL
#ifdef DTP_HAVE_MPI
    if (mpi::process_count_without_init() > 1) return mpi::process_count();
#endif
    return cuda_device_count();  // one process: one rank per GPU
#else
    return 0;
#endif
  }
  return 1024;
}

namespace {
void launch_threads(const World& world, const std::function<void(Comm&)>& fn);
}  // namespace

void launch(const World& world, const std::function<void(Comm&)>& fn) {
  DTP_CHECK(world.size >= 1 && world.size <= 1024, "launch: world size must be in [1, 1024], got ",
            world.size);
  DTP_CHECK(std::isfinite(world.timeout_seconds) && world.timeout_seconds > 0,
            "launch: timeout_seconds must be a positive, finite number of seconds, got ",
            world.timeout_seconds);
  DTP_CHECK(world.backend != Backend::nccl || world.cost.ranks_per_node == 0,
            "launch: the nccl backend charges one tier of links; a cost model with nodes of ",
            world.cost.ranks_per_node, " ranks (CostModel::with_nodes) runs on thread or mpi");
  switch (world.backend) {
    case Backend::thread:
      return launch_threads(world, fn);
    case Backend::mpi:
#ifdef DTP_HAVE_MPI
      return mpi::launch(world, fn);
#else
      DTP_CHECK(false,
                "launch: this build has no MPI (install libopenmpi-dev and reconfigure); "
                "use DTP_BACKEND=thread");
#endif
    case Backend::nccl:
#ifdef DTP_HAVE_NCCL
      return nccl::launch(world, fn);
#else
      DTP_CHECK(
          false,
          "launch: this build has no NCCL (it needs the CUDA toolkit with NCCL at configure time); "
          "use DTP_BACKEND=thread or mpi");
#endif
  }
}

namespace {
void launch_threads(const World& world, const std::function<void(Comm&)>& fn) {
  if (world.device.is_cuda()) {
    const int gpus = cuda_device_count();
    DTP_CHECK(gpus > 0, "launch: DTP_DEVICE=", world.device.str(),
              " but no usable CUDA device was found (no GPU, no driver, or a build without CUDA)");
    DTP_CHECK(world.device.index < gpus, "launch: ", world.device.str(), " does not exist; ", gpus,
              " GPU(s) are visible");
    if (world.size > 1 && gpus > 1) cuda::enable_peer_access(std::min(gpus, world.size));
  }
  fault::detail::begin_launch();
  auto thread_world = std::make_shared<ThreadWorld>(world);
  std::vector<int> everyone(static_cast<std::size_t>(world.size));
  for (int r = 0; r < world.size; ++r) everyone[r] = r;
  auto group = ThreadGroup::create(thread_world, everyone);

  std::mutex failures_mutex;
  std::vector<Failure> failures;  // in the order they happened

  auto run_rank = [&](int rank) {
    this_thread_rank = rank;
    set_current_memory_tracker(std::make_shared<MemoryTracker>());
    // The rank threads share the cores: cores / ranks each, at least 1.
    set_compute_threads(std::max(1, default_compute_threads() / world.size));
    // On a GPU every rank queues its work on a stream of its own.
    const Device device = thread_world->device_of(rank);
    void* stream = device.is_cuda() ? cuda::create_stream(device) : nullptr;
    cuda::set_current_stream(stream);
    // Records this rank's failure and unwinds the others.
    auto fail = [&](std::exception_ptr error, const std::string& message) {
      bool secondary = false;
      try {
        std::rethrow_exception(error);
      } catch (const CommAborted&) {
        secondary = true;
      } catch (...) {
      }
      {
        std::lock_guard lock(failures_mutex);
        failures.push_back({rank, message, error, secondary});
      }
      std::lock_guard lock(thread_world->mutex);
      thread_world->abort(rank, message);
      thread_world->finish(rank);
    };
    try {
      {
        Comm comm(std::make_shared<ThreadComm>(group, rank));
        try {
          fn(comm);
        } catch (const fault::InjectedCrash&) {
          // An injected crash or hang: the rank leaves; the others carry on.
        }
      }
      if (std::exception_ptr error = detail::take_unobserved_failure()) {
        fail(error, "a non-blocking collective that was never waited on failed: " +
                        describe_exception(error));
      } else {
        std::lock_guard lock(thread_world->mutex);
        thread_world->finish(rank);
      }
    } catch (...) {
      detail::take_unobserved_failure();  // this rank fails anyway; report what it threw
      std::exception_ptr error = std::current_exception();
      fail(error, describe_exception(error));
    }
    cuda::set_current_stream(nullptr);
    cuda::destroy_stream(stream);
    set_current_memory_tracker(nullptr);
    this_thread_rank = -1;
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world.size));
  for (int r = 0; r < world.size; ++r) threads.emplace_back(run_rank, r);
  for (std::thread& t : threads) t.join();

  if (!failures.empty()) {
    const Failure* first = &failures.front();
    for (const Failure& f : failures)
      if (!f.secondary) {
        first = &f;
        break;
      }
    throw RankFailure(first->rank, first->message, first->error);
  }

  // Every send needs a matching recv: leftover messages mean a protocol bug.
  std::string undelivered = thread_world->left_behind();
  for (const auto& g : thread_world->groups()) undelivered += g->describe_undelivered();
  if (!undelivered.empty()) {
    std::string message =
        "every rank returned, but these messages were sent and never received "
        "(each send needs a matching recv with the same source and tag):\n" +
        undelivered;
    int receiver = std::atoi(undelivered.substr(undelivered.find("-> rank ") + 8).c_str());
    throw RankFailure(receiver, message, std::make_exception_ptr(CommMismatch(message)));
  }
}
}  // namespace

}  // namespace dtp
