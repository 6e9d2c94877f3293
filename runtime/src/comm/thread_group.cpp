#include "comm/thread_group.h"

#include <algorithm>
#include <sstream>

#include "comm/backend.h"
#include "comm/fault_internal.h"
#include "cuda/device_api.h"
#include "dtp/error.h"

namespace dtp {

std::string CollectiveCall::signature() const {
  std::ostringstream out;
  out << kind << "(";
  if (count >= 0)
    out << count << " x " << dtype_name(dtype);
  else if (kind != "barrier" && kind != "split")
    out << dtype_name(dtype);
  if (root >= 0) out << ", root " << root;
  if (uses_op) out << ", " << reduce_op_name(op);
  out << ")";
  return out.str();
}

ThreadGroup::ThreadGroup(std::shared_ptr<ThreadWorld> world, std::vector<int> members)
    : world_(std::move(world)), members_(std::move(members)) {
  mailbox_.resize(members_.size());
  stream_events_.resize(members_.size());
}

ThreadGroup::~ThreadGroup() {
  const std::string leftovers = describe_undelivered();
  if (!leftovers.empty()) world_->note_left_behind(leftovers);
  for (auto& slots : stream_events_)
    for (StreamEvents& events : slots) {
      cuda::destroy_event(events.ready);
      cuda::destroy_event(events.done);
    }
}

const ThreadGroup::StreamEvents& ThreadGroup::stream_events(int rank, int slot) {
  StreamEvents& events =
      stream_events_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(slot)];
  if (events.ready == nullptr) events = {cuda::create_event(), cuda::create_event()};
  return events;
}

std::shared_ptr<ThreadGroup> ThreadGroup::create(std::shared_ptr<ThreadWorld> world,
                                                 std::vector<int> members) {
  auto group = std::make_shared<ThreadGroup>(world, std::move(members));
  world->add_group(group);
  return group;
}

std::string ThreadGroup::name() const {
  if (size() == world_->size()) {
    bool identity = true;
    for (int r = 0; r < size(); ++r) identity &= members_[r] == r;
    if (identity) return "the world";
  }
  std::string out = "group [";
  for (int r = 0; r < size(); ++r) out += (r ? ", " : "") + std::to_string(members_[r]);
  return out + "]";
}

// --- point to point -------------------------------------------------------------

std::int64_t ThreadGroup::post(int destination, Message message) {
  const std::int64_t sequence = sent_[{destination, message.source, message.tag}]++;
  message.sequence = sequence;
  mailbox_[destination].push_back(std::move(message));
  return sequence;
}

std::int64_t ThreadGroup::take_ticket(int destination, int source, int tag) {
  return tickets_[{destination, source, tag}]++;
}

bool ThreadGroup::receive_posted(int destination, int source, int tag,
                                 std::int64_t sequence) const {
  auto posted = tickets_.find({destination, source, tag});
  return posted != tickets_.end() && posted->second > sequence;
}

namespace {
auto matches(int source, int tag, std::int64_t ticket) {
  return
      [=](const Message& m) { return m.source == source && m.tag == tag && m.sequence == ticket; };
}
}  // namespace

bool ThreadGroup::has_message(int destination, int source, int tag, std::int64_t ticket) const {
  const auto& box = mailbox_[destination];
  return std::any_of(box.begin(), box.end(), matches(source, tag, ticket));
}

int ThreadGroup::next_ready_source(int destination, int source, int tag) const {
  for (int s = source < 0 ? 0 : source; s < (source < 0 ? size() : source + 1); ++s) {
    const auto claimed = tickets_.find({destination, s, tag});
    const std::int64_t next = claimed == tickets_.end() ? 0 : claimed->second;
    if (has_message(destination, s, tag, next)) return s;
  }
  return -1;
}

Message ThreadGroup::take_message(int destination, int source, int tag, std::int64_t ticket) {
  auto& box = mailbox_[destination];
  auto it = std::find_if(box.begin(), box.end(), matches(source, tag, ticket));
  Message out = std::move(*it);
  box.erase(it);
  return out;
}

std::string ThreadGroup::describe_undelivered() const {
  std::ostringstream out;
  for (int dst = 0; dst < size(); ++dst) {
    if (fault::detail::is_down(global_rank(dst))) continue;  // it left: nobody was to receive them
    for (const Message& m : mailbox_[dst]) {
      out << "  rank " << global_rank(m.source) << " -> rank " << global_rank(dst) << ", tag "
          << m.tag << ": " << m.payload.numel() << " x " << dtype_name(m.payload.dtype());
      if (name() != "the world") out << " (in " << name() << ")";
      out << "\n";
    }
  }
  return out.str();
}

// --- collectives ----------------------------------------------------------------
//
// Two meetings per collective: arrive (everyone's buffers are published and
// checked to agree), then each rank does its share of the work directly on the
// other ranks' memory, then depart (nobody returns, and perhaps reuses its
// buffer, while a peer still reads it).

ThreadGroup::Rendezvous& ThreadGroup::rendezvous(std::int64_t sequence) {
  Rendezvous& meeting = rendezvous_[sequence];
  if (meeting.calls.empty()) {
    meeting.calls.resize(members_.size());
    meeting.split_result.resize(members_.size());
  }
  return meeting;
}

