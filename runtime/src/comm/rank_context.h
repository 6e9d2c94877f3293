// Internal: which rank the calling thread is (see dtp::current_rank()).
#pragma once

namespace dtp::detail {
void set_current_rank(int rank);
/// True on a rank's communication thread (the one that runs its non-blocking
/// collectives), false on the rank's own thread.
bool is_comm_worker();
void set_comm_worker(bool worker);
}  // namespace dtp::detail
