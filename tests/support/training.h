// What every training chapter's checkers share: a tiny deterministic
// training config, the single-device run a distributed run is compared with,
// first-step gradient checks whose messages say what a wrong gradient IS
// ("2.00x the single-device mean"), comparisons that name the rank, step,
// unit and parameter, and a runner that collects one message per rank.
//
// The pattern every training chapter copies:
//   1. compute the single-device reference (every process computes it
//      identically, so it also works under mpiexec where a process holds
//      only its own rank);
//   2. run the distributed strategy inside run_ranks(); each rank compares
//      its own state with the reference INSIDE the rank body and writes a
//      message into its slot of a per-rank vector;
//   3. after the launch, report every non-empty slot.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtp/dtp.h"
#include "dtp/nn.h"
#include "dtp/trainer.h"
#include "support/checker_precision.h"
#include "support/harness.h"

namespace dtp::testing {

// Tolerance in f64. A distributed run differs from the single-device run
// only in the order partial sums are added (per-rank batches, then the
// all-reduce), which moves results by a few ulps (~1e-16 relative); three
// SGD steps amplify that by at most a few orders. Real mistakes are far
// larger: a sum instead of a mean is off by a factor of W, a unit left
// unsynchronized keeps its local gradient, off by ~10-100%.
inline constexpr double kAbsTolerance = 1e-10;
inline constexpr double kRelTolerance = 1e-8;

inline bool close_enough(double expected, double got) {
  return std::fabs(expected - got) <= kAbsTolerance + kRelTolerance * std::fabs(expected);
}

// Tolerances per dtype (checker_precision.h) of the comparisons below, for
// tiny_config's model in f64 or f32. In f32 each is a bound on sums added in
// another order, n terms x 2^-24 (6e-8) x their magnitude, checked against
// the worst difference measured on chapter 02's reference (worlds 1-4,
// K = 1-3 micro-batches), which it exceeds by 40x or more.
//
// First-step gradients: an element sums the contributions of up to 288
// tokens (K = 3: 36 sequences of 8), per rank and then over the ranks
// instead of all at once, after products of up to 64 terms: ~350 roundings
// of 6e-8 of values below 0.2 (the largest gradient is 0.18) is 4e-6
// absolute, 350 x 6e-8 = 2e-5 relative; measured at most 9e-8. The
// smallest mistake it must see is larger: the attention's q and k weights
// have the smallest gradients that matter (2e-5), and left unsynchronized
// they are off by 4e-5; a wrong scale is off by 1/W..W, other parameters'
// local gradients by 10-100%.
inline Closeness first_step_tolerance(DType dtype) {
  return tolerance(dtype, {kAbsTolerance, kRelTolerance}, {4e-6, 2e-5});
}

// After K = 3 steps (parameters, the last step's gradients, the losses):
// each step's gradients differ as above, which SGD (lr 0.05, momentum 0.9)
// carries into a parameter as at most 0.05 x (1 + 0.9 + 0.81) x 4e-6 =
// 5e-7 per step; the last gradients add their own 4e-6, 5e-6 absolute in
// all. A loss is a mean of up to 288 values near ln 32 = 3.5: 300 x 6e-8 =
// 2e-5 relative. Measured at most 1.4e-8 (parameters), 3.7e-8 (gradients)
// and 2.5e-8 (losses, 7e-9 relative).
inline Closeness training_tolerance(DType dtype) {
  return tolerance(dtype, {kAbsTolerance, kRelTolerance}, {5e-6, 2e-5});
}

// How near a fitted ratio (got / expected, over a whole parameter) must be
// to W, 1/W or K to be named as that mistake: the ratio carries the
// relative error of the gradients it was fitted from (first_step_tolerance:
// 2e-5 in f32), and the ratios it names (W, 1/W, K, K W, (W-1)/W) lie
// far further apart.
inline double ratio_tolerance(DType dtype) { return tolerance(dtype, 1e-6, 1e-3); }

// The dtype @p model computes in, which its comparisons take their tolerances
// for: from its config, since a sharded model (ZeRO-3) releases its units'
// parameters and an empty tensor has no dtype of its own.
inline DType model_dtype(GPT& model) { return model.config().dtype; }

// A tiny GPT on synthetic data: vocab 32, seq 8, d_model 16, 2 heads, 2
// blocks, f64 on the CPU (a chapter that runs in checker_dtype() sets the
// model's dtype and device). SGD with momentum and no clipping, because
// both AdamW and clipping hide a wrongly scaled gradient (AdamW divides by
// its own RMS).
inline TrainConfig tiny_config(std::int64_t global_batch = 12, std::int64_t steps = 3) {
  TrainConfig config;
  config.model.vocab_size = 32;
  config.model.context = 8;
  config.model.d_model = 16;
  config.model.heads = 2;
  config.model.layers = 2;
  config.model.dtype = DType::f64;
  config.synthetic.length = 4096;
  config.steps = steps;
  config.batch = global_batch;
  config.seq = 8;
  config.optimizer = "sgd";
  config.lr = 0.05;
  config.warmup = 0;
  config.min_lr_ratio = 1.0;
  config.momentum = 0.9;
  config.grad_clip = 0;
  config.seed = 2024;
  return config;
}

// @p config with a model whose blocks take long enough for a trace to show
// what overlaps what: width 64, 4 heads, 3 blocks, 32 positions.
inline TrainConfig traced_model(TrainConfig config) {
  config.model.d_model = 64;
  config.model.heads = 4;
  config.model.layers = 3;
  config.model.context = 32;
  config.seq = 32;
  return config;
}

// @p config with its model and data on @p device, in checker_dtype(device):
// where a rank (comm.device()) or a checker without ranks builds its model.
inline TrainConfig on_device(TrainConfig config, Device device) {
  config.model.device = device;
  config.model.dtype = checker_dtype(device);
  return config;
}

// Parameters and gradients of every unit, and the loss of every step.
struct ModelState {
  std::vector<double> losses;               // per step
  std::vector<std::vector<double>> params;  // per unit, flat
  std::vector<std::vector<double>> grads;   // per unit, flat (the last step's)
};

inline ModelState capture(GPT& model, std::vector<double> losses) {
  ModelState state;
  state.losses = std::move(losses);
  for (Unit* unit : model.units()) {
    state.params.push_back(unit->params().to_vector());
    state.grads.push_back(unit->grads().to_vector());
  }
  return state;
}

// The single-device run of the same global batch: Trainer(config), steps steps.
inline ModelState single_device(const TrainConfig& config) {
  Trainer trainer(config);
  std::vector<double> losses;
  for (std::int64_t s = 0; s < config.steps; ++s) losses.push_back(trainer.step().loss);
  return capture(trainer.model(), losses);
}

// Finds which named parameter element `flat` of a unit belongs to.
inline std::string locate(const Unit& unit, std::int64_t flat) {
  for (const ParamView& p : unit.parameters())
    if (flat >= p.offset && flat < p.offset + p.shape.numel())
      return "'" + p.name + "' element " + std::to_string(flat - p.offset);
  return "flat element " + std::to_string(flat);
}

inline std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.12g", v);
  return buf;
}

