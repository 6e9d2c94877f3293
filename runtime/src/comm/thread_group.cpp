#include "comm/thread_group.h"

#include <algorithm>
#include <sstream>

#include "comm/backend.h"
#include "dtp/error.h"

namespace dtp {

std::string CollectiveCall::signature() const {
  std::ostringstream out;
  out << kind << "(";
  if (count >= 0) out << count << " x " << dtype_name(dtype);
  else if (kind != "barrier" && kind != "split") out << dtype_name(dtype);
  if (root >= 0) out << ", root " << root;
  if (uses_op) out << ", " << reduce_op_name(op);
  out << ")";
  return out.str();
}

ThreadGroup::ThreadGroup(std::shared_ptr<ThreadWorld> world, std::vector<int> members)
    : world_(std::move(world)), members_(std::move(members)) {
  mailbox_.resize(members_.size());
  calls_.resize(members_.size());
  split_result_.resize(members_.size());
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

void ThreadGroup::post(int destination, Message message) {
  message.sequence = sent_[{destination, message.source, message.tag}]++;
  mailbox_[destination].push_back(std::move(message));
}

std::int64_t ThreadGroup::take_ticket(int destination, int source, int tag) {
  return tickets_[{destination, source, tag}]++;
}

namespace {
auto matches(int source, int tag, std::int64_t ticket) {
  return [=](const Message& m) { return m.source == source && m.tag == tag && m.sequence == ticket; };
}
}  // namespace

bool ThreadGroup::has_message(int destination, int source, int tag, std::int64_t ticket) const {
  const auto& box = mailbox_[destination];
  return std::any_of(box.begin(), box.end(), matches(source, tag, ticket));
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

const std::vector<CollectiveCall>& ThreadGroup::arrive(int rank, CollectiveCall call) {
  std::unique_lock lock(world_->mutex);
  world_->throw_if_aborted(global_rank(rank));
  const std::int64_t generation = generation_;
  calls_[rank] = std::move(call);
  ++arrived_;
  if (arrived_ == size()) {
    complete_arrival();
  } else {
    const std::string what = calls_[rank].signature();
    world_->wait_until(
        lock, global_rank(rank), [&] { return generation_ > generation; },
        [&, what] {
          std::string missing;
          for (int r = 0; r < size(); ++r)
            if (calls_[r].kind.empty()) missing += (missing.empty() ? "" : ", ") + std::to_string(global_rank(r));
          return "the other ranks to join " + what + " on " + name() + " (not arrived: rank " +
                 missing + ")";
        });
  }
  return calls_;
}

void ThreadGroup::complete_arrival() {
  // Every rank must be calling the same collective on buffers that agree.
  const CollectiveCall& first = calls_[0];
  for (int r = 1; r < size(); ++r) {
    const CollectiveCall& c = calls_[r];
    bool same = c.kind == first.kind && c.root == first.root && c.uses_op == first.uses_op &&
                (!c.uses_op || c.op == first.op) &&
                (c.kind == "barrier" || c.kind == "split" || c.dtype == first.dtype) &&
                (c.count < 0 || first.count < 0 || c.count == first.count);
    if (!same) {
      std::ostringstream message;
      message << "collective mismatch on " << name() << ": ranks called different collectives at the same step:\n";
      for (int q = 0; q < size(); ++q)
        message << "  rank " << global_rank(q) << ": " << calls_[q].signature() << "\n";
      message << "Every rank must call the same collective with the same kind, element count, dtype, root and op.";
      world_->abort(global_rank(r), "collective mismatch");
      throw CommMismatch(message.str());
    }
  }
  // Gather and scatter: only the root knows the full size; check every shard against it.
  if (first.kind == "gather" || first.kind == "scatter") {
    const Tensor& full = calls_[first.root].second;
    for (int r = 0; r < size(); ++r) {
      ChunkRange range = chunk_range(full.numel(), size(), r);
      if (calls_[r].first.numel() != range.length || calls_[r].first.dtype() != full.dtype()) {
        std::ostringstream message;
        message << first.kind << " on " << name() << ": rank " << global_rank(r) << "'s shard is "
                << calls_[r].first.describe() << " but chunk " << r << " of root's "
                << full.describe() << " has " << range.length << " elements";
        world_->abort(global_rank(r), "collective mismatch");
        throw CommMismatch(message.str());
      }
    }
  }
  // The clocks meet at the slowest rank, then pay the algorithm's cost.
  double start = 0;
  for (int r = 0; r < size(); ++r) start = std::max(start, world_->clocks[global_rank(r)]);
  double end = start + collective_cost(first.kind, first.cost_bytes, size(), world_->config().cost);
  for (int r = 0; r < size(); ++r) world_->clocks[global_rank(r)] = end;

  if (first.kind == "split") {
    std::map<int, std::vector<int>> by_color;  // color -> group ranks in (key, rank) order
    for (int r = 0; r < size(); ++r) by_color[calls_[r].color].push_back(r);
    for (auto& [color, ranks] : by_color) {
      std::stable_sort(ranks.begin(), ranks.end(),
                       [&](int a, int b) { return calls_[a].key < calls_[b].key; });
      std::vector<int> global;
      for (int r : ranks) global.push_back(global_rank(r));
      auto group = ThreadGroup::create(world_, global);
      for (std::size_t i = 0; i < ranks.size(); ++i)
        split_result_[ranks[i]] = {group, static_cast<int>(i)};
    }
  }
  arrived_ = 0;
  ++generation_;
  world_->changed.notify_all();
}

void ThreadGroup::depart(int rank) {
  std::unique_lock lock(world_->mutex);
  const std::int64_t generation = generation_;
  ++departed_;
  if (departed_ == size()) {
    departed_ = 0;
    for (CollectiveCall& c : calls_) c = CollectiveCall{};
    ++departures_;
    world_->changed.notify_all();
    return;
  }
  const std::string what = calls_[rank].signature();
  world_->wait_until(
      lock, global_rank(rank), [&] { return departures_ >= generation; },
      [&, what] { return "the other ranks to finish " + what + " on " + name(); });
}

}  // namespace dtp
