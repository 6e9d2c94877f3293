/// @file ops.h
/// @brief Element-wise math on tensors that collectives and optimizers need.
#pragma once

#include "dtp/tensor.h"

namespace dtp {

/// How a reduction combines values. `avg` is a sum divided by the number of
/// ranks; it is defined for floating dtypes only.
enum class ReduceOp { sum, avg, max, min };
/// "sum", "avg", "max" or "min".
const char* reduce_op_name(ReduceOp op);

namespace ops {

/// dst[i] = dst[i] (op) src[i] for every i; @p op is sum, max or min
/// (avg is a sum followed by scale). Same dtype, device and numel.
void accumulate(Tensor& dst, const Tensor& src, ReduceOp op = ReduceOp::sum);
/// x[i] *= factor.
void scale(Tensor& x, double factor);
/// True when every element of a and b is bitwise equal as a value (same dtype and numel).
bool equal(const Tensor& a, const Tensor& b);

}  // namespace ops
}  // namespace dtp
