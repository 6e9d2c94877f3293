// What the checkers of local SGD (11.3) and DiLoCo (11.4) share: the
// training setup, the checker's own simulation of W ranks that train alone
// and average their parameters every h steps, and the comparisons and
// communication checks whose messages name the rank, step, unit, parameter
// and element.
//
// A simulation holds W Trainers in one process (Trainer(config, r, W): rank
// r's slice of every global batch, its own optimizer) and steps each alone.
// Where a run averages, it replaces each unit's parameters by their mean
// over the ranks, added in rank order and divided by W, each result rounded
// to the model's dtype. Every process computes the simulation the same way
// before the ranks start, so it also serves under mpiexec, where a process
// holds only its own rank. A simulation can also make a mistake on purpose:
// when a rank's state matches such a run, the message names the mistake.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "support/training.h"

namespace dtp::testing::ch11_lockstep {

// Per unit, flat: a model's parameters, or DiLoCo's theta or m.
using UnitValues = std::vector<std::vector<double>>;
// [step - 1][rank]: every rank's parameters after every step.
using Trajectory = std::vector<std::vector<UnitValues>>;

// tiny_config (2 blocks, width 16, 12 sequences of 8 tokens a step, a
// constant learning rate, no clipping; f64 on the CPU) for @p steps steps
// of @p optimizer: "sgd" (lr 0.05, momentum 0.9) or "adamw" (lr 1e-2,
// betas 0.9 and 0.95, no weight decay).
//
// Chapter 11 checks in f64 only. A single-process simulation matches a
// run up to the rounding of the average (another order, x (1/W) instead of
// / W), and AdamW turns such differences into whole updates where a
// gradient is only rounding noise (the attention's key biases: softmax
// cancels them). In f64 that noise stays far below AdamW's eps (1e-8), so
// an update it drives is about lr x 1e-10; in f32 it is not (the
// reference DiLoCo's key biases ended 1e-5 away from the simulation after 4
// steps, past training_tolerance's 5e-6).
inline TrainConfig lockstep_config(std::int64_t steps, const std::string& optimizer) {
  TrainConfig config = tiny_config(12, steps);
  config.optimizer = optimizer;
  if (optimizer == "adamw") config.lr = 1e-2;
  return config;
}

// @p x as the model's @p dtype stores it (double to float rounds to nearest).
inline double round_to(DType dtype, double x) {
  return dtype == DType::f32 ? static_cast<double>(static_cast<float>(x)) : x;
}

// Fails the test with @p failure alone (what is wrong, where), then the run
// it came from, when @p failure is not empty: the message a student reads
// first is the finding, not the comparison that found it.
inline void expect_none(const std::string& failure, const std::string& run) {
  if (!failure.empty()) ADD_FAILURE() << failure << "\n    [" << run << "]";
}

// Every unit's parameters concatenated in model order (what a parameter
// server's pull carries), and back.
inline std::vector<double> flat_parameters(GPT& model) {
  std::vector<double> flat;
  for (Unit* unit : model.units()) {
    const std::vector<double> p = unit->params().to_vector();
    flat.insert(flat.end(), p.begin(), p.end());
  }
  return flat;
}

inline void set_flat_parameters(GPT& model, const std::vector<double>& flat) {
  std::size_t offset = 0;
  for (Unit* unit : model.units()) {
    const auto n = static_cast<std::size_t>(unit->numel());
    unit->params().copy_from(Tensor::from_values(
        std::vector<double>(flat.begin() + static_cast<std::ptrdiff_t>(offset),
                            flat.begin() + static_cast<std::ptrdiff_t>(offset + n)),
        unit->params().dtype()));
    offset += n;
  }
}

inline UnitValues parameters_of(GPT& model) {
  UnitValues values;
  for (Unit* unit : model.units()) values.push_back(unit->params().to_vector());
  return values;
}

inline void set_parameters(GPT& model, const UnitValues& values) {
  std::vector<Unit*> units = model.units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    Tensor& params = units[u]->params();
    params.copy_from(Tensor::from_values(values[u], params.dtype(), params.device()));
  }
}

