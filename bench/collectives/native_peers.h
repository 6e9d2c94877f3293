// The backends' own libraries as peers (`--impl native`): one call per
// collective through MPI, one through NCCL, reached with
// Comm::native_handle(). Each set is compiled only where the build has that
// library; the collective table names them through DTP_MPI_PEER and
// DTP_NCCL_PEER, which give a null pointer where it has not.
#pragma once

#include <string>

#include "collective_table.h"

#ifdef DTP_HAVE_MPI
namespace dtp::bench::collectives::mpi_peer {
Call all_reduce(const CallArgs& args, std::string& why_not);
Call all_gather(const CallArgs& args, std::string& why_not);
Call reduce_scatter(const CallArgs& args, std::string& why_not);
Call broadcast(const CallArgs& args, std::string& why_not);
Call reduce(const CallArgs& args, std::string& why_not);
Call all_to_all(const CallArgs& args, std::string& why_not);
Call sendrecv(const CallArgs& args, std::string& why_not);
}  // namespace dtp::bench::collectives::mpi_peer
#define DTP_MPI_PEER(collective) (&::dtp::bench::collectives::mpi_peer::collective)
#else
#define DTP_MPI_PEER(collective) nullptr
#endif

#ifdef DTP_HAVE_NCCL
namespace dtp::bench::collectives::nccl_peer {
Call all_reduce(const CallArgs& args, std::string& why_not);
Call all_gather(const CallArgs& args, std::string& why_not);
Call reduce_scatter(const CallArgs& args, std::string& why_not);
Call broadcast(const CallArgs& args, std::string& why_not);
Call reduce(const CallArgs& args, std::string& why_not);
Call all_to_all(const CallArgs& args, std::string& why_not);
Call sendrecv(const CallArgs& args, std::string& why_not);
}  // namespace dtp::bench::collectives::nccl_peer
#define DTP_NCCL_PEER(collective) (&::dtp::bench::collectives::nccl_peer::collective)
#else
#define DTP_NCCL_PEER(collective) nullptr
#endif
