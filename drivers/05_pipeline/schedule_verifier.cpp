// The verifier: is a schedule complete, does every rank's order respect the
// data flow, and how does it run on a simulated clock (makespan, bubble,
// micro-batches alive, or the deadlock that stops it). Provided code.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "05_pipeline/pipeline.h"

namespace dtp::ch05 {
namespace {

// An action placed on the model: kind, virtual stage, micro-batch.
using Key = std::tuple<ActionKind, int, int>;

Key key_of(const Schedule& s, int rank, const Action& a) {
  return {a.kind, s.virtual_stage(rank, a.chunk), a.microbatch};
}

int rank_of(const Schedule& s, int virtual_stage) { return virtual_stage % s.stages; }

// The actions that must end before @p a on @p rank can start.
std::vector<Key> dependencies(const Schedule& s, int rank, const Action& a) {
  const int vs = s.virtual_stage(rank, a.chunk);
  const int mb = a.microbatch;
  switch (a.kind) {
    case ActionKind::forward:
      if (vs > 0) return {{ActionKind::forward, vs - 1, mb}};
      return {};
    case ActionKind::backward: {
      std::vector<Key> deps{{ActionKind::forward, vs, mb}};
      if (vs + 1 < s.virtual_stages()) deps.push_back({ActionKind::backward, vs + 1, mb});
      return deps;
    }
    case ActionKind::weight:
      return {{ActionKind::backward, vs, mb}};
  }
  return {};
}

std::string name_on(const Schedule& s, const Key& key) {
  const auto& [kind, vs, mb] = key;
  return "rank " + std::to_string(rank_of(s, vs)) + "'s " +
         action_name(Action{kind, mb, vs / s.stages}, s.chunks);
}

// Completeness, ranges, and the order of one micro-batch's actions on its own rank.
std::string structural_problem(const Schedule& s) {
  const int p = s.stages, m = s.microbatches, v = s.chunks;
  if (p < 1 || m < 1 || v < 1)
    return "the schedule has stages " + std::to_string(p) + ", micro-batches " + std::to_string(m) +
           ", chunks " + std::to_string(v) + "; each must be at least 1";
  if (static_cast<int>(s.actions.size()) != p)
    return "the schedule has " + std::to_string(s.actions.size()) + " lists of actions for " +
           std::to_string(p) + " stages (one per rank)";
  const std::string kinds = s.split_backward ? "F, B and W" : "F and B";
  for (int r = 0; r < p; ++r) {
    std::map<std::tuple<int, int, int>, int> position;  // (kind, chunk, mb) -> index in the list
    const auto& list = s.actions[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      const std::string at = "rank " + std::to_string(r) + "'s action " + std::to_string(i) + " (" +
                             action_name(a, v) + ")";
      if (a.microbatch < 0 || a.microbatch >= m)
        return at + ": micro-batch " + std::to_string(a.microbatch) + " is outside [0, " +
               std::to_string(m) + ")";
      if (a.chunk < 0 || a.chunk >= v)
        return at + ": chunk " + std::to_string(a.chunk) + " is outside [0, " + std::to_string(v) +
               ")";
      if (a.kind == ActionKind::weight && !s.split_backward)
        return at +
               ": a W in a schedule that does not split the backward (set split_backward, or drop "
               "the W: "
               "B then computes the weight gradients too)";
      const auto slot = std::make_tuple(static_cast<int>(a.kind), a.chunk, a.microbatch);
      if (position.count(slot))
        return "rank " + std::to_string(r) + " runs " + action_name(a, v) + " twice (actions " +
               std::to_string(position[slot]) + " and " + std::to_string(i) + ")";
      position[slot] = static_cast<int>(i);
    }
    for (int c = 0; c < v; ++c) {
      for (int mb = 0; mb < m; ++mb) {
        const auto at = [&](ActionKind k) {
          auto it = position.find({static_cast<int>(k), c, mb});
          return it == position.end() ? -1 : it->second;
        };
        for (ActionKind k : {ActionKind::forward, ActionKind::backward, ActionKind::weight}) {
          if (k == ActionKind::weight && !s.split_backward) continue;
          if (at(k) < 0)
            return "rank " + std::to_string(r) + " never runs " + action_name(Action{k, mb, c}, v) +
                   " (each rank runs " + kinds + " once for each of its " + std::to_string(m * v) +
                   " (micro-batch, chunk) pairs)";
        }
        if (at(ActionKind::backward) < at(ActionKind::forward))
          return "rank " + std::to_string(r) + " runs " + action_name(B(mb, c), v) + " (action " +
                 std::to_string(at(ActionKind::backward)) + ") before its own " +
                 action_name(F(mb, c), v) + " (action " + std::to_string(at(ActionKind::forward)) +
                 "): a backward needs the activations its forward saves";
        if (s.split_backward && at(ActionKind::weight) < at(ActionKind::backward))
          return "rank " + std::to_string(r) + " runs " + action_name(W(mb, c), v) + " (action " +
                 std::to_string(at(ActionKind::weight)) + ") before its " +
                 action_name(B(mb, c), v) + " (action " + std::to_string(at(ActionKind::backward)) +
                 "): the weight gradient needs the output gradient B receives";
      }
    }
  }
  return "";
}

}  // namespace

ScheduleReport simulate_schedule(const Schedule& s, const ActionCosts& costs) {
  ScheduleReport report;
  report.problem = structural_problem(s);
  if (!report.ok()) return report;
  const int p = s.stages;
  std::map<Key, double> end_time;
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0.0);
  report.busy.assign(static_cast<std::size_t>(p), 0.0);
  report.timeline.assign(static_cast<std::size_t>(p), {});
  // Sweep: run every rank as far as its next action's inputs exist. Times
  // do not depend on the sweep order: an action starts at max(its rank is
  // free, its inputs have ended), both fixed once known.
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      const auto& list = s.actions[static_cast<std::size_t>(r)];
      auto& i = next[static_cast<std::size_t>(r)];
      while (i < list.size()) {
        double start = free_at[static_cast<std::size_t>(r)];
        bool ready = true;
        for (const Key& d : dependencies(s, r, list[i])) {
          auto it = end_time.find(d);
          if (it == end_time.end()) {
            ready = false;
            break;
          }
          start = std::max(start, it->second);
        }
        if (!ready) break;
        const double cost = costs.of(list[i].kind, s.split_backward);
        const double end = start + cost;
        end_time[key_of(s, r, list[i])] = end;
        free_at[static_cast<std::size_t>(r)] = end;
        report.busy[static_cast<std::size_t>(r)] += cost;
        report.timeline[static_cast<std::size_t>(r)].push_back({list[i], start, end});
        ++i;
        progress = true;
      }
    }
  }
  // Stuck: follow who waits for whom until a rank repeats; that is the cycle.
  for (int r = 0; r < p; ++r) {
    if (next[static_cast<std::size_t>(r)] == s.actions[static_cast<std::size_t>(r)].size())
      continue;
    std::vector<int> path;
    std::map<int, std::size_t> seen;
    int at = r;
    while (!seen.count(at)) {
      seen[at] = path.size();
      path.push_back(at);
      const Action& a = s.actions[static_cast<std::size_t>(at)][next[static_cast<std::size_t>(at)]];
      for (const Key& d : dependencies(s, at, a))
        if (!end_time.count(d)) {
          at = rank_of(s, std::get<1>(d));
          break;
        }
    }
    std::string cycle;
    for (std::size_t k = seen[at]; k < path.size(); ++k) {
      const int q = path[k];
      const Action& a = s.actions[static_cast<std::size_t>(q)][next[static_cast<std::size_t>(q)]];
      for (const Key& d : dependencies(s, q, a))
        if (!end_time.count(d)) {
          cycle += (cycle.empty() ? "" : "; ") + std::string("rank ") + std::to_string(q) +
                   " waits at " + action_name(a, s.chunks) + " for " + name_on(s, d);
          break;
        }
    }
    report.problem =
        "deadlock: " + cycle +
        ". Each waits for an action that comes later in the other's list: reorder so that "
        "what one rank waits for can run first";
    report.timeline.clear();
    report.busy.clear();
    return report;
  }
  for (double t : free_at) report.makespan = std::max(report.makespan, t);
  double busy = 0;
  for (double b : report.busy) busy += b;
  report.bubble_fraction = report.makespan > 0 ? 1.0 - busy / (p * report.makespan) : 0.0;
  for (const auto& timeline : report.timeline) {
    std::vector<Action> order;
    for (const TimedAction& t : timeline) order.push_back(t.action);
    report.peak_alive.push_back(peak_alive(order, s.split_backward));
  }
  return report;
}