// Element by element over @p ranks: the values added in rank order (each
// partial sum rounded to @p dtype), then divided by @p divisor (W for the
// mean, 1 for the sum) and rounded.
inline UnitValues rank_order_mean(const std::vector<UnitValues>& ranks, DType dtype,
                                  double divisor) {
  UnitValues mean = ranks[0];
  for (std::size_t u = 0; u < mean.size(); ++u)
    for (std::size_t i = 0; i < mean[u].size(); ++i) {
      double sum = ranks[0][u][i];
      for (std::size_t r = 1; r < ranks.size(); ++r) sum = round_to(dtype, sum + ranks[r][u][i]);
      mean[u][i] = round_to(dtype, sum / divisor);
    }
  return mean;
}

// W Trainers of one simulated run: rank r's is Trainer(config, r, W).
inline std::vector<std::unique_ptr<Trainer>> simulated_ranks(const TrainConfig& config, int world) {
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int r = 0; r < world; ++r) trainers.push_back(std::make_unique<Trainer>(config, r, world));
  return trainers;
}

// A fresh optimizer for @p trainer, its state zero and its update count 0:
// what a run that rebuilds its optimizer does.
inline void reset_optimizer(Trainer& trainer) {
  trainer.set_optimizer(make_optimizer(trainer.config(), param_buffers(trainer.model())));
}

// How a local-SGD simulation averages: right, or with one mistake.
enum class Averaging { right, every_step, never, summed, state_averaged, state_reset };

// Local SGD simulated on @p world ranks with period @p h, for config.steps
// steps: every rank's parameters after every step.
inline Trajectory simulate_local_sgd(const TrainConfig& config, int world, int h,
                                     Averaging how = Averaging::right) {
  const DType dtype = config.model.dtype;
  std::vector<std::unique_ptr<Trainer>> trainers = simulated_ranks(config, world);
  Trajectory trajectory;
  for (std::int64_t s = 1; s <= config.steps; ++s) {
    for (auto& trainer : trainers) trainer->step();
    const bool average = how == Averaging::every_step || (how != Averaging::never && s % h == 0);
    if (average) {
      std::vector<UnitValues> all;
      for (auto& trainer : trainers) all.push_back(parameters_of(trainer->model()));
      const UnitValues mean = rank_order_mean(all, dtype, how == Averaging::summed ? 1 : world);
      for (auto& trainer : trainers) set_parameters(trainer->model(), mean);
      if (how == Averaging::state_averaged) {
        const std::size_t kinds = trainers[0]->optimizer().state().size();
        for (std::size_t k = 0; k < kinds; ++k) {
          std::vector<UnitValues> state;
          for (auto& trainer : trainers)
            state.push_back({trainer->optimizer().state()[k].tensor.to_vector()});
          const UnitValues state_mean = rank_order_mean(state, dtype, world);
          for (auto& trainer : trainers) {
            Tensor t = trainer->optimizer().state()[k].tensor;
            t.copy_from(Tensor::from_values(state_mean[0], t.dtype(), t.device()).view(t.shape()));
          }
        }
      }
      if (how == Averaging::state_reset)
        for (auto& trainer : trainers) reset_optimizer(*trainer);
    }
    trajectory.emplace_back();
    for (auto& trainer : trainers) trajectory.back().push_back(parameters_of(trainer->model()));
  }
  return trajectory;
}

// True when @p got is within @p relative of the largest magnitude of each
// unit of @p expected, element by element: near enough to name a simulated
// mistake, which is off by the size of a whole update or more.
inline bool near(const UnitValues& expected, const UnitValues& got, double relative) {
  for (std::size_t u = 0; u < expected.size(); ++u) {
    double largest = 0;
    for (double x : expected[u]) largest = std::max(largest, std::fabs(x));
    const double allowed = relative * largest + 1e-300;
    for (std::size_t i = 0; i < expected[u].size(); ++i)
      if (!(std::fabs(expected[u][i] - got[u][i]) <= allowed)) return false;
  }
  return true;
}

