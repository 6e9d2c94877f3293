/// @file copy_lane.h
/// @brief A rank's copy lane: copies between device and host memory that run
/// beside the rank's compute (chapter 09 offloads activations with it).
///
/// copy_to() queues a copy and returns its destination at once; the copies
/// run in order on a thread of the rank's own (on a GPU, on a stream of
/// their own that first waits for everything the rank queued before), traced
/// as spans on the rank's lane 2 ("rank r copy"). drain() waits for every
/// copy queued so far. Until then the lane holds each copy's source, so its
/// memory stays charged whether the copy has finished or not: what a rank
/// holds at any moment follows from its calls alone, and memory checkers can
/// hold it to a formula.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "dtp/memory.h"
#include "dtp/tensor.h"

namespace dtp {

/// See the file comment. One per rank: copy_lane().
class CopyLane {
 public:
  CopyLane();
  ~CopyLane();
  CopyLane(const CopyLane&) = delete;
  CopyLane& operator=(const CopyLane&) = delete;

  /// Queues a copy of @p source into a new tensor of the same shape and
  /// dtype on @p to, charged to @p category (activations become recompute
  /// inside a RecomputeScope), and returns that tensor; its contents are
  /// valid after the next drain(). @p name labels the copy's trace span.
  Tensor copy_to(const Tensor& source, Device to, MemoryCategory category,
                 const std::string& name = "copy");
  /// Waits for every queued copy, then lets go of their sources. Rethrows
  /// what a copy threw. With copies queued, the wait is a trace span
  /// "drain" (category "copy") on the rank's own lane.
  void drain();
  /// Copies queued since the last drain().
  std::size_t queued() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The calling rank's copy lane, made on first use (each rank thread has its
/// own; under MPI, each process).
CopyLane& copy_lane();

}  // namespace dtp