// "" when @p got matches @p expected within @p within; otherwise a message
// naming the first wrong element of each unit that differs. The caller
// states the tolerance, so this also serves a model whose units hold no
// parameters when compared (ZeRO-3 keeps only shards).
inline std::string compare_units(const std::string& what, GPT& model,
                                 const std::vector<std::vector<double>>& expected,
                                 const std::vector<std::vector<double>>& got,
                                 const Closeness& within) {
  std::string message;
  std::vector<Unit*> units = model.units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    std::int64_t wrong = 0, first = -1;
    for (std::size_t i = 0; i < expected[u].size(); ++i) {
      if (!within.holds(expected[u][i], got[u][i])) {
        if (first < 0) first = static_cast<std::int64_t>(i);
        ++wrong;
      }
    }
    if (wrong == 0) continue;
    const auto f = static_cast<std::size_t>(first);
    message += "\n    unit '" + units[u]->name() + "' " + what + " of " + locate(*units[u], first) +
               ": expected " + number(expected[u][f]) + ", got " + number(got[u][f]) + " (" +
               std::to_string(wrong) + " of " + std::to_string(expected[u].size()) +
               " elements wrong)";
  }
  return message;
}

// compare_units() within training_tolerance() of the model's dtype.
inline std::string compare_units(const std::string& what, GPT& model,
                                 const std::vector<std::vector<double>>& expected,
                                 const std::vector<std::vector<double>>& got) {
  return compare_units(what, model, expected, got, training_tolerance(model_dtype(model)));
}