int peak_alive(const std::vector<Action>& actions, bool split_backward) {
  const ActionKind last = split_backward ? ActionKind::weight : ActionKind::backward;
  int alive = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::forward) peak = std::max(peak, ++alive);
    if (a.kind == last) --alive;
  }
  return peak;
}

void check_schedule(const Schedule& schedule) {
  const ScheduleReport report = simulate_schedule(schedule);
  if (!report.ok())
    throw Error(schedule.name + " schedule (p " + std::to_string(schedule.stages) + ", m " +
                std::to_string(schedule.microbatches) + "): " + report.problem);
}

std::string gantt_chart(const Schedule& s, const ScheduleReport& report, double unit) {
  if (!report.ok()) return "no chart: " + report.problem + "\n";
  DTP_CHECK(unit > 0 && std::isfinite(unit), "gantt_chart: the time unit must be > 0, got ", unit);
  // Every column is one unit of time, as wide as the widest label.
  const int width = static_cast<int>(std::to_string(std::max(0, s.microbatches - 1)).size()) + 1;
  const auto columns = static_cast<std::size_t>(std::llround(report.makespan / unit));
  std::ostringstream out;
  for (int r = 0; r < s.stages; ++r) {
    std::string row(columns * static_cast<std::size_t>(width), '.');
    for (const TimedAction& t : report.timeline[static_cast<std::size_t>(r)]) {
      const auto from =
          static_cast<std::size_t>(std::llround(t.start / unit)) * static_cast<std::size_t>(width);
      const auto to =
          static_cast<std::size_t>(std::llround(t.end / unit)) * static_cast<std::size_t>(width);
      std::string label = action_letter(t.action.kind);
      // Interleaved: chunk 0 in upper case, chunk 1 in lower case, and so on.
      if (t.action.chunk % 2 == 1) label[0] = static_cast<char>(label[0] - 'A' + 'a');
      label += std::to_string(t.action.microbatch);
      for (std::size_t c = from; c < to && c < row.size(); ++c) {
        const std::size_t k = (c - from) % static_cast<std::size_t>(width);
        row[c] = k < label.size() ? label[k] : ' ';
      }
    }
    out << "rank " << r << " |" << row << "|\n";
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "makespan %.6g, bubble %.1f%% (idle share of %d ranks x makespan)", report.makespan,
                100.0 * report.bubble_fraction, s.stages);
  out << line << "\npeak micro-batches alive per rank:";
  for (int peak : report.peak_alive) out << ' ' << peak;
  out << '\n';
  return out.str();
}

}  // namespace dtp::ch05
