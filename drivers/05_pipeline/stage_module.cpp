// A stage: some consecutive units of the GPT, run one micro-batch at a time
// with each micro-batch's saved activations kept apart, every call charged
// on the simulated clock and recorded. Plus micro-batches and unit costs.
// Provided code, not a puzzle.
#include <algorithm>
#include <any>
#include <chrono>
#include <cmath>

#include "05_pipeline/pipeline.h"
#include "dtp/trace.h"

namespace dtp::ch05 {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// What one micro-batch keeps between its forward and its backward (and W).
struct StageModule::Saved {
  std::vector<std::any> units;  // what each unit of the stage saved, in order
  double loss = 0;
  bool backward_done = false;  // B ran with deferred weight gradients: W is next
};

namespace {

// The serial GPT's units: Embedding, Block, Head.
class GptStageRunner : public StageRunner {
 public:
  explicit GptStageRunner(GPT& model) : model_(model) {}
  int unit_count() const override { return static_cast<int>(model_.units().size()); }
  Unit* unit(int u) override { return model_.units()[static_cast<std::size_t>(u)]; }

  Tensor forward(int u, const Tensor& x, const MicroBatch& microbatch, std::any& saved,
                 double& loss) override {
    Unit* unit = this->unit(u);
    if (auto* embedding = dynamic_cast<Embedding*>(unit)) {
      return embedding->forward(x, saved.emplace<EmbeddingKept>().saved);
    }
    if (auto* block = dynamic_cast<Block*>(unit)) {
      return block->forward(x, saved.emplace<BlockSaved>());
    }
    loss = dynamic_cast<Head&>(*unit).forward(x, microbatch.targets, saved.emplace<HeadSaved>());
    return Tensor();
  }

  Tensor backward(int u, const Tensor& dy, std::any& saved, WeightGrads mode,
                  double loss_scale) override {
    Unit* unit = this->unit(u);
    if (auto* head = dynamic_cast<Head*>(unit)) {
      return head->backward(std::any_cast<HeadSaved&>(saved), loss_scale);
    }
    if (auto* block = dynamic_cast<Block*>(unit)) {
      // loss_scale reaches a MoE block's balance loss too.
      return block->backward(dy, std::any_cast<BlockSaved&>(saved), mode, loss_scale);
    }
    // All of the embedding's backward is weight gradient: W does it when deferred.
    auto& kept = std::any_cast<EmbeddingKept&>(saved);
    if (mode == WeightGrads::deferred) {
      kept.dx = dy;
    } else {
      dynamic_cast<Embedding&>(*unit).backward(dy, kept.saved);
    }
    return Tensor();
  }

  void weight(int u, std::any& saved) override {
    Unit* unit = this->unit(u);
    if (auto* block = dynamic_cast<Block*>(unit)) {
      block->backward_weight(std::any_cast<BlockSaved&>(saved));
    } else if (auto* embedding = dynamic_cast<Embedding*>(unit)) {
      auto& kept = std::any_cast<EmbeddingKept&>(saved);
      embedding->backward(kept.dx, kept.saved);
      kept.dx = Tensor();
    }
  }

  Tensor boundary_tensor(const MicroBatch& microbatch, bool gradient) const override {
    const GPTConfig& c = model_.config();
    return Tensor::empty(Shape{microbatch.inputs.size(0), microbatch.inputs.size(1), c.d_model},
                         c.dtype, c.device,
                         gradient ? MemoryCategory::other : MemoryCategory::activations);
  }

