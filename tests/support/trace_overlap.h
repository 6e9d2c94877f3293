// Overlap read from the trace (dtp/trace.h). On the thread backend a rank's
// non-blocking collectives run on its communication thread (trace lane 1)
// and its compute on its own thread (lane 0); Request::wait() leaves a
// "wait" span on lane 0 where the rank's thread blocked on a request that
// had not been waited on before. The order of lane-0 events is exact; how
// much of lane 1 overlaps lane 0 is timing, so a checker asks to see it in
// at least one of several steps.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "dtp/launch.h"
#include "dtp/trace.h"

namespace dtp::testing {

/// True when the run's backend gives each rank a communication thread of
/// its own (the thread backend); mpi and nccl progress non-blocking
/// collectives inside library calls, with no spans of their own.
inline bool trace_has_comm_lane() { return World::from_env(2).backend == Backend::thread; }

/// One rank's spans, split by thread, each list in order of start time.
struct RankLanes {
  std::vector<trace::Span> own;   ///< lane 0: the rank's thread
  std::vector<trace::Span> comm;  ///< lane 1: its communication thread
  std::vector<trace::Span> copy;  ///< lane 2: its copy lane (dtp/copy_lane.h)
};

inline RankLanes lanes_of(const std::vector<trace::Span>& spans, int rank) {
  RankLanes lanes;
  for (const trace::Span& s : spans)
    if (s.rank == rank)
      (s.lane == 0 ? lanes.own : s.lane == 1 ? lanes.comm : lanes.copy).push_back(s);
  const auto by_start = [](const trace::Span& a, const trace::Span& b) {
    return a.start_us < b.start_us;
  };
  for (auto* lane : {&lanes.own, &lanes.comm, &lanes.copy})
    std::sort(lane->begin(), lane->end(), by_start);
  return lanes;
}

/// The spans of @p lane named @p name, in order.
inline std::vector<trace::Span> named(const std::vector<trace::Span>& lane,
                                      const std::string& name) {
  std::vector<trace::Span> out;
  for (const trace::Span& s : lane)
    if (s.name == name) out.push_back(s);
  return out;
}

/// Each backward pass of a GPT on lane 0, from the start of "head backward"
/// to the end of "embedding backward".
inline std::vector<std::pair<double, double>> backward_passes(const RankLanes& lanes) {
  std::vector<std::pair<double, double>> passes;
  for (const trace::Span& s : lanes.own) {
    if (s.name == "head backward") passes.push_back({s.start_us, -1});
    if (s.name == "embedding backward" && !passes.empty()) passes.back().second = s.end_us;
  }
  return passes;
}

/// The "wait" spans of lane 0 that start inside a backward pass: the rank's
/// thread blocked on a request while backward was still running.
inline std::vector<trace::Span> waits_during_backward(const RankLanes& lanes) {
  std::vector<trace::Span> out;
  const auto passes = backward_passes(lanes);
  for (const trace::Span& w : named(lanes.own, "wait"))
    for (const auto& [begin, end] : passes)
      if (w.start_us >= begin && w.start_us < end) {
        out.push_back(w);
        break;
      }
  return out;
}

/// True when @p span ran during backward: it intersects a lane-0 compute
/// span whose name holds "backward", or it started and ended within one
/// backward pass. (Either can miss on busy cores: a rank's two threads often
/// take turns, the communication thread running while the rank's thread is
/// between two units; and a rank ahead of its peer waits inside the
/// collective until after its own backward.)
inline bool during_backward(const RankLanes& lanes, const trace::Span& span) {
  for (const trace::Span& s : lanes.own)
    if (s.category == "compute" && s.name.find("backward") != std::string::npos &&
        s.start_us < span.end_us && span.start_us < s.end_us)
      return true;
  for (const auto& [begin, end] : backward_passes(lanes))
    if (span.start_us >= begin && span.end_us <= end) return true;
  return false;
}

/// The lane-0 spans named @p name that start inside the first lane-0 span
/// named @p window: what the rank's thread did there.
inline std::size_t count_inside(const RankLanes& lanes, const std::string& window,
                                const std::string& name) {
  const std::vector<trace::Span> windows = named(lanes.own, window);
  if (windows.empty()) return 0;
  const trace::Span& w = windows.front();
  std::size_t count = 0;
  for (const trace::Span& s : named(lanes.own, name))
    count += s.start_us >= w.start_us && s.end_us <= w.end_us ? 1 : 0;
  return count;
}

}  // namespace dtp::testing
