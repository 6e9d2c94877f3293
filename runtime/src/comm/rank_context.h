// Internal: which rank the calling thread is (see dtp::current_rank()).
#pragma once

#include <exception>

namespace dtp::detail {
void set_current_rank(int rank);
/// Which of its rank's threads the calling thread is: 0 the rank's own, 1
/// its communication thread (non-blocking collectives), 2 its copy lane
/// (dtp/copy_lane.h). Trace spans carry it as their lane.
int worker_lane();
void set_worker_lane(int lane);
/// True on a rank's communication thread (worker_lane() == 1).
bool is_comm_worker();
/// Records, for the calling rank's launch to report, a failure of a
/// non-blocking operation that nobody waited on (the first one is kept).
void note_unobserved_failure(std::exception_ptr error);
/// The failure noted on this thread since the last call, or nullptr.
std::exception_ptr take_unobserved_failure();
}  // namespace dtp::detail
