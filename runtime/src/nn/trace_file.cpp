// ChromeTraceFile: the trace of `dtp train`, streamed to disk step by step.
#include <cerrno>
#include <cstring>

#include "dtp/error.h"
#include "dtp/json.h"
#include "dtp/trace.h"

namespace dtp::trace {

ChromeTraceFile::ChromeTraceFile(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(path_.c_str(), "w");
  DTP_CHECK(file_ != nullptr, "trace: cannot write '", path_, "': ", std::strerror(errno));
  std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", file_);
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

void ChromeTraceFile::append(const std::vector<Span>& spans) {
  DTP_CHECK(file_ != nullptr, "trace: '", path_, "' is already finished");
  for (const Span& s : spans) {
    // One track (tid) per rank and lane; a metadata event names it
    // ("rank 0", "rank 0 comm") the first time it appears.
    const int track = 2 * s.rank + s.lane;
    if (track >= static_cast<int>(named_tracks_.size())) named_tracks_.resize(track + 1, false);
    if (!named_tracks_[track]) {
      named_tracks_[track] = true;
      std::fprintf(file_,
                   "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                   "\"args\":{\"name\":\"rank %d%s\"}},\n",
                   track, s.rank, s.lane ? " comm" : "");
    }
    std::fprintf(file_, "{\"name\":%s,\"cat\":%s,\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f},\n",
                 json_string(s.name).c_str(), json_string(s.category).c_str(), track, s.start_us,
                 s.end_us - s.start_us);
  }
  written_ += spans.size();
  check_stream("writing");
}

void ChromeTraceFile::finish() {
  DTP_CHECK(file_ != nullptr, "trace: '", path_, "' is already finished");
  // Every event above ends with a comma; this last one closes the array.
  std::fputs("{\"name\":\"dtp\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{}}\n]}\n", file_);
  check_stream("finishing");
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  DTP_CHECK(closed, "trace: error closing '", path_, "': ", std::strerror(errno));
}

}  // namespace dtp::trace
