#include "train/processes.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>

#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp/trace.h"

#ifndef DTP_TRAIN_IMPL
#error "DTP_TRAIN_IMPL (puzzles or reference) is set by apps/CMakeLists.txt"
#endif

namespace dtp::train_app {
namespace {

// What mpiexec's launcher tells each process (Open MPI, then the PMI
// variables of MPICH and Slurm): the first of @p names set to a number of at
// least @p least, else @p otherwise (outside mpiexec).
int launcher_number(std::initializer_list<const char*> names, int least, int otherwise) {
  for (const char* name : names) {
    if (const char* value = std::getenv(name)) {
      const int n = std::atoi(value);
      if (n >= least) return n;
    }
  }
  return otherwise;
}

// Processes mpiexec started; 1 outside mpiexec.
int launcher_process_count() {
  return launcher_number({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}, 1, 1);
}

// This process's index among them; 0 outside mpiexec.
int launcher_process_index() {
  return launcher_number({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}, 0, 0);
}

// Where process @p index writes its part of the trace under mpiexec.
std::string trace_part(const std::string& trace_path, int index) {
  return trace_path + ".part" + std::to_string(index);
}

}  // namespace

const char* this_impl() { return DTP_TRAIN_IMPL; }

void run_impl(const std::string& impl, char** argv) {
  if (impl != "puzzles" && impl != "reference") return;
  if (impl == this_impl()) return;
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  const std::string sibling = impl == "reference" ? "dtp-train-reference" : "dtp-train";
  const std::filesystem::path program =
      (error ? std::filesystem::path(argv[0]).parent_path() : self.parent_path()) / sibling;
  const std::string path = program.string();
  argv[0] = const_cast<char*>(path.c_str());
  ::execv(path.c_str(), argv);
  // execv returns only on failure.
  throw UsageError("--impl " + impl + ": cannot start '" + path + "': " + std::strerror(errno) +
                   " (build it: cmake --build build --target " + sibling + ")");
}

ProcessRole join_processes(Options& options) {
  ProcessRole role;
  const char* backend = std::getenv("DTP_BACKEND");
  role.mpi = backend != nullptr && std::string(backend) == "mpi";
  const int started = launcher_process_count();
  if (!role.mpi && started > 1)
    throw UsageError("dtp-train runs as one of " + std::to_string(started) +
                     " mpiexec processes, but DTP_BACKEND is not mpi: each would train alone "
                     "and write the same files; set DTP_BACKEND=mpi");
  if (role.mpi) {
    role.processes = max_world_size(Backend::mpi);
    if (role.processes < 1)
      throw UsageError("DTP_BACKEND=mpi, but this dtp-train was built without MPI");
  }
  // Every process resolves alike (under mpiexec --world defaults to the
  // process count), so every rank runs the same settings.
  drivers::Strategy& strategy = *options.strategy;
  strategy.resolve(options.config, options.given, role.mpi ? role.processes : 0);
  if (!role.mpi) return role;
  if (strategy.world_size() != role.processes)
    throw UsageError("--strategy " + strategy.name() + " runs " + strategy.world_text() +
                     ", but mpiexec started " + std::to_string(role.processes) + " processes");
  // A world of one rank runs on MPI process 0 alone: the others sit it out,
  // which tells each process whether it is the one that reports.
  bool holds_rank_zero = false;
  World probe;
  probe.size = 1;
  probe.backend = Backend::mpi;
  launch(probe, [&](Comm&) { holds_rank_zero = true; });
  role.reports = holds_rank_zero;
  role.process = launcher_process_index();
  if (!role.reports) {
    // Each process traces its own ranks into a part of the trace, which the
    // reporting process merges into the one file when the run ends.
    options.config.json_path.clear();
    if (!options.config.trace_path.empty())
      options.config.trace_path = trace_part(options.config.trace_path, role.process);
  }
  return role;
}

void merge_trace_parts(const std::string& trace_path, const ProcessRole& role) {
  if (!role.reports || trace_path.empty() || role.processes < 2) return;
  std::vector<std::string> parts;
  for (int index = 0; index < role.processes; ++index)
    if (index != role.process) parts.push_back(trace_part(trace_path, index));
  const double timeout = default_timeout_seconds();
  for (const std::string& part : trace::merge_chrome_traces(trace_path, parts, timeout))
    std::fprintf(
        stderr,
        "dtp-train: warning: the trace part '%s' was not finished within %.0f s (DTP_TIMEOUT); "
        "%s lacks that process's ranks\n",
        part.c_str(), timeout, trace_path.c_str());
}

}  // namespace dtp::train_app
