// launch() on the mpi backend: this process runs one rank.
#include <cstdio>

#include "comm/fault_internal.h"
#include "comm/rank_context.h"
#include "cuda/device_api.h"
#include "dtp/error.h"
#include "dtp/fault.h"
#include "mpi/mpi_backend.h"

namespace dtp::mpi {

namespace {

/// What this process saw of one launch.
struct Outcome {
  bool failed = false;
  int rank = -1;  // the rank that failed first, as this process knows it
  std::string message;
  std::exception_ptr error;
};

/// Runs fn on this process's rank; never throws.
Outcome run_rank(const World& world, MPI_Comm comm, const std::function<void(Comm&)>& fn,
                 const BackendFactory& make) {
  auto session = std::make_shared<Session>(world, comm);
  void* stream = nullptr;
  Outcome outcome;
  try {
    if (world.device.is_cuda()) {
      // One GPU per process, round-robin over the GPUs this process can see.
      const int gpus = cuda_device_count();
      DTP_CHECK(gpus > 0, "launch: DTP_DEVICE=", world.device.str(),
                " but no usable CUDA device was found");
      session->device = Device::cuda((world.device.index + session->rank()) % gpus);
      stream = cuda::create_stream(session->device);
    }
    cuda::set_current_stream(stream);
    detail::set_current_rank(session->rank());
    set_current_memory_tracker(std::make_shared<MemoryTracker>());
    std::string undelivered;
    {
      RankBackend rank_backend = make(session);
      Comm comm_handle(rank_backend.backend);
      try {
        fn(comm_handle);
      } catch (const fault::InjectedCrash&) {
        // An injected crash or hang: the rank leaves; the others carry on.
      }
      session->leave();
      undelivered = rank_backend.finish();
    }
    // A non-blocking operation that failed is a failure even if nobody waited on it.
    if (std::exception_ptr error = detail::take_unobserved_failure()) std::rethrow_exception(error);
    // Every rank fails when any rank was left with messages: agree on one.
    int mine[2] = {undelivered.empty() ? 0 : 1, undelivered.empty() ? -1 : session->rank()};
    int any[2];
    check(MPI_Allreduce(mine, any, 2, MPI_INT, MPI_MAX, session->world_comm()), "MPI_Allreduce");
    if (any[0]) {
      outcome.failed = true;
      outcome.rank = any[1];
      outcome.message =
          "every rank returned, but these messages were sent and never received "
          "(each send needs a matching recv with the same source and tag):\n" +
          undelivered;
      if (undelivered.empty())
        outcome.message =
            "rank " + std::to_string(any[1]) + " was left with messages it never received";
      outcome.error = std::make_exception_ptr(CommMismatch(outcome.message));
    }
  } catch (const CommAborted&) {
    // Another rank failed first: report its failure, as the thread backend does.
    outcome = {true, session->failed_rank(), session->failure_message(), std::current_exception()};
  } catch (const std::exception& e) {
    session->announce_failure(e.what());
    outcome = {true, session->rank(), e.what(), std::current_exception()};
  } catch (...) {
    const std::string text = "an exception that is not a std::exception";
    session->announce_failure(text);
    outcome = {true, session->rank(), text, std::current_exception()};
  }
  cuda::set_current_stream(nullptr);
  cuda::destroy_stream(stream);
  set_current_memory_tracker(nullptr);
  detail::set_current_rank(-1);
  return outcome;
}

}  // namespace

void launch(const World& world, const std::function<void(Comm&)>& fn) {
  launch_on_processes(world, fn, [](const std::shared_ptr<Session>& session) {
    return RankBackend{std::make_shared<MpiComm>(session, session->traffic.front()),
                       [session] { return collect_undelivered(*session); }};
  });
}

void launch_on_processes(const World& world, const std::function<void(Comm&)>& fn,
                         const BackendFactory& make) {
  const int processes = process_count();
  DTP_CHECK(world.size <= processes, "launch: a world of ", world.size,
            " ranks on the mpi backend needs ", world.size, " processes, but mpiexec started ",
            processes, " (use mpiexec -n ", world.size, ")");
  const int me = process_rank();
  fault::detail::begin_launch();
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_split(MPI_COMM_WORLD, me < world.size ? 0 : MPI_UNDEFINED, me, &comm),
        "MPI_Comm_split");
  Outcome outcome;
  if (comm != MPI_COMM_NULL)
    outcome = run_rank(world, comm, fn, make);  // else: sit out a smaller world

  // Every process, those that sat out included, must leave launch() the same
  // way, or the next launch() would find them out of step. Agree on the first
  // failure (the lowest failing rank) and share its message.
  int mine[2] = {outcome.failed ? 1 : 0, outcome.failed ? -outcome.rank : -processes};
  int all[2];
  check(MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  if (!all[0]) return;
  const int failed_rank = -all[1];
  std::string message = outcome.message;
  int length = static_cast<int>(message.size());
  check(MPI_Bcast(&length, 1, MPI_INT, failed_rank, MPI_COMM_WORLD), "MPI_Bcast");
  message.resize(static_cast<std::size_t>(length));
  check(MPI_Bcast(message.data(), length, MPI_CHAR, failed_rank, MPI_COMM_WORLD), "MPI_Bcast");
  std::exception_ptr error = me == failed_rank && outcome.error
                                 ? outcome.error
                                 : std::make_exception_ptr(CommAborted(message));
  throw RankFailure(failed_rank, message, error);
}

}  // namespace dtp::mpi