const std::vector<CollectiveCall>& ThreadGroup::arrive(int rank, CollectiveCall call) {
  std::unique_lock lock(world_->mutex);
  world_->throw_if_aborted(global_rank(rank));
  const std::int64_t sequence = call.sequence;
  Rendezvous& meeting = rendezvous(sequence);
  meeting.calls[rank] = std::move(call);
  if (++meeting.arrived == size()) {
    complete_arrival(meeting);
  } else {
    const std::string what = meeting.calls[rank].signature();
    world_->wait_until(
        lock, global_rank(rank), [&meeting] { return meeting.complete; },
        [this, &meeting, what] {
          std::string missing;
          for (int r = 0; r < size(); ++r)
            if (meeting.calls[r].kind.empty())
              missing += (missing.empty() ? "" : ", ") + std::to_string(global_rank(r));
          return "the other ranks to join " + what + " on " + name() + " (not arrived: rank " +
                 missing + ")";
        });
  }
  return meeting.calls;
}

void ThreadGroup::complete_arrival(Rendezvous& meeting) {
  const std::vector<CollectiveCall>& calls = meeting.calls;
  // Every rank must be calling the same collective on buffers that agree.
  const CollectiveCall& first = calls[0];
  for (int r = 1; r < size(); ++r) {
    const CollectiveCall& c = calls[r];
    bool same = c.kind == first.kind && c.root == first.root && c.uses_op == first.uses_op &&
                (!c.uses_op || c.op == first.op) &&
                (c.kind == "barrier" || c.kind == "split" || c.dtype == first.dtype) &&
                (c.count < 0 || first.count < 0 || c.count == first.count);
    if (!same) {
      std::ostringstream message;
      message << "collective mismatch on " << name()
              << ": ranks called different collectives at the same step (collective #"
              << first.sequence + 1 << " on it):\n";
      for (int q = 0; q < size(); ++q)
        message << "  rank " << global_rank(q) << ": " << calls[q].signature() << "\n";
      message << "Every rank must call the same collectives in the same order, with the same kind, "
                 "element count, dtype, root and op.";
      world_->abort(global_rank(r), "collective mismatch");
      throw CommMismatch(message.str());
    }
  }
  // Gather and scatter: only the root knows the full size; check every shard against it.
  if (first.kind == "gather" || first.kind == "scatter") {
    const Tensor& full = calls[first.root].second;
    for (int r = 0; r < size(); ++r) {
      ChunkRange range = chunk_range(full.numel(), size(), r);
      if (calls[r].first.numel() != range.length || calls[r].first.dtype() != full.dtype()) {
        std::ostringstream message;
        message << first.kind << " on " << name() << ": rank " << global_rank(r) << "'s shard is "
                << calls[r].first.describe() << " but chunk " << r << " of root's "
                << full.describe() << " has " << range.length << " elements";
        world_->abort(global_rank(r), "collective mismatch");
        throw CommMismatch(message.str());
      }
    }
  }
  // The clocks meet at the slowest rank, then pay the algorithm's cost.
  double start = 0;
  for (int r = 0; r < size(); ++r) start = std::max(start, world_->clocks[global_rank(r)]);
  double end = start + collective_cost(first.kind, first.cost_bytes, size(), cost());
  for (int r = 0; r < size(); ++r) world_->clocks[global_rank(r)] = end;

  if (first.kind == "split") {
    std::map<int, std::vector<int>> by_color;  // color -> group ranks in (key, rank) order
    for (int r = 0; r < size(); ++r) by_color[calls[r].color].push_back(r);
    for (auto& [color, ranks] : by_color) {
      std::stable_sort(ranks.begin(), ranks.end(),
                       [&](int a, int b) { return calls[a].key < calls[b].key; });
      std::vector<int> global;
      for (int r : ranks) global.push_back(global_rank(r));
      auto group = ThreadGroup::create(world_, global);
      for (std::size_t i = 0; i < ranks.size(); ++i)
        meeting.split_result[ranks[i]] = {group, static_cast<int>(i)};
    }
  }
  meeting.complete = true;
  world_->changed.notify_all();
}

CostModel ThreadGroup::cost() const { return world_->config().cost.for_group(members_); }

std::pair<std::shared_ptr<ThreadGroup>, int> ThreadGroup::split_result(
    int rank, std::int64_t sequence) const {
  std::lock_guard lock(world_->mutex);
  return rendezvous_.at(sequence).split_result[rank];
}

void ThreadGroup::depart(int rank, std::int64_t sequence) {
  std::unique_lock lock(world_->mutex);
  Rendezvous& meeting = rendezvous_.at(sequence);
  if (++meeting.departed == size()) {
    rendezvous_.erase(sequence);
    world_->changed.notify_all();
    return;
  }
  const std::string what = meeting.calls[rank].signature();
  world_->wait_until(
      lock, global_rank(rank), [this, sequence] { return !rendezvous_.contains(sequence); },
      [this, what] { return "the other ranks to finish " + what + " on " + name(); });
}

}  // namespace dtp
