// Fault injection (dtp/fault.h): the plan, what fired, and what each kind
// does to the rank it hits. The backends supply the two things a rank cannot
// do alone: waiting until every other rank has left (hang) and losing one
// send (drop-message), through Comm.
#include "dtp/fault.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "comm/fault_internal.h"
#include "dtp/comm.h"

namespace dtp::fault {
namespace {

const auto kProcessStart = std::chrono::steady_clock::now();

// The plan and its log, shared by the rank threads of this process.
struct State {
  std::mutex mutex;
  bool loaded = false;  // DTP_FAULT read (or set_plan called)
  std::vector<Fault> plan;
  std::vector<bool> done;  // per planned fault: fired already
  std::vector<Fired> fired;
  std::set<int> down;  // ranks taken down in the current launch
};

State& state() {
  static State s;
  return s;
}

// Loads DTP_FAULT on first use (lock held).
void load(State& s) {
  if (s.loaded) return;
  const char* text = std::getenv("DTP_FAULT");
  try {
    s.plan = parse_plan(text ? text : "");
  } catch (const Error& e) {
    throw Error(std::string("DTP_FAULT: ") + e.what());
  }
  s.done.assign(s.plan.size(), false);
  s.loaded = true;
}

std::string where(const Fault& f) {
  return "rank " + std::to_string(f.rank) + " at the start of step " + std::to_string(f.step);
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::crash:
      return "crash";
    case Kind::hang:
      return "hang";
    case Kind::slow:
      return "slow";
    case Kind::drop_message:
      return "drop-message";
  }
  return "?";
}

std::vector<Fault> parse_plan(const std::string& text) {
  std::vector<Fault> plan;
  std::istringstream in(text);
  std::string piece;
  const std::string expected =
      "expected rank:step:kind with rank >= 0, step >= 1 and kind crash, hang, slow=SECONDS or "
      "drop-message (e.g. 1:5:crash,2:3:slow=0.25)";
  while (std::getline(in, piece, ',')) {
    if (piece.empty()) continue;
    const std::size_t a = piece.find(':'), b = piece.find(':', a == std::string::npos ? a : a + 1);
    DTP_CHECK(a != std::string::npos && b != std::string::npos, "fault plan: '", piece,
              "': ", expected);
    Fault f;
    char* end = nullptr;
    const std::string rank = piece.substr(0, a), step = piece.substr(a + 1, b - a - 1);
    const std::string kind = piece.substr(b + 1);
    const long r = std::strtol(rank.c_str(), &end, 10);
    DTP_CHECK(!rank.empty() && *end == '\0' && r >= 0 && r < (1 << 20), "fault plan: '", piece,
              "': rank '", rank, "' is not a rank; ", expected);
    const long long s = std::strtoll(step.c_str(), &end, 10);
    DTP_CHECK(!step.empty() && *end == '\0' && s >= 1, "fault plan: '", piece, "': step '", step,
              "' is not a step from 1; ", expected);
    f.rank = static_cast<int>(r);
    f.step = s;
    if (kind == "crash") {
      f.kind = Kind::crash;
    } else if (kind == "hang") {
      f.kind = Kind::hang;
    } else if (kind == "drop-message") {
      f.kind = Kind::drop_message;
    } else if (kind.rfind("slow=", 0) == 0) {
      f.kind = Kind::slow;
      const std::string seconds = kind.substr(5);
      f.seconds = std::strtod(seconds.c_str(), &end);
      DTP_CHECK(!seconds.empty() && *end == '\0' && std::isfinite(f.seconds) && f.seconds > 0,
                "fault plan: '", piece, "': slow needs seconds > 0 (slow=0.25), got '", seconds,
                "'");
    } else {
      throw Error("fault plan: '" + piece + "': kind '" + kind + "' is none of crash, hang, " +
                  "slow=SECONDS and drop-message; " + expected);
    }
    for (const Fault& g : plan)
      DTP_CHECK(g.rank != f.rank || g.step != f.step, "fault plan: rank ", f.rank, " at step ",
                f.step, " is planned twice (", kind_name(g.kind), " and ", kind_name(f.kind),
                "); a rank takes one fault per step");
    plan.push_back(f);
  }
  return plan;
}

std::string plan_text(const std::vector<Fault>& plan) {
  std::ostringstream out;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Fault& f = plan[i];
    out << (i ? "," : "") << f.rank << ":" << f.step << ":" << kind_name(f.kind);
    if (f.kind == Kind::slow) out << "=" << f.seconds;
  }
  return out.str();
}

void set_plan(std::vector<Fault> plan) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.plan = std::move(plan);
  s.done.assign(s.plan.size(), false);
  s.fired.clear();
  s.loaded = true;
}

std::vector<Fault> plan() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  load(s);
  return s.plan;
}

std::vector<Fired> fired() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.fired;
}

std::vector<int> ranks_down() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return {s.down.begin(), s.down.end()};
}

void at_step(Comm& comm, std::int64_t step) {
  Fault fault;
  {
    State& s = state();
    std::lock_guard lock(s.mutex);
    load(s);
    std::size_t i = 0;
    while (i < s.plan.size() &&
           (s.done[i] || s.plan[i].rank != comm.rank() || s.plan[i].step != step))
      ++i;
    if (i == s.plan.size()) return;
    s.done[i] = true;
    fault = s.plan[i];
    const double now =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - kProcessStart).count();
    s.fired.push_back({fault, now});
    if (fault.kind == Kind::crash || fault.kind == Kind::hang) s.down.insert(fault.rank);
  }
  switch (fault.kind) {
    case Kind::crash:
      throw InjectedCrash(fault, "injected fault: " + where(fault) + " crashed (DTP_FAULT " +
                                     plan_text({fault}) + ")");
    case Kind::hang:
      comm.wait_for_others_to_leave();
      throw InjectedCrash(fault, "injected fault: " + where(fault) +
                                     " hung until every other rank had left (DTP_FAULT " +
                                     plan_text({fault}) + ")");
    case Kind::slow:
      std::this_thread::sleep_for(std::chrono::duration<double>(fault.seconds));
      return;
    case Kind::drop_message:
      comm.lose_next_send();
      return;
  }
}

namespace detail {

void begin_launch() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.down.clear();
}

bool is_down(int rank) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.down.count(rank) != 0;
}

}  // namespace detail
}  // namespace dtp::fault