// Compares one rank's model (and the losses averaged over ranks) with the
// single-device reference after the run; "" when everything matches.
inline std::string compare_with_single(const ModelState& expected, GPT& model,
                                       const std::vector<double>& mean_losses, int rank) {
  ModelState got = capture(model, mean_losses);
  const Closeness within = training_tolerance(model_dtype(model));
  std::string message;
  for (std::size_t s = 0; s < expected.losses.size(); ++s)
    if (s >= got.losses.size() || !within.holds(expected.losses[s], got.losses[s]))
      message += "\n    step " + std::to_string(s + 1) + " loss (mean over ranks): expected " +
                 number(expected.losses[s]) + ", got " +
                 (s < got.losses.size() ? number(got.losses[s]) : std::string("nothing"));
  message += compare_units("gradient after the last step", model, expected.grads, got.grads);
  message += compare_units("parameter after the last step", model, expected.params, got.params);
  if (message.empty()) return "";
  return "rank " + std::to_string(rank) +
         " differs from single-device training on the same global batch (" +
         dtype_name(model_dtype(model)) + ", tolerance " + within.str() + "):" + message;
}

// --- First-step gradients -----------------------------------------------------
// Before comparing K steps, the checkers compare the gradients right after the
// first synchronization with the single-device gradient of the same global
// batch. One step cannot hide a mistake behind the optimizer, so a wrong scale
// shows as an exact ratio ("2.00x the single-device mean") and a parameter
// that was never averaged equals this rank's own local gradient.

using UnitGradients = std::vector<std::vector<double>>;  // per unit, flat

inline UnitGradients gradients_of(GPT& model) {
  UnitGradients grads;
  for (Unit* unit : model.units()) grads.push_back(unit->grads().to_vector());
  return grads;
}

// The serial model after the first forward and backward of the whole
// global batch (no optimizer step): the gradients a parallel run's first
// step must reproduce, in the trainer's units.
inline std::unique_ptr<Trainer> serial_after_first_backward(const TrainConfig& config) {
  auto trainer = std::make_unique<Trainer>(config);
  Batch batch = trainer->sampler().batch(0, config.model.device);
  trainer->model().zero_grad();
  trainer->model().forward(batch.inputs, batch.targets);
  trainer->model().backward();
  return trainer;
}

// The gradients after the first backward of Trainer(config[, rank, world]),
// before any optimizer step; no synchronization: with world > 1 this is the
// rank's local gradient of its own slice of the batch.
inline UnitGradients first_step_gradients(const TrainConfig& config, int rank = 0, int world = 1) {
  TrainConfig one = config;
  one.steps = 1;
  Trainer trainer(one, rank, world);
  UnitGradients grads;
  trainer.on_after_backward([&] { grads = gradients_of(trainer.model()); });
  trainer.step();
  return grads;
}

// What one parameter's gradient is, compared with the expected one.
struct GradientVerdict {
  enum Kind { right, scaled, local, zero, other } kind = right;
  double ratio = 1;  // got / expected, for scaled
};

inline GradientVerdict judge(const double* expected, const double* local, const double* got,
                             std::int64_t n, Closeness within) {
  bool all_close = true, all_local = true, all_zero = true;
  double ge = 0, ee = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    all_close = all_close && within.holds(expected[i], got[i]);
    all_local = all_local && within.holds(local[i], got[i]);
    all_zero = all_zero && got[i] == 0;
    ge += got[i] * expected[i];
    ee += expected[i] * expected[i];
  }
  if (all_close) return {};
  if (all_local) return {GradientVerdict::local, 1};
  if (all_zero) return {GradientVerdict::zero, 0};
  if (ee > 0) {
    const double ratio = ge / ee;
    bool scaled = true;
    for (std::int64_t i = 0; i < n && scaled; ++i)
      scaled = within.holds(ratio * expected[i], got[i]);
    if (scaled) return {GradientVerdict::scaled, ratio};
  }
  return {GradientVerdict::other, 0};
}

