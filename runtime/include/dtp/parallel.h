/// @file parallel.h
/// @brief The CPU cores a rank computes with, and a parallel loop over them.
///
/// A single-rank run uses every core; N rank threads share them, each with
/// cores / N threads (itself included), never more threads than cores.
/// Under mpiexec the processes of one machine share its cores the same way.
/// The kernels that use it (the CPU matmul, the attention) split their work
/// so that every output element is computed by the same arithmetic whatever
/// the thread count: results are bitwise the same with 1 thread or 16.
#pragma once

#include <cstdint>
#include <functional>

namespace dtp {

/// Threads the calling thread computes with, itself included: what
/// set_compute_threads() gave it, else the default (all cores of the machine,
/// divided among the MPI processes on it; DTP_THREADS=N overrides).
int compute_threads();
/// Sets compute_threads() for the calling thread (launch() gives each rank
/// thread its share). At least 1.
void set_compute_threads(int threads);
/// The default: DTP_THREADS if set, else the machine's cores divided by the
/// processes of this job on it (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's
/// MPI_LOCALNRANKS), at least 1.
int default_compute_threads();

/// Calls @p body(begin, end) on contiguous parts of [0, @p n) that cover it
/// once, on up to compute_threads() threads (the caller runs the first part),
/// and returns when every part is done. Each part has at least @p min_part
/// items, so small loops stay on the calling thread. An exception thrown by a
/// part is rethrown here after every part has finished.
void parallel_for(std::int64_t n, std::int64_t min_part,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body);

/// A min_part for cheap element-wise loops (a few operations per element):
/// 16k elements are work well above the cost of waking a helper thread.
inline constexpr std::int64_t kElementsPerPart = 16384;

/// A min_part for loops over rows of @p row_elements each: enough rows for
/// kElementsPerPart elements, at least one.
inline std::int64_t rows_per_part(std::int64_t row_elements) {
  return row_elements >= kElementsPerPart ? 1 : kElementsPerPart / row_elements;
}

}  // namespace dtp