 private:
  // The embedding's saved state, and its output gradient kept for W when deferred.
  struct EmbeddingKept {
    EmbeddingSaved saved;
    Tensor dx;
  };
  GPT& model_;
};

}  // namespace

std::vector<MicroBatch> split_microbatches(const Batch& batch, int microbatches) {
  DTP_CHECK(microbatches >= 1, "split_microbatches: micro-batches must be at least 1, got ",
            microbatches);
  const std::int64_t rows = batch.inputs.size(0), seq = batch.inputs.size(1);
  DTP_CHECK(rows % microbatches == 0, "split_microbatches: a batch of ", rows,
            " sequences does not split into ", microbatches,
            " equal micro-batches (pick a batch that is a multiple of the micro-batches)");
  const std::int64_t b = rows / microbatches;
  std::vector<MicroBatch> out;
  for (int i = 0; i < microbatches; ++i) {
    out.push_back({batch.inputs.slice(i * b * seq, b * seq).view(Shape{b, seq}),
                   batch.targets.slice(i * b * seq, b * seq).view(Shape{b, seq})});
  }
  return out;
}

std::vector<double> unit_costs_by_parameters(const GPT& model) {
  std::vector<double> costs;
  for (const Unit* unit : model.units()) costs.push_back(static_cast<double>(unit->numel()));
  return costs;
}

std::vector<double> unit_costs_by_time(GPT& model, const Batch& batch, int repeats) {
  DTP_CHECK(repeats >= 1, "unit_costs_by_time: repeats must be at least 1, got ", repeats);
  const auto units = model.units();
  std::vector<std::vector<double>> runs(units.size());
  for (int r = 0; r < repeats; ++r) {
    // One whole-model stage, timed unit by unit through its hooks.
    StageModule stage(model, UnitRange{0, static_cast<int>(units.size())});
    std::vector<double> start(units.size()), total(units.size(), 0.0);
    auto begin = [&](Unit& u) { start[static_cast<std::size_t>(u.index())] = now_seconds(); };
    auto finish = [&](Unit& u) {
      total[static_cast<std::size_t>(u.index())] +=
          now_seconds() - start[static_cast<std::size_t>(u.index())];
    };
    stage.on_before_forward(begin);
    stage.on_after_forward(finish);
    stage.on_before_backward(begin);
    stage.on_grad_ready(finish);
    const MicroBatch mb{batch.inputs, batch.targets};
    stage.forward(0, batch.inputs, mb);
    stage.backward(0, Tensor(), 1.0);
    stage.zero_grad();
    for (std::size_t u = 0; u < units.size(); ++u) runs[u].push_back(total[u]);
  }
  std::vector<double> costs;
  for (auto& r : runs) {
    std::sort(r.begin(), r.end());
    costs.push_back(r[r.size() / 2]);
  }
  return costs;
}

StageModule::StageModule(GPT& model, UnitRange units, int chunk)
    : StageModule(std::make_shared<GptStageRunner>(model), units, chunk) {}

StageModule::StageModule(std::shared_ptr<StageRunner> runner, UnitRange units, int chunk)
    : runner_(std::move(runner)), range_(units), chunk_(chunk) {
  DTP_CHECK(runner_ != nullptr, "StageModule: no runner");
  const int n = runner_->unit_count();
  DTP_CHECK(units.count >= 1 && units.first >= 0 && units.first + units.count <= n,
            "StageModule: units [", units.first, ", ", units.first + units.count,
            ") are not a non-empty range of the model's ", n, " units");
  for (int u = units.first; u < units.first + units.count; ++u)
    DTP_CHECK(runner_->unit(u) != nullptr, "StageModule: unit ", u,
              " of the stage is not held on this rank");
  wall_zero_ = now_seconds();
}

void StageModule::set_clock(Comm& pp, const ActionCosts& costs, bool split_backward) {
  clock_ = &pp;
  costs_ = costs;
  split_ = split_backward;
}

bool StageModule::is_first() const { return range_.first == 0; }

bool StageModule::is_last() const { return range_.first + range_.count == runner_->unit_count(); }

std::vector<Unit*> StageModule::units() {
  std::vector<Unit*> mine;
  for (int u = range_.first; u < range_.first + range_.count; ++u) mine.push_back(runner_->unit(u));
  return mine;
}

Tensor StageModule::boundary_tensor(const MicroBatch& microbatch, bool gradient) const {
  return runner_->boundary_tensor(microbatch, gradient);
}

void StageModule::begin_action(const Action& action) {
  ActionRecord record;
  record.action = action;
  record.action.chunk = chunk_;
  record.clock_start = record.clock_end = clock_ ? clock_->stats().clock : 0.0;
  record.wall_start = now_seconds() - wall_zero_;
  records_.push_back(record);
}

void StageModule::end_action() {
  ActionRecord& record = records_.back();
  if (clock_) {
    clock_->advance_clock(costs_.of(record.action.kind, split_));
    record.clock_end = clock_->stats().clock;
  }
  record.wall_end = now_seconds() - wall_zero_;
  peak_alive_ = std::max(peak_alive_, alive());
}

Tensor StageModule::forward(int index, const Tensor& input, const MicroBatch& microbatch) {
  DTP_CHECK(!saved_.count(index), "stage ", range_.first, "..: forward of micro-batch ", index,
            " again before its backward (each micro-batch runs F once per step)");
  DTP_CHECK(input.defined(), "stage forward of micro-batch ", index, ": the input is undefined (",
            is_first() ? "the first stage reads the micro-batch's tokens"
                       : "receive the previous stage's output",
            ")");
  trace::Scope span(action_name(F(index, chunk_)), "pipeline");
  begin_action(F(index, chunk_));
  auto saved = std::make_shared<Saved>();
  saved->units.resize(static_cast<std::size_t>(range_.count));
  Tensor x = input;
  for (int i = 0; i < range_.count; ++i) {
    Unit& unit = *runner_->unit(range_.first + i);
    for (auto& hook : before_forward_) hook(unit);
    x = runner_->forward(range_.first + i, x, microbatch, saved->units[static_cast<std::size_t>(i)],
                         saved->loss);
    for (auto& hook : after_forward_) hook(unit);
  }
  saved_[index] = saved;
  end_action();
  return x;
}

double StageModule::loss(int index) const {
  DTP_CHECK(is_last(),
            "StageModule::loss: only the last stage (the one with the head) computes a loss");
  auto it = saved_.find(index);
  DTP_CHECK(it != saved_.end(), "StageModule::loss: micro-batch ", index,
            " has no saved forward (forward not run, or its backward already ran)");
  return it->second->loss;
}

Tensor StageModule::backward(int index, const Tensor& dy, double loss_scale, WeightGrads mode) {
  auto it = saved_.find(index);
  DTP_CHECK(it != saved_.end() && !it->second->backward_done, "stage backward of micro-batch ",
            index, ": no saved forward (a backward before its forward, or a second backward)");
  DTP_CHECK(is_last() || dy.defined(), "stage backward of micro-batch ", index,
            ": the output gradient is undefined (receive it from the next stage)");
  trace::Scope span(action_name(B(index, chunk_)), "pipeline");
  begin_action(B(index, chunk_));
  Saved& saved = *it->second;
  const bool defer = mode == WeightGrads::deferred;
  Tensor dx = dy;
  for (int i = range_.count; i-- > 0;) {
    Unit& unit = *runner_->unit(range_.first + i);
    for (auto& hook : before_backward_) hook(unit);
    dx = runner_->backward(range_.first + i, dx, saved.units[static_cast<std::size_t>(i)], mode,
                           loss_scale);
    if (!defer)
      for (auto& hook : grad_ready_) hook(unit);
  }
  if (defer) {
    saved.backward_done = true;
  } else {
    saved_.erase(it);
  }
  end_action();
  return dx;
}

void StageModule::weight(int index) {
  auto it = saved_.find(index);
  DTP_CHECK(it != saved_.end() && it->second->backward_done, "stage W of micro-batch ", index,
            ": its B has not run with deferred weight gradients (or W already ran)");
  trace::Scope span(action_name(W(index, chunk_)), "pipeline");
  begin_action(W(index, chunk_));
  Saved& saved = *it->second;
  for (int i = range_.count; i-- > 0;) {
    runner_->weight(range_.first + i, saved.units[static_cast<std::size_t>(i)]);
    for (auto& hook : grad_ready_) hook(*runner_->unit(range_.first + i));
  }
  saved_.erase(it);
  end_action();
}

void StageModule::clear_records() {
  records_.clear();
  peak_alive_ = alive();
  wall_zero_ = now_seconds();
}

void StageModule::zero_grad() {
  for (Unit* unit : units()) unit->zero_grad();
}

void StageModule::clear_hooks() {
  before_forward_.clear();
  after_forward_.clear();
  before_backward_.clear();
  grad_ready_.clear();
}

}  // namespace dtp::ch05
