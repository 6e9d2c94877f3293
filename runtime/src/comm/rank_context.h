// Internal: which rank the calling thread is (see dtp::current_rank()).
#pragma once

namespace dtp::detail {
void set_current_rank(int rank);
}  // namespace dtp::detail