// compare_units() of @p what within @p within, cut to its first unit that
// differs and a count of the others: "" when every unit matches.
inline std::string first_unit_differing(const std::string& what, GPT& model,
                                        const UnitValues& expected, const UnitValues& got,
                                        const Closeness& within) {
  const std::string all = compare_units(what, model, expected, got, within);
  std::size_t units = 0, first_end = std::string::npos;
  for (std::size_t at = all.find("\n    unit "); at != std::string::npos;
       at = all.find("\n    unit ", at + 1)) {
    if (++units == 2) first_end = at;
  }
  if (units <= 1) return all;
  return all.substr(0, first_end) + " (and " + std::to_string(units - 1) + " more unit(s))";
}

// True when @p a and @p b are within @p within element by element: a
// simulated mistake that changes nothing yet (a sum on one rank) names
// nothing.
inline bool alike(const UnitValues& a, const UnitValues& b, const Closeness& within) {
  for (std::size_t u = 0; u < a.size(); ++u)
    for (std::size_t i = 0; i < a[u].size(); ++i)
      if (!within.holds(a[u][i], b[u][i])) return false;
  return true;
}

// "" or, when @p got is a multiple of @p expected (fitted over every
// element), that ratio and what it most likely means on @p world ranks
// ("2.00x ...: did you sum over the ranks without dividing ...").
inline std::string scale_hint(const UnitValues& expected, const UnitValues& got, int world) {
  double ge = 0, ee = 0;
  for (std::size_t u = 0; u < expected.size(); ++u)
    for (std::size_t i = 0; i < expected[u].size(); ++i) {
      ge += got[u][i] * expected[u][i];
      ee += expected[u][i] * expected[u][i];
    }
  if (ee == 0) return "";
  const double ratio = ge / ee;
  UnitValues scaled = expected;
  for (std::vector<double>& unit : scaled)
    for (double& x : unit) x *= ratio;
  if (std::fabs(ratio - 1) < 1e-6 || !near(scaled, got, 1e-9)) return "";
  char digits[32];
  std::snprintf(digits, sizeof digits, "%.2fx", ratio);
  return std::string("They are ") + digits +
         " the expected values: " + explain_ratio(ratio, world, 1) + "\n    ";
}

// How near a rank's state must be to a simulated mistake to name it: 1e-6
// (f64) or 1e-3 (f32) of each unit's largest value, far above rounding and
// far below what any of the mistakes changes.
inline double mistake_closeness(DType dtype) { return tolerance(dtype, 1e-6, 1e-3); }

// "rank 1, step 4": how every message of these checkers starts.
inline std::string rank_step(int rank, std::int64_t step) {
  return "rank " + std::to_string(rank) + ", step " + std::to_string(step);
}

// "after steps 3, 6, ...": when a run of period @p h communicates.
inline std::string period_steps(int h) {
  return h == 1 ? "after every step"
                : "after steps " + std::to_string(h) + ", " + std::to_string(2 * h) + ", ...";
}

// Two failure messages as one ("" when both are empty).
inline std::string joined(const std::string& first, const std::string& second) {
  if (first.empty() || second.empty()) return first + second;
  return first + "\n    " + second;
}

// A tensor laid out like @p unit's parameters that every rank must hold
// bitwise the same: "parameters", "theta", "m".
struct Replicated {
  std::string what;
  const Unit* unit = nullptr;
  Tensor tensor;
};

