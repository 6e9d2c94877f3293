// Internal: what launch() and the backends ask of fault injection.
#pragma once

namespace dtp::fault::detail {

/// A launch starts: no rank is down yet.
void begin_launch();
/// True when a fault took world rank @p rank down in this launch (in this
/// process: under mpi each process knows its own).
bool is_down(int rank);

}  // namespace dtp::fault::detail
