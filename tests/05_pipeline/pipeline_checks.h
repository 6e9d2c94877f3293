// What chapter 05's checkers share: schedule checks in words, random valid
// schedules (so the executor is graded on orders no puzzle produces), the
// checker's own split of the model into stages, and comparisons of one
// rank's stage with single-device training.
//
// Where they run: models and data on the rank's device (comm.device(); the
// single-device reference on checker_device()) in checker_dtype(): f64 on
// the CPU, f32 under DTP_CHECK_DTYPE=f32 and on a GPU. Message counts, the
// simulated clock, collective counts, memory (elements x the dtype's element
// size) and the replicas' bitwise agreement are exact in both dtypes.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "05_pipeline/pipeline.h"
#include "support/checker_precision.h"
#include "support/training.h"

namespace dtp::testing::ch05 {

using namespace dtp::ch05;

// "afab(p 4, m 8)".
inline std::string call(const std::string& what, int p, int m, int v = 0) {
  return what + "(p " + std::to_string(p) + ", m " + std::to_string(m) +
         (v ? ", v " + std::to_string(v) : "") + ")";
}

// "" or what is wrong with the shape of a schedule a puzzle returned.
inline std::string check_shape(const Schedule& s, const std::string& what, int p, int m, int v,
                               bool split) {
  std::string problem;
  if (s.stages != p || s.microbatches != m || s.chunks != v)
    problem = "has stages " + std::to_string(s.stages) + ", micro-batches " +
              std::to_string(s.microbatches) + ", chunks " + std::to_string(s.chunks) +
              "; expected " + std::to_string(p) + ", " + std::to_string(m) + ", " +
              std::to_string(v) + " (start from empty_schedule)";
  else if (s.split_backward != split)
    problem = split ? "must split the backward (split_backward = true, a W after each B)"
                    : "must not split the backward (split_backward = false, no W)";
  else if (static_cast<int>(s.actions.size()) != p)
    problem =
        "has " + std::to_string(s.actions.size()) + " lists for " + std::to_string(p) + " ranks";
  return problem.empty() ? "" : what + " " + problem;
}

// Added to a pipeline run's error: every tag it mentions, in words, and
// what a send of an undefined tensor usually is.
inline std::string explain_pipeline_failure(const std::string& text) {
  std::string out;
  std::vector<int> seen;
  for (std::size_t at = text.find("tag "); at != std::string::npos;
       at = text.find("tag ", at + 4)) {
    std::size_t end = at + 4;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == at + 4) continue;
    const int tag = std::stoi(text.substr(at + 4, end - at - 4));
    if (std::find(seen.begin(), seen.end(), tag) != seen.end()) continue;
    seen.push_back(tag);
    out += "\n    tag " + std::to_string(tag) + " is " + describe_pipeline_tag(tag);
  }
  if (text.find("send: x is an undefined tensor") != std::string::npos)
    out +=
        "\n    an undefined tensor has nothing to send: virtual stage 0's backward has no input "
        "gradient to send "
        "back, and the last virtual stage sends nothing on";
  return out;
}

// The chart of a small schedule, to show with a failure.
inline std::string chart_of(const Schedule& s, const ScheduleReport& report) {
  if (!report.ok() || s.stages > 8 || s.microbatches > 8) return "";
  return "\n" + gantt_chart(s, report);
}

// --- random valid schedules --------------------------------------------------------
// Every rank's list is its share of one random topological order of all
// actions, so it never deadlocks; the orders are unlike any puzzle's.
inline Schedule random_schedule(int p, int m, int v, bool split, std::uint64_t seed) {
  Schedule s = empty_schedule("random", p, m, v, split);
  std::mt19937_64 rng(seed);
  using Key = std::tuple<int, int, int>;  // kind, virtual stage, micro-batch
  std::map<Key, bool> done;
  std::vector<Key> todo;
  const int stages = p * v;
  for (int vs = 0; vs < stages; ++vs)
    for (int mb = 0; mb < m; ++mb)
      for (int k = 0; k < (split ? 3 : 2); ++k) todo.push_back({k, vs, mb});
  auto ready = [&](const Key& key) {
    const auto [k, vs, mb] = key;
    if (k == 0) return vs == 0 || done.count({0, vs - 1, mb});
    if (k == 1) return done.count({0, vs, mb}) && (vs == stages - 1 || done.count({1, vs + 1, mb}));
    return done.count({1, vs, mb}) > 0;
  };
  while (!todo.empty()) {
    std::vector<std::size_t> candidates;
    for (std::size_t i = 0; i < todo.size(); ++i)
      if (ready(todo[i])) candidates.push_back(i);
    const std::size_t pick = candidates[rng() % candidates.size()];
    const auto [k, vs, mb] = todo[pick];
    s.actions[static_cast<std::size_t>(vs % p)].push_back(
        Action{static_cast<ActionKind>(k), mb, vs / p});
    done[todo[pick]] = true;
    todo.erase(todo.begin() + static_cast<std::ptrdiff_t>(pick));
  }
  return s;
}