// How a chapter names what the verdicts talk about: chapter 02's DDP words by
// default; a pipeline has no "local gradient", only micro-batches' shares.
struct GradientWording {
  std::string micro_batches = "K";                        // the symbol the lesson uses
  std::string loss_scale = "GPT::backward's loss_scale";  // where 1/K goes
  std::string local = "this rank's own local gradient, never averaged over the ranks (skipped?)";
  std::string local_example = "this rank's local gradient";  // the example's third number
  std::string other =
      "neither the mean, a multiple of it, nor the local gradient (mixed up with another "
      "part's, or reduced before backward finished?)";
};

// What a ratio most likely means, for a run on `world` ranks with `k`
// accumulated micro-batches, fitted from gradients of `dtype`.
inline std::string explain_ratio(double ratio, int world, std::int64_t k,
                                 const GradientWording& words = {}, DType dtype = DType::f64) {
  auto near = [&](double x) {
    return std::fabs(ratio - x) <= ratio_tolerance(dtype) * std::fabs(x);
  };
  const std::string w = std::to_string(world);
  if (world > 1 && near(world))
    return "did you sum over the ranks without dividing by the world size " + w +
           "? (ReduceOp::avg averages)";
  if (world > 1 && near(1.0 / world))
    return "divided by the world size twice? (ReduceOp::avg already divides by " + w + ")";
  if (k > 1 && near(static_cast<double>(k)))
    return "did you scale each micro-batch's loss by 1/" + words.micro_batches + " (" +
           words.micro_batches + " = " + std::to_string(k) + ", " + words.loss_scale + ")?";
  if (k > 1 && near(static_cast<double>(k) * world))
    return "two scale mistakes: summed over ranks (x" + w + ") and loss not scaled by 1/" +
           words.micro_batches + " (x" + std::to_string(k) + ")";
  if (world > 1 && near(static_cast<double>(world - 1) / world))
    return "one rank's gradient is missing from the average?";
  return "a wrong scale factor";
}

// A piece of gradient to judge: a parameter, or one rank's shard of a unit.
struct GradientPiece {
  std::string label;                 // "'block.0' 'attn.q.weight'"
  const double* expected = nullptr;  // the single-device mean
  const double* local = nullptr;     // this rank's own, unsynchronized
  const double* got = nullptr;       // what the strategy produced
  std::int64_t numel = 0;
  std::function<std::string(std::int64_t)> where;  // "unit 'head' 'weight' element 3"
};

// "" when every piece equals its expected gradient (within
// first_step_tolerance() of `dtype`, the dtype the gradients were computed
// in); otherwise the verdict first (what the wrong gradients are), then one
// example with the numbers.
inline std::string judge_gradient_pieces(const std::vector<GradientPiece>& pieces,
                                         const std::string& what, int rank, int world,
                                         std::int64_t k, const GradientWording& wording = {},
                                         DType dtype = DType::f64) {
  const Closeness within = first_step_tolerance(dtype);
  std::map<std::string, std::vector<std::string>> groups;  // verdict -> labels
  std::string example;
  int wrong = 0;
  for (const GradientPiece& piece : pieces) {
    const GradientVerdict v = judge(piece.expected, piece.local, piece.got, piece.numel, within);
    if (v.kind == GradientVerdict::right) continue;
    ++wrong;
    std::string words;
    switch (v.kind) {
      case GradientVerdict::scaled: {
        char ratio[32];
        std::snprintf(ratio, sizeof ratio, "%.2fx", v.ratio);
        words = std::string(ratio) +
                " the single-device mean: " + explain_ratio(v.ratio, world, k, wording, dtype);
        break;
      }
      case GradientVerdict::local:
        words = wording.local;
        break;
      case GradientVerdict::zero:
        words = "all zero (never reduced, overwritten, or never copied back?)";
        break;
      default:
        words = wording.other;
    }
    groups[words].push_back(piece.label);
    if (example.empty()) {
      std::int64_t i = 0;
      while (i + 1 < piece.numel && within.holds(piece.expected[i], piece.got[i])) ++i;
      example = "e.g. " + piece.where(i) + ": expected " + number(piece.expected[i]) + ", got " +
                number(piece.got[i]) + " (" + wording.local_example + ": " +
                number(piece.local[i]) + ")";
    }
  }
  if (wrong == 0) return "";
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (std::size_t i = 0; i < names.size() && i < 4; ++i) out += (i ? ", " : "") + names[i];
    return names.size() > 4 ? out + ", ..." : out;
  };
  // The verdict first: it is what the scoreboard's one row shows.
  const std::string total = std::to_string(pieces.size());
  std::string message = "rank " + std::to_string(rank) + ", step 1, " + what + ": ";
  if (groups.size() == 1) {
    const auto& [words, names] = *groups.begin();
    message += std::to_string(wrong) + " of " + total + " are " + words + " (" + list(names) + ")";
  } else {
    message += std::to_string(wrong) + " of " + total + " wrong:";
    for (const auto& [words, names] : groups)
      message +=
          "\n    " + std::to_string(names.size()) + " are " + words + " (" + list(names) + ")";
  }
  return message + "\n    " + example;
}

