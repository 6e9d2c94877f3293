// Internal: which rank the calling thread is (see dtp::current_rank()).
#pragma once

#include <exception>

namespace dtp::detail {
void set_current_rank(int rank);
/// True on a rank's communication thread (the one that runs its non-blocking
/// collectives), false on the rank's own thread.
bool is_comm_worker();
void set_comm_worker(bool worker);
/// Records, for the calling rank's launch to report, a failure of a
/// non-blocking operation that nobody waited on (the first one is kept).
void note_unobserved_failure(std::exception_ptr error);
/// The failure noted on this thread since the last call, or nullptr.
std::exception_ptr take_unobserved_failure();
}  // namespace dtp::detail
