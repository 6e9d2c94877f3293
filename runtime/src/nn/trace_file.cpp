// Chrome trace files: the trace of `dtp train`, streamed to disk step by
// step, and the merge that makes one file of the per-process files that an
// mpiexec run writes.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "dtp/error.h"
#include "dtp/json.h"
#include "dtp/trace.h"

namespace dtp::trace {

namespace {
constexpr const char* kHeader = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
constexpr const char* kClosing = "\n]}\n";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DTP_CHECK(in.good(), "trace: cannot read '", path, "': ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

// The events of a finished trace file, between its header and its closing.
std::string events_of(const std::string& path, const std::string& text) {
  DTP_CHECK(text.rfind(kHeader, 0) == 0 && ends_with(text, kClosing), "trace: '", path,
            "' is not a finished DTP trace file");
  const std::size_t begin = std::strlen(kHeader);
  return text.substr(begin, text.size() - begin - std::strlen(kClosing));
}
}  // namespace

ChromeTraceFile::ChromeTraceFile(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "w");
  DTP_CHECK(file_ != nullptr, "trace: cannot write '", path_, "': ", std::strerror(errno));
  std::fputs(kHeader, file_);
  check_stream("writing the header of");
}

ChromeTraceFile::~ChromeTraceFile() {
  if (file_ != nullptr) std::fclose(file_);
}

void ChromeTraceFile::check_stream(const char* doing) {
  // fflush reports a full disk (/dev/full) that a buffered fputs hides.
  const bool failed = std::fflush(file_) != 0 || std::ferror(file_) != 0;
  DTP_CHECK(!failed, "trace: error ", doing, " '", path_, "': ", std::strerror(errno));
}

// One event per line. The comma goes before every event but the first, so
// the file needs no end marker: the closing follows the last event.
void ChromeTraceFile::write_event(const std::string& event) {
  if (!first_event_) std::fputs(",\n", file_);
  first_event_ = false;
  std::fputs(event.c_str(), file_);
}

void ChromeTraceFile::append(const std::vector<Span>& spans) {
  DTP_CHECK(file_ != nullptr, "trace: '", path_, "' is already finished");
  const double origin = origin_unix_us();
  char line[160];
  for (const Span& s : spans) {
    // A rank is a process (pid) with up to three threads (tid = lane), named
    // by metadata events the first time the rank or the lane appears.
    constexpr int kLanes = 3;
    static const char* const kLaneNames[kLanes] = {"", " comm", " copy"};
    const int first = kLanes * s.rank, track = first + s.lane;
    if (first + kLanes > static_cast<int>(named_tracks_.size()))
      named_tracks_.resize(static_cast<std::size_t>(first + kLanes), false);
    if (!named_tracks_[first] && !named_tracks_[first + 1] && !named_tracks_[first + 2]) {
      std::snprintf(
          line, sizeof line,
          "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}",
          s.rank, s.rank);
      write_event(line);
      std::snprintf(
          line, sizeof line,
          "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}}",
          s.rank, s.rank);
      write_event(line);
    }
    if (!named_tracks_[track]) {
      named_tracks_[track] = true;
      std::snprintf(line, sizeof line,
                    "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{"
                    "\"name\":\"rank %d%s\"}}",
                    s.rank, s.lane, s.rank, kLaneNames[s.lane]);
      write_event(line);
    }
    std::snprintf(line, sizeof line,
                  ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", s.rank, s.lane,
                  origin + s.start_us, s.end_us - s.start_us);
    write_event("{\"name\":" + json_string(s.name) + ",\"cat\":" + json_string(s.category) + line);
  }
  written_ += spans.size();
  check_stream("writing");
}

void ChromeTraceFile::finish() {
  DTP_CHECK(file_ != nullptr, "trace: '", path_, "' is already finished");
  std::fputs(kClosing, file_);
  check_stream("finishing");
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  DTP_CHECK(closed, "trace: error closing '", path_, "': ", std::strerror(errno));
}

void write_chrome_json(const std::string& path) {
  ChromeTraceFile file(path);
  file.append(spans());
  file.finish();
}

std::vector<std::string> merge_chrome_traces(const std::string& into,
                                             const std::vector<std::string>& parts,
                                             double timeout_s) {
  std::string merged = events_of(into, read_file(into));
  std::vector<std::string> unfinished, done;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (const std::string& part : parts) {
    // A part is finished when its closing is written: the other process may
    // still be writing its last step, so wait for it (polling, bounded).
    std::string text;
    for (;;) {
      std::ifstream probe(part, std::ios::binary);
      if (probe.good()) {
        text = read_file(part);
        if (ends_with(text, kClosing)) break;
      }
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!ends_with(text, kClosing)) {
      unfinished.push_back(part);
      continue;
    }
    const std::string events = events_of(part, text);
    if (!events.empty()) merged += (merged.empty() ? "" : ",\n") + events;
    done.push_back(part);
  }
  // Written beside the target and renamed over it: a reader never sees half.
  const std::string temporary = into + ".merging";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << kHeader << merged << kClosing;
    out.flush();
    DTP_CHECK(out.good(), "trace: cannot write '", temporary, "': ", std::strerror(errno));
  }
  DTP_CHECK(std::rename(temporary.c_str(), into.c_str()) == 0, "trace: cannot rename '", temporary,
            "' to '", into, "': ", std::strerror(errno));
  for (const std::string& part : done) std::remove(part.c_str());
  return unfinished;
}

}  // namespace dtp::trace