// Every named parameter's gradient after synchronization against the
// single-device mean: "" or the verdict.
inline std::string check_first_step_gradients(const UnitGradients& expected,
                                              const UnitGradients& local, GPT& model, int rank,
                                              int world, std::int64_t k = 1,
                                              const GradientWording& wording = {}) {
  std::vector<Unit*> units = model.units();
  const UnitGradients got = gradients_of(model);
  std::vector<GradientPiece> pieces;
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (const ParamView& p : units[u]->parameters()) {
      const auto o = static_cast<std::size_t>(p.offset);
      const std::string name = "'" + units[u]->name() + "' '" + p.name + "'";
      pieces.push_back(GradientPiece{
          name, &expected[u][o], &local[u][o], &got[u][o], p.shape.numel(),
          [name](std::int64_t i) { return "unit " + name + " element " + std::to_string(i); }});
    }
  }
  return judge_gradient_pieces(pieces, "gradients after synchronization (parameters)", rank, world,
                               k, wording, model_dtype(model));
}

// This rank's gradient shard of every unit (chunk shards[u] of its flat
// gradient) against the same slice of the single-device mean, judged within
// first_step_tolerance() of @p dtype, the dtype the gradients were computed
// in (the caller's config: ZeRO-3's units hold no parameters to read it from).
inline std::string check_first_step_gradient_shards(const UnitGradients& expected,
                                                    const UnitGradients& local, GPT& model,
                                                    const std::vector<ChunkRange>& shards,
                                                    const UnitGradients& got_shards, int rank,
                                                    int world, DType dtype) {
  std::vector<Unit*> units = model.units();
  std::vector<GradientPiece> pieces;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const ChunkRange range = shards[u];
    if (range.length == 0) continue;
    if (static_cast<std::int64_t>(got_shards[u].size()) != range.length)
      return "rank " + std::to_string(rank) + ": unit '" + units[u]->name() +
             "' gradient shard holds " + std::to_string(got_shards[u].size()) +
             " elements; expected " + std::to_string(range.length) + " (chunk " +
             std::to_string(rank) + " of " + std::to_string(world) + " of its " +
             std::to_string(expected[u].size()) + " elements, chunk_range)";
    const auto o = static_cast<std::size_t>(range.offset);
    const Unit* unit = units[u];
    const std::string label = "'" + unit->name() + "' shard [" + std::to_string(range.offset) +
                              ", " + std::to_string(range.offset + range.length) + ")";
    pieces.push_back(GradientPiece{label, &expected[u][o], &local[u][o], got_shards[u].data(),
                                   range.length, [unit, range](std::int64_t i) {
                                     return "unit '" + unit->name() + "' " +
                                            locate(*unit, range.offset + i);
                                   }});
  }
  return judge_gradient_pieces(pieces, "gradient shards after reduce-scatter (units)", rank, world,
                               1, {}, dtype);
}

// check_first_step_gradient_shards() for the dtype of the model's parameters,
// for a model whose first unit holds its parameters during the check.
inline std::string check_first_step_gradient_shards(const UnitGradients& expected,
                                                    const UnitGradients& local, GPT& model,
                                                    const std::vector<ChunkRange>& shards,
                                                    const UnitGradients& got_shards, int rank,
                                                    int world) {
  return check_first_step_gradient_shards(expected, local, model, shards, got_shards, rank, world,
                                          model_dtype(model));
}

// The mean over ranks of each rank's per-step losses (one all-reduce; call it
// after the communication counts were taken).
inline std::vector<double> mean_over_ranks(Comm& comm, const std::vector<double>& losses) {
  Tensor t = Tensor::from_values(losses, DType::f64).to(comm.device());
  comm.all_reduce(t, ReduceOp::avg);
  return t.to_vector();
}

