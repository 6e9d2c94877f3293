// Run under mpiexec by CTest: rank 0 waits for a message rank 1 never sends
// (rank 1 is busy computing), so the job must end with a timeout report
// instead of hanging. CTest checks the report's text.
#include <chrono>
#include <thread>

#include "dtp/dtp.h"

int main() {
  dtp::World world = dtp::World::from_env(2);
  world.backend = dtp::Backend::mpi;
  world.timeout_seconds = 1.0;
  dtp::launch(world, [](dtp::Comm& comm) {
    dtp::Tensor x = dtp::Tensor::zeros({4}, dtp::DType::f32);
    if (comm.rank() == 0) comm.recv(x, 1, 7);
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(5));
  });
  return 0;
}
