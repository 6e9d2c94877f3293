// The values a checked call runs on, chosen so that every mistake is visible
// (nccl-tests' -c), and the count of elements that differ from what the
// collective must give.
#pragma once

#include <cstdint>
#include <functional>

#include "dtp/dtp.h"

namespace dtp::bench::collectives {

/// Rank r's input element at flat index g. Small integers: every sum over up
/// to 1024 ranks stays exact in f32, so results are compared exactly.
double pattern(int rank, std::int64_t g);

/// The reduction @p op of pattern(r, g) over the n ranks: the sum, its mean
/// (a multiple of 1/2, exact in f32), the largest (rank n-1's) or the smallest (rank 0's).
double pattern_reduced(dtp::ReduceOp op, int n, std::int64_t g);

/// How far from the expected value a result may be: exact, except that an
/// average may divide by multiplying with 1/n.
double check_tolerance(dtp::ReduceOp op, dtp::DType dtype);

/// A host copy of @p t (t itself when it is already on the host).
dtp::Tensor to_host(const dtp::Tensor& t);

/// Fills @p t with value(g) for flat index g, through a host buffer on a GPU.
void fill_with(dtp::Tensor& t, const std::function<double(std::int64_t)>& value);

/// Elements g of @p t in [begin, end) that differ from expected(g) by more
/// than @p tolerance relative to it.
std::int64_t count_wrong(const dtp::Tensor& t, std::int64_t begin, std::int64_t end,
                         const std::function<double(std::int64_t)>& expected, double tolerance = 0);

}  // namespace dtp::bench::collectives
