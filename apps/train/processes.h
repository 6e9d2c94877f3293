// Which program and which process does the work: --impl picks the binary
// (the puzzles and the reference cannot share one), and under mpiexec only
// the process holding rank 0 prints and writes files.
#pragma once

#include <string>

#include "train/options.h"

namespace dtp::train_app {

/// "puzzles" or "reference": the library this binary is linked with.
const char* this_impl();

/// When @p impl names the other library, replaces this process with the
/// sibling binary (bin/dtp-train <-> bin/dtp-train-reference) and the same
/// arguments; returns only when @p impl is this binary's (or empty or
/// invalid: the full parse reports that). Throws UsageError when the sibling
/// cannot be started.
void run_impl(const std::string& impl, char** argv);

/// How this process takes part in the run.
struct ProcessRole {
  int processes = 1;    ///< processes mpiexec started (1 without mpiexec)
  bool reports = true;  ///< prints, and writes --json and --trace
  bool mpi = false;     ///< DTP_BACKEND=mpi
  int process = 0;      ///< this process's index among them (mpiexec's rank)
};

/// Learns this process's role and adjusts @p options to it: the strategy
/// resolves its settings (under mpiexec --world defaults to the process
/// count), processes other than rank 0's write no log, and each writes its
/// ranks' spans to a part of --trace. Throws UsageError for runs that would
/// train separate replicas (several processes on the thread backend) or
/// whose ranks are not the processes mpiexec started.
ProcessRole join_processes(Options& options);

/// On the reporting process of an mpiexec run: appends every other
/// process's part of the trace to @p trace_path (waiting up to DTP_TIMEOUT
/// for each), so the one file shows every rank; warns about a part that
/// never finished. Does nothing elsewhere.
void merge_trace_parts(const std::string& trace_path, const ProcessRole& role);

}  // namespace dtp::train_app
