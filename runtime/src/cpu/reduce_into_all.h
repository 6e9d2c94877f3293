// Internal: the thread backend's all-reduce step on the host, the twin of
// cuda::reduce_into_all. For elements [offset, offset + length) of every
// buffer, writes the reduction of all of them into all of them.
#pragma once

#include <cstdint>
#include <vector>

#include "dtp/dtype.h"
#include "dtp/ops.h"

namespace dtp::cpu {

void reduce_into_all(const std::vector<void*>& buffers, std::int64_t offset, std::int64_t length,
                     DType dtype, ReduceOp op);

}  // namespace dtp::cpu
