// How a measurement is timed: every rank's calls between a barrier and a
// device synchronization, the ranks' times combined as nccl-tests' -a says;
// and the memory roofline, timed the same way.
#pragma once

#include <cstdint>
#include <functional>

#include "dtp/dtp.h"
#include "options.h"

namespace dtp::bench::collectives {

/// Waits for the device's queued work (GPU); nothing to wait for on the host.
void synchronize(const dtp::Comm& comm);

/// Combines one number per rank with the library all-reduce (outside any timed region).
double combine(dtp::Comm& comm, double value, dtp::ReduceOp op);

/// Seconds per call: `warmup` untimed calls, a barrier, then `iters` timed
/// calls on every rank; the ranks' times combined as -a says (nccl-tests'
/// default: their mean).
double time_calls(dtp::Comm& comm, const std::function<void()>& call, int warmup, int iters,
                  Average average = Average::max);

/// The memory roofline at one size: every rank copies its own S-byte buffer
/// at once (memcpy on the host, device-to-device on a GPU). Returns B_copy,
/// bytes read plus written per second over all ranks. A roofline is a bound,
/// so of three timed trials the fastest counts: a trial slowed by something
/// else on the machine does not lower the bar.
double copy_bandwidth(dtp::Comm& comm, std::int64_t bytes, int warmup, int iters);

}  // namespace dtp::bench::collectives
