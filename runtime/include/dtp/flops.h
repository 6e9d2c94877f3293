/// @file flops.h
/// @brief Counts the matrix-product FLOPs a thread runs (so a rank's, on the
/// thread backend; a process's under MPI).
///
/// The ops count what they compute, whatever the kernel: a matmul of [M, K]
/// by [K, N] is 2 M N K; attention over q [B, Tq, H, D] and Tk keys is
/// 4 B H Tq Tk D forward (the scores and the product with V, the full
/// rectangle whatever the mask), 8 B H Tq Tk D for the naive backward and
/// 10 B H Tq Tk D for the flash backward (it computes the scores again).
/// Element-wise ops, LayerNorm and the softmax are not counted: they are a
/// few FLOPs per element next to a product's C per element.
///
/// Inside a RecomputeScope (memory.h) the same FLOPs also count as
/// recomputed, so a checker can tell a checkpointed step's extra forward
/// from its first one.
#pragma once

#include <cstdint>

namespace dtp {

/// The calling thread's counts since its last reset_flop_counts().
struct FlopCounts {
  std::int64_t total = 0;      ///< every counted FLOP
  std::int64_t recompute = 0;  ///< the part run inside a RecomputeScope
};

/// The calling thread's counts.
FlopCounts flop_counts();
/// Sets the calling thread's counts to zero.
void reset_flop_counts();
/// Adds @p flops to the calling thread's counts (the ops call this).
void count_flops(std::int64_t flops);

}  // namespace dtp
