// Internal: every NCCL call goes through DTP_NCCL_CHECK, which turns a
// failure into a dtp::Error naming the call, the file and the line.
#pragma once

#include <nccl.h>

namespace dtp::nccl {
/// Throws dtp::Error naming the NCCL call, file and line when @p code fails
/// (ncclInProgress, a non-blocking call under way, is not a failure).
void check(ncclResult_t code, const char* call, const char* file, int line);
}  // namespace dtp::nccl

#define DTP_NCCL_CHECK(call) ::dtp::nccl::check((call), #call, __FILE__, __LINE__)