// The checker's own split: n units into s stages as evenly as counts allow.
inline std::vector<UnitRange> even_stages(int units, int stages) {
  std::vector<UnitRange> out;
  for (int i = 0; i < stages; ++i) {
    const int first = static_cast<int>(static_cast<long>(units) * i / stages);
    const int next = static_cast<int>(static_cast<long>(units) * (i + 1) / stages);
    out.push_back({first, next - first});
  }
  return out;
}

// A config whose model has `layers` blocks (layers + 2 units), batch a
// multiple of the micro-batches, on checker_device() in checker_dtype() (a
// rank moves it to its own device with on_device).
inline TrainConfig pipeline_config(int layers, std::int64_t batch, std::int64_t steps = 3) {
  TrainConfig config = tiny_config(batch, steps);
  config.model.layers = layers;
  return on_device(config, checker_device());
}

// One pipeline rank driven by hand: the serial model on the rank's device
// (its other units released), this rank's chunks on the checker's split,
// clocks attached.
struct HandPipeline {
  std::unique_ptr<Trainer> trainer;
  std::vector<std::unique_ptr<StageModule>> chunks;
  std::vector<StageModule*> pointers;
  std::vector<bool> mine;  // per unit

  HandPipeline(const TrainConfig& config, Comm& pp, const Schedule& s) {
    trainer = std::make_unique<Trainer>(on_device(config, pp.device()));
    GPT& model = trainer->model();
    const auto units = model.units();
    const std::vector<UnitRange> split =
        even_stages(static_cast<int>(units.size()), s.virtual_stages());
    mine.assign(units.size(), false);
    for (int c = 0; c < s.chunks; ++c) {
      const UnitRange range = split[static_cast<std::size_t>(s.virtual_stage(pp.rank(), c))];
      chunks.push_back(std::make_unique<StageModule>(model, range, c));
      chunks.back()->set_clock(pp, ActionCosts{}, s.split_backward);
      pointers.push_back(chunks.back().get());
      for (int u = range.first; u < range.first + range.count; ++u)
        mine[static_cast<std::size_t>(u)] = true;
    }
    for (Unit* unit : units)
      if (!mine[static_cast<std::size_t>(unit->index())]) unit->set_buffers(Tensor(), Tensor());
  }
  std::vector<MicroBatch> microbatches(int m) {
    return split_microbatches(trainer->sampler().batch(0, trainer->config().model.device), m);
  }
};

// Per unit: the gradient of each micro-batch alone, scaled by 1/m (what the
// executor adds up), from the serial model; and the batch mean.
struct MicroBatchGradients {
  UnitGradients mean;                 // the whole batch's mean gradient
  std::vector<UnitGradients> scaled;  // scaled[k]: micro-batch k's gradient / m
  std::vector<double> losses;         // per micro-batch
  double loss = 0;                    // the whole batch's mean loss
};

inline MicroBatchGradients micro_batch_gradients(const TrainConfig& config, int m) {
  MicroBatchGradients out;
  Trainer trainer(config);
  GPT& model = trainer.model();
  const Batch batch = trainer.sampler().batch(0, config.model.device);
  model.zero_grad();
  out.loss = model.forward(batch.inputs, batch.targets);
  model.backward();
  out.mean = gradients_of(model);
  for (const MicroBatch& mb : split_microbatches(batch, m)) {
    model.zero_grad();
    out.losses.push_back(model.forward(mb.inputs, mb.targets));
    model.backward(1.0 / m);
    out.scaled.push_back(gradients_of(model));
  }
  return out;
}

