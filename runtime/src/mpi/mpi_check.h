// Internal: every MPI call goes through DTP_MPI_CHECK (or mpi::check), which
// turns a failure into a dtp::Error with MPI's own text for the error.
#pragma once

namespace dtp::mpi {
/// Throws dtp::Error with the MPI error text when @p code is not MPI_SUCCESS.
void check(int code, const char* call);
}  // namespace dtp::mpi

#define DTP_MPI_CHECK(call) ::dtp::mpi::check((call), #call)