inline std::int64_t all_reduce_calls(const CommStats& stats) {
  auto it = stats.collective_calls.find("all_reduce");
  return it == stats.collective_calls.end() ? 0 : it->second;
}

inline std::int64_t gradient_bytes(GPT& model) {
  std::int64_t bytes = 0;
  for (Unit* unit : model.units()) bytes += static_cast<std::int64_t>(unit->grads().nbytes());
  return bytes;
}

inline std::int64_t parameter_tensors(GPT& model) {
  std::int64_t n = 0;
  for (Unit* unit : model.units()) n += static_cast<std::int64_t>(unit->parameters().size());
  return n;
}

// "" when every rank of @p group holds bitwise the same values in each of
// @p tensors (replicated parameters or their gradients); else names the
// first tensor and element that differ from rank 0's.
inline std::string check_replicas_agree(Comm& group,
                                        const std::vector<std::pair<std::string, Tensor>>& tensors,
                                        const std::string& hint,
                                        const std::string& group_name = "TP") {
  std::string m;
  for (const auto& [name, tensor] : tensors) {
    Tensor mine = tensor.flatten().clone();
    Tensor all = Tensor::empty(Shape{mine.numel() * group.size()}, mine.dtype(), mine.device());
    group.all_gather(mine, all);
    const std::vector<double> v = all.to_vector();
    const std::size_t n = static_cast<std::size_t>(mine.numel());
    for (int r = 1; r < group.size() && m.empty(); ++r)
      for (std::size_t i = 0; i < n; ++i)
        if (v[r * n + i] != v[i]) {
          m += "\n    " + name + " element " + std::to_string(i) + ": " + group_name + " rank " +
               std::to_string(r) + " holds " + number(v[r * n + i]) + " but " + group_name +
               " rank 0 holds " + number(v[i]) +
               ": a replicated tensor must be bitwise the same on every rank of the group. " + hint;
          break;
        }
    if (!m.empty()) break;
  }
  return m;
}

// Runs body on `world` ranks; every rank writes "" or a failure into
// failures[rank]. A rank that throws (a stub's NotSolved) fails the test with
// its message, followed by what `explain` (if any) adds to it. Works under
// mpi: each process fills its own slot.
inline void run_and_report(
    const std::string& what, int world, const std::function<std::string(Comm&)>& body,
    const std::function<std::string(const std::string&)>& explain = nullptr) {
  std::vector<std::string> failures(static_cast<std::size_t>(world));
  try {
    run_ranks(world,
              [&](Comm& comm) { failures[static_cast<std::size_t>(comm.rank())] = body(comm); });
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << " on " << world << " rank(s) threw: " << e.what()
                  << (explain ? explain(e.what()) : "");
    return;
  }
  // The failure first (what is wrong, where), then which run it was.
  for (const std::string& failure : failures)
    if (!failure.empty())
      ADD_FAILURE() << failure << "\n    [" << what << ", on " << world << " rank(s)]";
}

// Per-step communication of one rank.
struct StepComm {
  std::int64_t all_reduces = 0;
  std::int64_t other_collectives = 0;
  std::int64_t bytes = 0;
};

inline StepComm comm_between(const CommStats& before, const CommStats& after) {
  StepComm c;
  c.all_reduces = all_reduce_calls(after) - all_reduce_calls(before);
  c.other_collectives =
      after.total_collective_calls() - before.total_collective_calls() - c.all_reduces;
  c.bytes = after.collective_bytes - before.collective_bytes;
  return c;
}

// Trains `config.steps` steps as a DDP rank: Trainer(config, rank, world),
// with `install` plugging the strategy into it (hooks, on_after_backward).
// Returns the per-step communication; fills losses with this rank's losses.
inline std::vector<StepComm> train_rank(Comm& comm, Trainer& trainer, std::vector<double>& losses) {
  std::vector<StepComm> steps;
  for (std::int64_t s = 0; s < trainer.config().steps; ++s) {
    const CommStats before = comm.stats();
    losses.push_back(trainer.step().loss);
    steps.push_back(comm_between(before, comm.stats()));
  }
  return steps;
}

}  // namespace dtp::testing
