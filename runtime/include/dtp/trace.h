/// @file trace.h
/// @brief Per-rank spans of work, exported as Chrome / Perfetto trace JSON.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace dtp::trace {

/// One interval of work on one rank.
struct Span {
  std::string name;      ///< e.g. "all_reduce" or "block 3 backward"
  std::string category;  ///< "compute", "comm", "schedule", ...
  int rank = 0;          ///< the rank (0 outside launch())
  int lane = 0;         ///< 0: the rank's own thread; 1: its communication thread; 2: its copy lane
  double start_us = 0;  ///< microseconds since enable()
  double end_us = 0;    ///< microseconds since enable(), when the span ended
};

/// Starts recording (clears earlier spans).
void enable();
/// Stops recording; recorded spans stay until the next enable() or clear().
void disable();
/// True between enable() and disable().
bool enabled();
/// Drops the recorded spans; recording stays on or off as it was.
void clear();
/// Spans recorded so far, in the order they ended.
std::vector<Span> spans();
/// Moves the spans recorded so far out of the list; recording goes on. A
/// long run's writer takes them every step, so the list never grows (a list
/// of millions of small records would fragment the heap around the step's
/// large tensor buffers).
std::vector<Span> take_spans();
/// When enable() was last called, in microseconds since the Unix epoch (the
/// wall clock). Trace files add it to every span's times, so the files that
/// separate processes write share one time axis and merge by concatenation.
double origin_unix_us();
/// Writes spans() as Chrome trace-event JSON (open in ui.perfetto.dev).
void write_chrome_json(const std::string& path);

/// A Chrome trace file written while the run goes on, so that a run that
/// fails (or is killed) still leaves what it recorded on disk. The file is
/// opened and its header written in the constructor (a bad path fails before
/// any work); every write is checked and flushed. Until finish() the file
/// lacks its closing "]}" (Perfetto still loads the events before a kill).
///
/// Each rank is a process of the trace (pid = rank, named "rank r" by a
/// process_name event) with up to three threads: tid 0, its own ("rank r"),
/// tid 1, its communication thread ("rank r comm"), and tid 2, its copy
/// lane ("rank r copy"). Times are microseconds since
/// the Unix epoch (origin_unix_us() + the span's time).
class ChromeTraceFile {
 public:
  /// Creates @p path and writes the header; throws dtp::Error naming the path.
  explicit ChromeTraceFile(std::string path);
  /// Closes the file; a file not finished stays without its closing.
  ~ChromeTraceFile();
  ChromeTraceFile(const ChromeTraceFile&) = delete;
  ChromeTraceFile& operator=(const ChromeTraceFile&) = delete;
  /// Writes @p spans and flushes; throws dtp::Error when the write fails.
  void append(const std::vector<Span>& spans);
  /// Writes the closing and closes; throws dtp::Error when that fails.
  void finish();
  /// Spans written so far.
  std::size_t spans_written() const { return written_; }

 private:
  void write_event(const std::string& event);
  void check_stream(const char* doing);
  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<bool> named_tracks_;  // index 3 * rank + lane: that thread's name is written
  std::size_t written_ = 0;
  bool first_event_ = true;
};

/// Appends the events of the finished trace files @p parts (each written by
/// a ChromeTraceFile in another process: under mpiexec, one per rank) to the
/// finished trace @p into, so one file shows every rank. Waits up to
/// @p timeout_s seconds for each part to be finished; returns the parts that
/// were not (their files are left as they are) and deletes the merged ones.
/// Throws dtp::Error when a file cannot be read or written.
std::vector<std::string> merge_chrome_traces(const std::string& into,
                                             const std::vector<std::string>& parts,
                                             double timeout_s);

/// Records one span on the calling rank from construction to destruction.
class Scope {
 public:
  /// Notes the start time if recording is on; otherwise this scope records nothing.
  Scope(std::string name, std::string category);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  std::string name_;
  std::string category_;
  double start_us_ = 0;
  bool active_ = false;
};

}  // namespace dtp::trace
