/// @file fault.h
/// @brief Deterministic fault injection: a rank that crashes, hangs, runs
/// slow or loses a message at a planned step, on the thread and mpi
/// backends.
///
/// A plan names faults as `rank:step:kind`, comma-separated, in DTP_FAULT
/// or through set_plan():
///
/// | kind | what the rank does at the start of that step |
/// |---|---|
/// | `crash` | stops for good: throws InjectedCrash, which launch() takes as the rank leaving, not
/// as a failure; the others carry on | | `hang` | stops answering: blocks until every other rank
/// has returned from its function, then leaves as crash does | | `slow=S` | sleeps S seconds (wall
/// time), then goes on | | `drop-message` | goes on, but its next point-to-point send is lost: the
/// sender counts it, nobody receives it |
///
/// "rank" is the world rank of the Comm passed to at_step() and "step" the
/// number the caller passes (the trainers count from 1). A fault fires once
/// per process: a run restarted from a checkpoint passes the same step
/// again without it. Messages sent to a rank that a fault took down are not
/// reported as undelivered at the end of launch().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtp/error.h"

namespace dtp {

class Comm;

namespace fault {

/// The four kinds a plan can name.
enum class Kind { crash, hang, slow, drop_message };
/// "crash", "hang", "slow" or "drop-message".
const char* kind_name(Kind kind);

/// One planned fault.
struct Fault {
  int rank = 0;             ///< world rank
  std::int64_t step = 1;    ///< the step at whose start it fires
  Kind kind = Kind::crash;  ///< what it does
  double seconds = 0;       ///< slow: how long it sleeps
};

/// Parses a plan: "1:5:crash", "2:3:slow=0.25", "0:7:drop-message",
/// "1:4:hang", comma-separated ("" is no fault). Throws dtp::Error naming
/// the piece that is not `rank:step:kind` (rank >= 0, step >= 1, slow's
/// seconds finite and > 0) and one rank:step planned twice.
std::vector<Fault> parse_plan(const std::string& text);
/// "1:5:crash,2:3:slow=0.25" (parse_plan's form).
std::string plan_text(const std::vector<Fault>& plan);

/// Replaces this process's plan (and forgets which faults fired). Not while
/// ranks are running.
void set_plan(std::vector<Fault> plan);
/// This process's plan: DTP_FAULT's until set_plan() (read once; a plan
/// that does not parse throws dtp::Error naming DTP_FAULT).
std::vector<Fault> plan();

/// What a fault that fired did.
struct Fired {
  Fault fault;            ///< the planned fault
  double at_seconds = 0;  ///< when it fired (steady clock, seconds since this process started)
};
/// The faults of this process's plan that have fired, in order.
std::vector<Fired> fired();

/// Called by a training loop at the start of step @p step on every rank:
/// fires the fault planned for (world rank of @p comm, @p step), if any and
/// not fired yet. Returns at once when nothing is planned.
void at_step(Comm& comm, std::int64_t step);

/// What a crashed or hung rank throws out of its function. launch() takes
/// it as the rank leaving: it does not fail the launch or stop the others.
class InjectedCrash : public Error {
 public:
  /// @p fault fired; @p message says which, where and when.
  InjectedCrash(const Fault& fault, const std::string& message) : Error(message), fault_(fault) {}
  /// The fault that fired.
  const Fault& fault() const { return fault_; }

 private:
  Fault fault_;
};

/// The world ranks a fault took down in this process's launches so far
/// (crash or hang); launch() reads it for its end-of-launch report.
std::vector<int> ranks_down();

}  // namespace fault
}  // namespace dtp
