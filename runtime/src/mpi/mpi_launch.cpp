// launch() on the mpi backend: this process runs one rank.
#include <cstdio>

#include "comm/rank_context.h"
#include "cuda/device_api.h"
#include "dtp/error.h"
#include "mpi/mpi_backend.h"

namespace dtp::mpi {

void launch(const World& world, const std::function<void(Comm&)>& fn) {
  const int processes = process_count();
  DTP_CHECK(world.size <= processes, "launch: a world of ", world.size, " ranks on the mpi backend needs ",
            world.size, " processes, but mpiexec started ", processes, " (use mpiexec -n ", world.size, ")");
  const int me = process_rank();
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_split(MPI_COMM_WORLD, me < world.size ? 0 : MPI_UNDEFINED, me, &comm), "MPI_Comm_split");
  if (comm == MPI_COMM_NULL) return;  // this process sits out a smaller world

  auto session = std::make_shared<Session>(world, comm);
  void* stream = nullptr;
  if (world.device.is_cuda()) {
    // One GPU per process, round-robin over the GPUs this process can see.
    const int gpus = cuda_device_count();
    DTP_CHECK(gpus > 0, "launch: DTP_DEVICE=", world.device.str(), " but no usable CUDA device was found");
    session->device = Device::cuda((world.device.index + session->rank()) % gpus);
    stream = cuda::create_stream(session->device);
  }
  cuda::set_current_stream(stream);
  detail::set_current_rank(session->rank());
  set_current_memory_tracker(std::make_shared<MemoryTracker>());
  struct Reset {
    void* stream;
    ~Reset() {
      cuda::set_current_stream(nullptr);
      cuda::destroy_stream(stream);
      set_current_memory_tracker(nullptr);
      detail::set_current_rank(-1);
    }
  } reset{stream};

  std::string undelivered;
  try {
    {
      Comm comm_handle(std::make_shared<MpiComm>(session, session->traffic.front()));
      fn(comm_handle);
    }
    undelivered = collect_undelivered(*session);
  } catch (const CommAborted&) {
    // Another rank failed first: report its failure, as the thread backend does.
    throw RankFailure(session->failed_rank(), session->failure_message(), std::current_exception());
  } catch (const std::exception& e) {
    session->announce_failure(e.what());
    throw RankFailure(session->rank(), e.what(), std::current_exception());
  } catch (...) {
    session->announce_failure("an exception that is not a std::exception");
    throw RankFailure(session->rank(), "an exception that is not a std::exception", std::current_exception());
  }
  // Every rank fails when any rank was left with messages: agree on one.
  int mine[2] = {undelivered.empty() ? 0 : 1, undelivered.empty() ? -1 : session->rank()};
  int any[2];
  check(MPI_Allreduce(mine, any, 2, MPI_INT, MPI_MAX, session->world_comm()), "MPI_Allreduce");
  if (any[0]) {
    std::string message =
        undelivered.empty()
            ? "rank " + std::to_string(any[1]) + " finished with messages it never received (see its report)"
            : "every rank returned, but these messages were sent and never received "
              "(each send needs a matching recv with the same source and tag):\n" + undelivered;
    throw RankFailure(undelivered.empty() ? any[1] : session->rank(), message,
                      std::make_exception_ptr(CommMismatch(message)));
  }
}

}  // namespace dtp::mpi