// "" when every rank holds bitwise the same values in each of @p tensors;
// else the first tensor and element where a rank differs from rank 0 (all
// 17 digits: two different values may agree in 12), then @p hint. One
// all_gather per tensor, on every rank.
inline std::string check_replicas_bitwise(Comm& comm, const std::vector<Replicated>& tensors,
                                          const std::string& hint) {
  std::string message;
  for (const Replicated& r : tensors) {
    const Tensor mine = r.tensor.flatten().clone();
    Tensor all = Tensor::empty(Shape{mine.numel() * comm.size()}, mine.dtype(), mine.device());
    comm.all_gather(mine, all);
    if (!message.empty()) continue;
    const std::vector<double> v = all.to_vector();
    const auto n = static_cast<std::size_t>(mine.numel());
    for (std::size_t q = 1; q < static_cast<std::size_t>(comm.size()) && message.empty(); ++q)
      for (std::size_t i = 0; i < n; ++i) {
        if (v[q * n + i] == v[i]) continue;
        char digits[2][40];
        std::snprintf(digits[0], sizeof digits[0], "%.17g", v[q * n + i]);
        std::snprintf(digits[1], sizeof digits[1], "%.17g", v[i]);
        message = "\n    unit '" + r.unit->name() + "' " + r.what + " of " +
                  locate(*r.unit, static_cast<std::int64_t>(i)) + ": rank " + std::to_string(q) +
                  " holds " + digits[0] + " but rank 0 holds " + digits[1] +
                  ": every rank must hold the same bits. " + hint;
        break;
      }
  }
  return message;
}

// The bytes of every unit's parameters: what one all-reduce per unit moves.
inline std::int64_t parameter_bytes(GPT& model) {
  std::int64_t bytes = 0;
  for (Unit* unit : model.units()) bytes += static_cast<std::int64_t>(unit->params().nbytes());
  return bytes;
}

// "" when step @p step of rank @p rank communicated as a run of period @p h
// must: after a step that completes a period, one all_reduce per unit of as
// many bytes as the unit's parameters and no other collective; after any
// other step, nothing. @p what names the message that crosses the wire
// ("the parameters", "delta = theta - params"); @p why_alone says why
// nothing else needs to.
inline std::string check_step_communication(GPT& model, const StepComm& c, int rank,
                                            std::int64_t step, int h, const std::string& what,
                                            const std::string& why_alone) {
  const auto units = static_cast<std::int64_t>(model.units().size());
  const std::int64_t bytes = parameter_bytes(model);
  const bool communicates = step % h == 0;
  const std::string got = "got " + std::to_string(c.all_reduces) + " all_reduce call(s), " +
                          std::to_string(c.other_collectives) + " other collective call(s), " +
                          std::to_string(c.bytes) + " bytes";
  const std::string where = rank_step(rank, step);
  if (!communicates) {
    if (c.all_reduces == 0 && c.other_collectives == 0 && c.bytes == 0) return "";
    return where + ": expected no communication (step " + std::to_string(step) +
           " completes no period of h = " + std::to_string(h) + ": the ranks talk only " +
           period_steps(h) + "); " + got + ". Communicate only when trainer.steps_done() % h == 0.";
  }
  if (c.all_reduces == units && c.other_collectives == 0 && c.bytes == bytes) return "";
  std::string hint;
  if (c.all_reduces == 0)
    hint = "Nothing was all-reduced after a step that completes a period.";
  else if (c.all_reduces > units)
    hint = "More than one all-reduce per unit: each unit all-reduces " + what + " alone (" +
           why_alone + ").";
  else if (c.all_reduces < units)
    hint = "Some units were left out: every unit of model.units() is all-reduced.";
  else if (c.other_collectives > 0)
    hint = "All-reduce (ReduceOp::avg) is the only collective needed.";
  else
    hint = "Each unit's all-reduce moves the unit's whole flat buffer (" + what + ").";
  return where + " (completes a period of h = " + std::to_string(h) + "): expected " +
         std::to_string(units) + " all_reduce calls (one per unit) moving " + what + ", " +
         std::to_string(bytes) + " bytes, and no other collective; " + got + ". " + hint;
}

}  // namespace dtp::testing::ch11_lockstep