// "" when every unit this rank holds has the batch's mean gradient, within
// first_step_tolerance() of the model's dtype; else the verdict (scale,
// local, zero) or "micro-batch k's gradient alone".
//
// That tolerance in f32 (4e-6 + 2e-5 |expected|): a pipeline computes each
// token's forward and backward as the serial model does and adds the at most
// 128 tokens of a step (16 sequences of 8) per micro-batch, then over the m
// micro-batches, instead of all at once: 128 x 2^-24 x 0.31 (the largest
// gradient here) = 2.4e-6. Measured at most 1.0e-7 (1.2% of the tolerance)
// over every schedule, p, m and v the executor checkers run; one
// micro-batch's share alone is 1e4 tolerances or more away from the mean.
inline std::string check_stage_gradients(const MicroBatchGradients& expected, GPT& model,
                                         const std::vector<bool>& mine, int rank, int m) {
  const DType dtype = model.config().dtype;
  const Closeness within = first_step_tolerance(dtype);
  std::vector<Unit*> units = model.units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (!mine[u]) continue;
    const std::vector<double> got = units[u]->grads().to_vector();
    const std::vector<double>& want = expected.mean[u];
    bool right = true;
    for (std::size_t i = 0; i < got.size() && right; ++i) right = within.holds(want[i], got[i]);
    if (right) continue;
    for (int k = 0; k < m; ++k) {
      bool alone = true;
      for (std::size_t i = 0; i < got.size() && alone; ++i)
        alone = within.holds(expected.scaled[static_cast<std::size_t>(k)][u][i], got[i]);
      if (alone && m > 1)
        return "rank " + std::to_string(rank) + ", step 1: unit '" + units[u]->name() +
               "' holds micro-batch " + std::to_string(k) +
               "'s gradient alone, not the sum over the " + std::to_string(m) +
               " micro-batches: the gradients were not accumulated (zeroed or overwritten between "
               "micro-batches?)";
    }
  }
  // Otherwise the chapter-02 verdicts, on this rank's units only.
  std::vector<GradientPiece> pieces;
  UnitGradients got(units.size());
  for (std::size_t u = 0; u < units.size(); ++u)
    if (mine[u]) got[u] = units[u]->grads().to_vector();
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (!mine[u]) continue;
    for (const ParamView& p : units[u]->parameters()) {
      const auto o = static_cast<std::size_t>(p.offset);
      const std::string name = "'" + units[u]->name() + "' '" + p.name + "'";
      pieces.push_back(GradientPiece{
          name, &expected.mean[u][o], &expected.scaled.back()[u][o], &got[u][o], p.shape.numel(),
          [name](std::int64_t i) { return "unit " + name + " element " + std::to_string(i); }});
    }
  }
  GradientWording words;
  words.micro_batches = "m";
  words.loss_scale = "StageModule::backward's loss_scale";
  words.local = "the last micro-batch's share alone (the others were lost: not accumulated?)";
  words.local_example = "the last micro-batch's share";
  words.other =
      "neither the mean, a multiple of it, nor one micro-batch's share (a micro-batch's activation "
      "or "
      "gradient used for another's: are the messages told apart by pipeline_tag()?)";
  return judge_gradient_pieces(pieces, "gradients after the pipeline step (this rank's units)",
                               rank, 1, m, words, dtype);
}

// "" or what the step's loss is instead of the batch mean, compared within
// training_tolerance() of @p dtype, the dtype the losses were computed in.
// In f32 that is 5e-6 + 2e-5 |expected|: a mean of at most 128 token losses
// near ln 32 = 3.5, 128 x 2^-24 x 3.5 = 2.7e-5 < 7.5e-5. Measured: equal in
// f32, 1.8e-15 apart in f64. The nearest wrong loss it names (one
// micro-batch's loss alone) lies 3.7 tolerances away or more.
inline std::string check_step_loss(const MicroBatchGradients& expected, double got, int m,
                                   DType dtype) {
  const Closeness within = training_tolerance(dtype);
  if (within.holds(expected.loss, got)) return "";
  std::string why;
  if (m > 1 && within.holds(expected.loss * m, got))
    why = ": the micro-batches' losses summed, not averaged (divide by m)";
  if (why.empty() && within.holds(expected.loss * 2, got))
    why = ": every micro-batch's loss counted twice (2.00x the mean)";
  for (int k = 0; k < m && why.empty(); ++k)
    if (m > 1 &&
        within.holds(expected.loss + expected.losses[static_cast<std::size_t>(k)] / m, got))
      why = ": micro-batch " + std::to_string(k) + "'s loss counted twice";
  for (int k = 0; k < m && why.empty(); ++k)
    if (m > 1 && within.holds(expected.losses[static_cast<std::size_t>(k)], got))
      why = ": micro-batch " + std::to_string(k) + "'s loss alone (average all m)";
  if (why.empty() && got == 0) why = ": 0 (the rank holding the last stage must return the loss)";
  return "the step's loss: expected " + number(expected.loss) + " (the mean of the " +
         std::to_string(m) + " micro-batches' losses), got " + number(got) + why;
}

// After K steps: this rank's units against single-device training, within
// training_tolerance() of the model's dtype (its f32 derivation holds here:
// batches of at most 128 tokens, lr 0.05, momentum 0.9). Measured at most
// 1.2e-7 on a parameter (0.5% of the tolerance) and 1.9e-8 on a loss in f32.
inline std::string compare_stage(const ModelState& expected, GPT& model,
                                 const std::vector<bool>& mine, const std::vector<double>& losses,
                                 int rank) {
  const Closeness within = training_tolerance(model.config().dtype);
  std::string message;
  for (std::size_t s = 0; s < expected.losses.size(); ++s)
    if (s >= losses.size() || !within.holds(expected.losses[s], losses[s]))
      message += "\n    step " + std::to_string(s + 1) + " loss: expected " +
                 number(expected.losses[s]) + ", got " +
                 (s < losses.size() ? number(losses[s]) : std::string("nothing"));
  std::vector<Unit*> units = model.units();
  UnitGradients params, want;
  for (std::size_t u = 0; u < units.size(); ++u) {
    params.push_back(mine[u] ? units[u]->params().to_vector() : expected.params[u]);
    want.push_back(expected.params[u]);
  }
  message += compare_units("parameter after the last step", model, want, params, within);
  if (message.empty()) return "";
  return "rank " + std::to_string(rank) +
         " differs from single-device training on the same batch (tolerance " + within.str() +
         "):" + message;
}

}  // namespace dtp::testing::ch05
