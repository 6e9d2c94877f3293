// launch() on the nccl backend: one GPU per rank. Under mpiexec each process
// is a rank and rank 0's NCCL id travels over MPI; otherwise one process
// drives every visible GPU with a thread per rank.
#include <cstdlib>
#include <thread>

#include "comm/rank_context.h"
#include "cuda/cuda_check.h"
#include "cuda/device_api.h"
#include "dtp/error.h"
#include "nccl/nccl_backend.h"
#ifdef DTP_HAVE_MPI
#include "mpi/mpi_session.h"
#endif

namespace dtp::nccl {

namespace {

void check_gpus(const World& world, int ranks_per_node) {
  const int gpus = cuda_device_count();
  DTP_CHECK(gpus > 0,
            "launch: the nccl backend needs a GPU per rank, but no usable CUDA device was found");
  DTP_CHECK(ranks_per_node <= gpus, "launch: NCCL refuses two ranks on one GPU: ", ranks_per_node,
            " ranks need ", ranks_per_node, " GPUs but ", gpus,
            " are visible; use DTP_BACKEND=thread to share one GPU among ranks");
  DTP_CHECK(world.device.is_cuda(), "launch: the nccl backend runs on GPUs; set DTP_DEVICE=cuda");
}

#ifdef DTP_HAVE_MPI
/// Failure notices travel over the MPI session's control channel.
class MpiControl : public Control {
 public:
  explicit MpiControl(std::shared_ptr<mpi::Session> session) : session_(std::move(session)) {}
  void poll(int) override { session_->throw_if_peer_failed(); }
  void announce(int, const std::string& message) override { session_->announce_failure(message); }
  bool failed() const override { return session_->failed_rank() >= 0; }

 private:
  std::shared_ptr<mpi::Session> session_;
};

/// The rank's GPU on its node: the local rank that launchers export, round-robin.
int local_rank(int rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"})
    if (const char* value = std::getenv(name)) return std::atoi(value);
  return rank;
}

void launch_processes(const World& world, const std::function<void(Comm&)>& fn) {
  mpi::launch_on_processes(world, fn, [&world](const std::shared_ptr<mpi::Session>& session) {
    const int gpus = cuda_device_count();
    check_gpus(world, 1);
    const Device device = Device::cuda(local_rank(session->rank()) % gpus);
    DTP_CUDA_CHECK(cudaSetDevice(device.index));
    session->device = device;
    // The stream this rank's work goes on; freed with the process.
    cuda::set_current_stream(cuda::create_stream(device));
    ncclUniqueId id;
    if (session->rank() == 0) DTP_NCCL_CHECK(ncclGetUniqueId(&id));
    mpi::check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, session->world_comm()), "MPI_Bcast");
    ncclComm_t comm = nullptr;
    DTP_NCCL_CHECK(ncclCommInitRank(&comm, session->size(), id, session->rank()));
    auto backend = std::make_shared<NcclComm>(comm, session->rank(), session->size(), device, world,
                                              std::make_shared<MpiControl>(session), true);
    return mpi::RankBackend{backend, [backend] { return backend->finish(); }};
  });
}
#endif

void launch_threads(const World& world, const std::function<void(Comm&)>& fn) {
  check_gpus(world, world.size);
  const int gpus = cuda_device_count();
  std::vector<int> devices(static_cast<std::size_t>(world.size));
  for (int r = 0; r < world.size; ++r) devices[r] = (world.device.index + r) % gpus;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(world.size));
  DTP_NCCL_CHECK(ncclCommInitAll(comms.data(), world.size, devices.data()));

  auto control = std::make_shared<ThreadControl>();
  struct Failure {
    int rank;
    std::string message;
    std::exception_ptr error;
  };
  std::mutex failures_mutex;
  std::vector<Failure> failures;
  auto run_rank = [&](int rank) {
    detail::set_current_rank(rank);
    set_current_memory_tracker(std::make_shared<MemoryTracker>());
    void* stream = nullptr;
    // Outlives the try: on a failure the rank announces it first, so that the
    // backend's destructor sees control->failed() and aborts the communicator
    // (ncclCommDestroy would wait for GPU work that peers will never match).
    std::shared_ptr<NcclComm> backend;
    try {
      const Device device = Device::cuda(devices[rank]);
      stream = cuda::create_stream(device);
      cuda::set_current_stream(stream);
      backend =
          std::make_shared<NcclComm>(comms[rank], rank, world.size, device, world, control, true);
      {
        Comm comm(backend);
        fn(comm);
      }
      const std::string undelivered = backend->finish();
      DTP_CHECK(undelivered.empty(),
                "every rank returned, but these messages were sent and never received:\n",
                undelivered);
    } catch (const CommAborted&) {
      // Another rank failed first; it reports.
    } catch (const std::exception& e) {
      control->announce(rank, e.what());
      std::lock_guard lock(failures_mutex);
      failures.push_back({rank, e.what(), std::current_exception()});
    }
    backend.reset();
    cuda::set_current_stream(nullptr);
    cuda::destroy_stream(stream);
    set_current_memory_tracker(nullptr);
    detail::set_current_rank(-1);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size; ++r) threads.emplace_back(run_rank, r);
  for (std::thread& t : threads) t.join();
  if (!failures.empty()) {
    const Failure& first = failures.front();
    throw RankFailure(first.rank, first.message, first.error);
  }
}

}  // namespace

void launch(const World& world, const std::function<void(Comm&)>& fn) {
#ifdef DTP_HAVE_MPI
  if (mpi::process_count_without_init() > 1) return launch_processes(world, fn);
#endif
  launch_threads(world, fn);
}

}  // namespace dtp::nccl
