#include "timing.h"

#include <algorithm>
#include <chrono>

#include "check_values.h"

// The runtime's own checked-call macro (runtime/src).
#if defined(DTP_HAVE_CUDA) || defined(DTP_HAVE_NCCL)
#include "cuda/cuda_check.h"
#endif

namespace dtp::bench::collectives {

void synchronize(const dtp::Comm& comm) {
#if defined(DTP_HAVE_CUDA) || defined(DTP_HAVE_NCCL)
  if (comm.device().is_cuda()) DTP_CUDA_CHECK(cudaDeviceSynchronize());
#else
  (void)comm;
#endif
}

double combine(dtp::Comm& comm, double value, dtp::ReduceOp op) {
  dtp::Tensor t = dtp::Tensor::full(dtp::Shape{1}, value, dtp::DType::f64, comm.device());
  comm.all_reduce(t, op);
  return to_host(t).item(0);
}

double time_calls(dtp::Comm& comm, const std::function<void()>& call, int warmup, int iters,
                  Average average) {
  // Buffers were just filled on the rank's stream; a native call may use another.
  synchronize(comm);
  for (int i = 0; i < warmup; ++i) call();
  synchronize(comm);
  comm.barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  synchronize(comm);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  switch (average) {
    case Average::rank0:
      return combine(comm, comm.rank() == 0 ? seconds : 0.0, dtp::ReduceOp::sum);
    case Average::mean:
      return combine(comm, seconds, dtp::ReduceOp::avg);
    case Average::min:
      return combine(comm, seconds, dtp::ReduceOp::min);
    case Average::max:
      break;
  }
  return combine(comm, seconds, dtp::ReduceOp::max);
}

double copy_bandwidth(dtp::Comm& comm, std::int64_t bytes, int warmup, int iters) {
  const std::int64_t count = std::max<std::int64_t>(1, bytes / 4);
  dtp::Tensor source = dtp::Tensor::zeros(dtp::Shape{count}, dtp::DType::f32, comm.device(),
                                          dtp::MemoryCategory::comm);
  dtp::Tensor target = dtp::Tensor::zeros(dtp::Shape{count}, dtp::DType::f32, comm.device(),
                                          dtp::MemoryCategory::comm);
  double seconds = 0;
  for (int trial = 0; trial < 3; ++trial) {
    const double t = time_calls(
        comm, [&] { target.copy_from(source); }, trial == 0 ? warmup : 0, iters);
    seconds = trial == 0 ? t : std::min(seconds, t);
  }
  return 2.0 * static_cast<double>(target.nbytes()) * comm.size() / seconds;
}

}  // namespace dtp::bench::collectives
