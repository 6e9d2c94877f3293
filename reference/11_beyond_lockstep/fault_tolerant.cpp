// Puzzle 11.5: a data-parallel step that survives a failed replica.
//
// The coordinator takes each live replica's gradient of the step and
// waits at most detect_seconds after the first one for the rest: whoever
// is silent by then has failed. It answers the quorum with the mean of
// their gradients (or, under Recovery::restart, refuses them all and stops
// the run). A replica computes its gradient, contributes it and steps with
// the mean it gets back; a refusal or a silent coordinator ends it.
#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "dtp/error.h"
#include "dtp/ops.h"

namespace dtp::ch11 {

bool Coordinator::step(std::int64_t step) {
  DTP_CHECK(!live_.empty(), "coordinator: step ", step, ": no live replica is left");
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  std::map<int, rpc::Request> got;  // by replica: the map keeps replica order
  std::optional<Clock::time_point> first;
  while (got.size() < live_.size()) {
    const double wait = first ? detect_seconds_ - seconds_since(*first) : timeout_seconds();
    if (wait <= 0) break;
    const std::optional<rpc::Request> request = server_.next(wait);
    if (!request) {
      DTP_CHECK(first.has_value(), "coordinator: step ", step, ": no replica contributed within ",
                timeout_seconds(), " s");
      break;
    }
    const bool live = std::find(live_.begin(), live_.end(), request->client) != live_.end();
    if (request->key != step || !live || got.count(request->client)) {
      server_.refuse(*request, -1);  // late, from a replica already dropped, or twice
      continue;
    }
    if (!first) first = Clock::now();
    got.emplace(request->client, *request);
  }
  QuorumStep q;
  q.step = step;
  q.detection_seconds = first ? seconds_since(*first) : 0;
  for (int w : live_) (got.count(w) ? q.quorum : q.failed).push_back(w);
  if (!q.failed.empty() && recovery_ == Recovery::restart) {
    for (const auto& [w, request] : got) server_.refuse(request, -1);
    q.restart = true;
    log_.push_back(q);
    return false;
  }
  live_ = q.quorum;
  Tensor mean = Tensor::zeros(got.begin()->second.payload.shape(), DType::f64);
  std::int64_t mask = 0;
  for (const auto& [w, request] : got) {
    ops::accumulate(mean, request.payload);
    mask |= std::int64_t{1} << w;
  }
  ops::scale(mean, 1.0 / static_cast<double>(got.size()));
  for (const auto& [w, request] : got) server_.reply(request, mean, mask);
  log_.push_back(q);
  return true;
}

bool FtReplica::step() {
  const std::int64_t s = trainer_.steps_done();  // this step is s + 1
  const TrainConfig& config = trainer_.config();
  GPT& model = trainer_.model();
  const Batch batch = trainer_.sampler().batch(s, config.model.device);
  model.zero_grad();
  model.forward(batch.inputs, batch.targets);
  model.backward();

  std::int64_t total = 0;
  for (Unit* unit : model.units()) total += unit->numel();
  Tensor mine = Tensor::empty(Shape{total}, DType::f64);
  std::int64_t offset = 0;
  for (Unit* unit : model.units()) {
    mine.slice(offset, unit->numel()).copy_from(unit->grads());
    offset += unit->numel();
  }
  rpc::Response answer;
  try {
    answer = client_.call(kContribute, s + 1, 0, mine);
  } catch (const rpc::Timeout&) {
    return false;  // the coordinator is gone, or never got this contribution
  }
  if (answer.status != rpc::Status::ok) return false;

  offset = 0;
  for (Unit* unit : model.units()) {
    unit->grads().copy_from(answer.payload.slice(offset, unit->numel()));
    offset += unit->numel();
  }
  Optimizer& optimizer = trainer_.optimizer();
  optimizer.clip_gradients(config.grad_clip);
  optimizer.step(config.schedule().at(s));
  trainer_.count_step();
  quorum_ = answer.version;
  return true;
}

}  // namespace dtp::ch11
