// Checkers for 10.3 1-bit Adam. The checker replays 1-bit Adam itself from
// the gradients every rank's backward produced, and compares each rank's
// state after every step:
// - warm-up: Adam on the mean gradient (the checker's own all_reduce of the
//   ranks' local gradients), m, v and the parameters bit for bit;
// - after warm-up: the variance never changes again (bitwise), every rank
//   holds the same momentum and parameters (bitwise), and they equal the
//   replay of error-feedback sign compression (within a stated tolerance);
// - communication: one all_reduce per unit during warm-up; after it none,
//   only the sign all-gathers' bytes.
// A wrong value is decoded by replaying the likely mistakes too (bias
// correction, an unfrozen variance, an uncompressed momentum, a dropped
// residual, ...) and naming the one the rank's state matches.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "drivers/10_compression/compress_strategy.h"
#include "optimizer_checks.h"

namespace dtp::testing::ch10_one_bit_adam {

using namespace dtp::testing::ch10_optimizers;
using dtp::ch10::OneBitAdam;
using dtp::ch10::OneBitAdamConfig;

using dtp::ch10::OneBitAdamOptimizer;  // the compress strategy's: Trainer::step() runs it

OneBitAdamConfig adam_settings(int warmup_steps) {
  OneBitAdamConfig config;
  config.lr = 1e-3;
  config.warmup_steps = warmup_steps;
  return config;
}

// What the replay can get wrong on purpose, to name what a rank did.
enum class Mistake {
  none,
  local_gradient,
  summed_gradient,
  bias_correction,
  variance_updated,
  momentum_uncompressed,
  residual_dropped
};

struct MistakeMeaning {
  Mistake mistake;
  const char* meaning;
};

const MistakeMeaning kMistakes[] = {
    {Mistake::local_gradient,
     "Adam on this rank's own local gradient: during warm-up each unit's gradient is "
     "all-reduced (ReduceOp::avg) before m and v"},
    {Mistake::summed_gradient,
     "Adam on the sum of the ranks' gradients, not their mean: all-reduce with ReduceOp::avg"},
    {Mistake::bias_correction,
     "Adam with bias correction (m / (1 - b1^t), v / (1 - b2^t)): 1-bit Adam's Adam has none"},
    {Mistake::variance_updated,
     "the variance still updated after warm-up: once compressing() is true, v is frozen"},
    {Mistake::momentum_uncompressed,
     "the momentum all-reduced uncompressed (the exact mean of the ranks' momenta): after "
     "warm-up it goes through the unit's SignAllReduce"},
    {Mistake::residual_dropped,
     "sign compression whose residual is not carried to the next step (a SignAllReduce made "
     "anew each step?): each unit keeps one SignAllReduce for the whole run"},
};

// The checker's own 1-bit Adam, per element in double as the contract writes
// it, each stored value rounded to the model's dtype; @p mistake makes it
// wrong on purpose. It replays every rank's compression (their momenta and
// residuals) to get the average each rank should hold.
class OneBitAdamReplay {
 public:
  OneBitAdamReplay(Mistake mistake, const OneBitAdamConfig& config, DType dtype, int rank,
                   int world, const UnitValues& params)
      : p(params),
        m(zeros_like(params)),
        v(zeros_like(params)),
        scale_bound(params.size(), 0),
        mistake_(mistake),
        c_(config),
        dtype_(dtype),
        rank_(rank),
        residual_(static_cast<std::size_t>(world), zeros_like(params)) {}

  // One step, from the checker's mean of the ranks' gradients (for warm-up)
  // and every rank's local gradient.
  void step(const UnitValues& mean, const std::vector<UnitValues>& local) {
    ++t_;
    for (std::size_t u = 0; u < p.size(); ++u) {
      if (t_ <= c_.warmup_steps)
        adam_moments(u, mistake_ == Mistake::local_gradient ? local[rank_][u] : mean[u],
                     mistake_ == Mistake::summed_gradient ? static_cast<double>(local.size()) : 1);
      else
        compressed_momentum(u, local);
      update_parameters(u);
    }
  }

  UnitValues p, m, v;
  // Per unit, the largest scale s of the last compressed step over the
  // ranks: what a momentum element is made of.
  std::vector<double> scale_bound;

 private:
  static UnitValues zeros_like(const UnitValues& values) {
    UnitValues zeros;
    for (const std::vector<double>& unit : values) zeros.emplace_back(unit.size(), 0.0);
    return zeros;
  }
  double round(double x) const { return round_to(dtype_, x); }

  void adam_moments(std::size_t u, const std::vector<double>& gradient, double factor) {
    const double b1 = c_.beta1, b2 = c_.beta2;
    for (std::size_t i = 0; i < m[u].size(); ++i) {
      const double g = factor * gradient[i];
      m[u][i] = round(b1 * m[u][i] + (1 - b1) * g);
      v[u][i] = round(b2 * v[u][i] + (1 - b2) * g * g);
    }
  }

  // Every rank's local momentum through sign compression with error
  // feedback; m becomes their average, summed in rank order.
  void compressed_momentum(std::size_t u, const std::vector<UnitValues>& local) {
    const double b1 = c_.beta1, b2 = c_.beta2;
    const std::size_t n = m[u].size();
    if (mistake_ == Mistake::variance_updated)
      for (std::size_t i = 0; i < n; ++i) {
        const double g = local[rank_][u][i];
        v[u][i] = round(b2 * v[u][i] + (1 - b2) * g * g);
      }
    std::vector<double> sum(n, 0.0);
    scale_bound[u] = 0;
    for (std::size_t q = 0; q < local.size(); ++q) {
      std::vector<double> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = round(b1 * m[u][i] + (1 - b1) * local[q][u][i]);
      if (mistake_ == Mistake::momentum_uncompressed) {
        for (std::size_t i = 0; i < n; ++i) sum[i] += x[i];
        continue;
      }
      std::vector<double>& residual = residual_[q][u];
      double total = 0;
      for (std::size_t i = 0; i < n; ++i) {
        x[i] = round(x[i] + residual[i]);
        total += std::fabs(x[i]);
      }
      const double s = round(total / static_cast<double>(n));
      scale_bound[u] = std::max(scale_bound[u], s);
      for (std::size_t i = 0; i < n; ++i) {
        const double c = x[i] >= 0 ? s : -s;
        residual[i] = mistake_ == Mistake::residual_dropped ? 0 : round(x[i] - c);
        sum[i] += c;
      }
    }
    for (std::size_t i = 0; i < n; ++i) m[u][i] = round(sum[i] / static_cast<double>(local.size()));
  }

  void update_parameters(std::size_t u) {
    for (std::size_t i = 0; i < p[u].size(); ++i) {
      double mi = m[u][i], vi = v[u][i];
      if (mistake_ == Mistake::bias_correction) {
        mi = mi / (1 - std::pow(c_.beta1, t_));
        vi = vi / (1 - std::pow(c_.beta2, t_));
      }
      p[u][i] = round(p[u][i] - c_.lr * mi / (std::sqrt(vi) + c_.eps));
    }
  }

  Mistake mistake_;
  OneBitAdamConfig c_;
  DType dtype_;
  std::size_t rank_;
  int t_ = 0;
  std::vector<UnitValues> residual_;  // [rank][unit]
};

// How far a compressed-phase momentum may be from the replay's, as a
// fraction of the unit's largest scale s. The contract fixes every operation
// but one: s = mean |v_i| may be summed in another order or precision than
// the replay's (index order, in double). That moves s by at most n u
// relative (n <= 3280 values per unit; u = 2^-53 in f64, 2^-24 in f32 if
// summed in float), every momentum element (a mean of +-s) by as much of s,
// and the residual carries it on: after 3 compressed steps at most 1.1e-12
// of s in f64, 5.9e-4 in f32 (measured on the reference: 0 in f64, 1.2e-6
// in f32, where 10.2's reference sums s in float). The mistakes it must see
// are of the order of s itself (a dropped residual, a momentum averaged
// exactly, bias correction's factor 2.9 at step 4).
double momentum_tolerance(DType dtype) { return tolerance(dtype, 1e-10, 1e-3); }

// The state a rank holds after a step: momentum, variance, parameters.
struct AdamState {
  UnitValues m, v, p;
};

AdamState state_of(const OneBitAdam& adam, GPT& model) {
  AdamState state;
  std::vector<Unit*> units = model.units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    state.m.push_back(adam.momentum(static_cast<int>(u)).to_vector());
    state.v.push_back(adam.variance(static_cast<int>(u)).to_vector());
    state.p.push_back(units[u]->params().to_vector());
  }
  return state;
}

// Which checks a run makes (each test makes some).
struct Checks {
  bool warmup = false;         // m, v, p bit for bit during warm-up
  bool frozen = false;         // v unchanged after warm-up
  bool compressed = false;     // m and p against the replay, replicas bitwise
  bool communication = false;  // calls and bytes per step
};

// The meaning of the first mistake whose replay @p got matches (within
// @p relative of each unit's largest value), or "".
std::string matching_mistake(const AdamState& got, const std::vector<OneBitAdamReplay>& replays,
                             double relative) {
  auto close = [relative](const UnitValues& expected, const UnitValues& values) {
    for (std::size_t u = 0; u < expected.size(); ++u) {
      const double allowed = relative * largest_magnitude(expected[u]) + 1e-300;
      if (find_mismatch(expected[u], values[u], std::vector<double>(expected[u].size(), allowed)))
        return false;
    }
    return true;
  };
  for (std::size_t k = 1; k < replays.size(); ++k)
    if (close(replays[k].m, got.m) && close(replays[k].v, got.v) && close(replays[k].p, got.p))
      return std::string(kMistakes[k - 1].meaning);
  return "";
}

// One quantity of every unit against the replay; "" or the first wrong
// element of the first unit that has one, then @p why.
std::string compare_quantity(GPT& model, const std::string& where, const std::string& quantity,
                             const UnitValues& expected, const UnitValues& got,
                             const std::vector<std::vector<double>>& allowed,
                             const std::string& why) {
  for (std::size_t u = 0; u < expected.size(); ++u) {
    const Mismatch m = find_mismatch(expected[u], got[u], allowed[u]);
    if (!m) continue;
    const auto i = static_cast<std::size_t>(m.first);
    return where + ", " + element_name(model, u, m.first) + ": " + quantity + " " +
           expected_got(expected[u][i], got[u][i], m, expected[u].size()) + ". " + why;
  }
  return "";
}

std::vector<std::vector<double>> zero_allowance(const UnitValues& like) {
  std::vector<std::vector<double>> zeros;
  for (const std::vector<double>& unit : like) zeros.emplace_back(unit.size(), 0.0);
  return zeros;
}

// The bytes of one compressed step: per unit, every rank's signs (32 to an
// i32 word) and its one scale, all-gathered.
std::int64_t sign_all_gather_bytes(GPT& model, int world, DType dtype) {
  std::int64_t bytes = 0;
  for (Unit* unit : model.units())
    bytes += world * (dtp::ch10::packed_words(unit->numel(), 1) * 4 +
                      static_cast<std::int64_t>(dtype_size(dtype)));
  return bytes;
}

std::string check_step_communication(GPT& model, const StepComm& c, std::int64_t step,
                                     bool compressing, int rank, int world, DType dtype) {
  const std::string where = rank_step(rank, step);
  const std::int64_t units = static_cast<std::int64_t>(model.units().size());
  const std::int64_t gradient = gradient_bytes(model);
  const std::string got = "got " + std::to_string(c.all_reduces) + " all_reduce call(s), " +
                          std::to_string(c.other_collectives) + " other collective call(s), " +
                          std::to_string(c.bytes) + " bytes";
  if (!compressing) {
    if (c.all_reduces == units && c.other_collectives == 0 && c.bytes == gradient) return "";
    std::string hint = "Warm-up is exact Adam on the mean gradient";
    if (c.all_reduces == 0)
      hint = "The gradient was never all-reduced: warm-up is exact Adam on the mean gradient";
    if (c.other_collectives > 0) hint += "; the SignAllReduce is for after warm-up";
    return where + " (warm-up): expected " + std::to_string(units) +
           " all_reduce calls (one per unit) moving the gradient's " + std::to_string(gradient) +
           " bytes, and no other collective; " + got + ". " + hint;
  }
  const std::int64_t expected = sign_all_gather_bytes(model, world, dtype);
  if (c.all_reduces == 0 && c.bytes == expected) return "";
  std::string hint =
      "After warm-up the momentum travels only through each unit's SignAllReduce: per unit, "
      "an all_gather of every rank's signs (" +
      std::to_string(world) + " x packed_words(n, 1) i32 words) and of its one scale (" +
      std::to_string(world) + " x " + std::to_string(dtype_size(dtype)) + " bytes of " +
      dtype_name(dtype) + "), " + std::to_string(expected) + " bytes in all (the momentum in " +
      dtype_name(dtype) + " is " + std::to_string(gradient) + " bytes)";
  if (c.all_reduces > 0)
    hint = "Looks like the momentum (or the gradient) was all-reduced in full precision. " + hint;
  return where + " (after warm-up): expected no all_reduce and " + std::to_string(expected) +
         " bytes; " + got + ". " + hint;
}

// "" when this rank's variance @p got is bitwise @p frozen, its own at the
// end of warm-up; otherwise the first element that moved, and whether it
// moved as an Adam update with this rank's gradient @p local or the mean
// gradient @p mean would move it.
std::string check_frozen_variance(GPT& model, const std::string& where, const UnitValues& frozen,
                                  const UnitValues& got, const UnitValues& local,
                                  const UnitValues& mean, const OneBitAdamConfig& c, DType dtype) {
  for (std::size_t u = 0; u < frozen.size(); ++u) {
    const Mismatch m = find_mismatch(frozen[u], got[u]);
    if (!m) continue;
    const auto i = static_cast<std::size_t>(m.first);
    auto updated_with = [&](double g) {
      return round_to(dtype, c.beta2 * frozen[u][i] + (1 - c.beta2) * g * g);
    };
    auto near = [&](double x) { return std::fabs(x - got[u][i]) <= 1e-6 * std::fabs(x); };
    std::string hint = "After warm-up the variance never changes: bitwise what warm-up left.";
    if (near(updated_with(local[u][i])))
      hint +=
          " It moved as v = b2 * v + (1 - b2) * g * g with this rank's own gradient would: "
          "the variance is still updated after warm-up.";
    else if (near(updated_with(mean[u][i])))
      hint +=
          " It moved as v = b2 * v + (1 - b2) * g * g with the mean gradient would: the "
          "variance is still updated after warm-up (and the gradient still all-reduced?).";
    return where + ", " + element_name(model, u, m.first) +
           ": variance v (this rank's own at the end of warm-up) " +
           expected_got(frozen[u][i], got[u][i], m, frozen[u].size()) + ". " + hint;
  }
  return "";
}

// Trains @p steps steps on this rank with 1-bit Adam (@p warmup exact
// steps) and makes @p checks after every step; "" or the first failure of
// each kind. Every rank runs the same collectives whatever it finds, so a
// failure on one rank never leaves the others waiting.
std::string run_one_bit_adam(Comm& comm, int warmup, int steps, const Checks& checks) {
  const TrainConfig config = optimizer_config(steps, comm.device());
  Trainer trainer(config, comm.rank(), comm.size());
  GPT& model = trainer.model();
  const DType dtype = config.model.dtype;
  const OneBitAdamConfig settings = adam_settings(warmup);
  auto optimizer = std::make_unique<OneBitAdamOptimizer>(comm, model, settings);
  const OneBitAdam& adam = optimizer->adam();
  trainer.set_optimizer(std::move(optimizer));
  UnitValues local;
  trainer.on_after_backward([&] { local = gradients_of(model); });

  const UnitValues initial = capture(model, {}).params;
  std::vector<OneBitAdamReplay> replays;
  replays.emplace_back(Mistake::none, settings, dtype, comm.rank(), comm.size(), initial);
  for (const MistakeMeaning& mistake : kMistakes)
    replays.emplace_back(mistake.mistake, settings, dtype, comm.rank(), comm.size(), initial);
  // Per element, how far the parameters may drift from the replay: the sum
  // over compressed steps of lr x the momentum's tolerance / (sqrt(v) + eps)
  // (the update's error), plus 2 roundings of p per step.
  std::vector<std::vector<double>> parameter_allowance = zero_allowance(initial);

  UnitValues warmup_variance;  // this rank's v after the last warm-up step
  std::string values_failure, frozen_failure, replicas_failure, communication_failure;
  for (int s = 1; s <= steps; ++s) {
    const bool compressing = s > warmup;
    const CommStats before = comm.stats();
    trainer.step();
    const StepComm c = comm_between(before, comm.stats());
    // The checker's own collectives, the same on every rank.
    UnitValues mean = local;
    for (std::size_t u = 0; u < mean.size(); ++u) {
      Tensor g = Tensor::from_values(local[u], dtype, comm.device());
      comm.all_reduce(g, ReduceOp::avg);
      mean[u] = g.to_vector();
    }
    const std::vector<UnitValues> all_local = gather_from_ranks(comm, local, dtype);
    std::vector<std::pair<std::string, Tensor>> replicated;
    const std::vector<Unit*> units = model.units();
    for (std::size_t u = 0; u < units.size(); ++u) {
      const std::string unit = "unit '" + units[u]->name() + "' ";
      replicated.push_back({unit + "momentum", adam.momentum(static_cast<int>(u))});
      replicated.push_back({unit + "parameters", units[u]->params()});
    }
    const std::string replicas = check_replicas_agree(
        comm, replicated,
        "1-bit Adam's average (exact during warm-up, of the ranks' signs after it) is the same on "
        "every rank, and so is the update made from it.",
        "DP");
    for (OneBitAdamReplay& replay : replays) replay.step(mean, all_local);
    const OneBitAdamReplay& expected = replays[0];
    const AdamState got = state_of(adam, model);
    // A mistake's replay is far from the right one (by the size of m, v or
    // an update); near enough to name it: 1e-6 (f64) or 1e-3 (f32) of each
    // unit's largest value, above the f32 rounding of a rank's own arithmetic.
    const std::string mistake = matching_mistake(got, replays, tolerance(dtype, 1e-6, 1e-3));
    const std::string decoded =
        mistake.empty() ? "" : " This step's m, v and parameters match " + mistake + ".";

    if (checks.communication && communication_failure.empty())
      communication_failure =
          check_step_communication(model, c, s, compressing, comm.rank(), comm.size(), dtype);
    if (checks.compressed && replicas_failure.empty() && !replicas.empty())
      replicas_failure = rank_step(comm.rank(), s) + ": the replicas differ:" + replicas;

    if (s == warmup) warmup_variance = got.v;
    if (!compressing) {
      if (!checks.warmup || !values_failure.empty()) continue;
      const std::string where = rank_step(comm.rank(), s) + " (warm-up " + std::to_string(s) +
                                " of " + std::to_string(warmup) + ")";
      const std::string why =
          "Warm-up is Adam on the mean gradient, bit for bit: per element in double, m = b1 * m "
          "+ (1 - b1) * g, v = b2 * v + (1 - b2) * g * g, p = p - lr * m / (std::sqrt(v) + "
          "eps), each rounded to " +
          std::string(dtype_name(dtype)) + " when stored." + decoded;
      const std::vector<std::vector<double>> exact = zero_allowance(initial);
      values_failure = compare_quantity(model, where, "momentum m", expected.m, got.m, exact, why);
      if (values_failure.empty())
        values_failure =
            compare_quantity(model, where, "variance v", expected.v, got.v, exact, why);
      if (values_failure.empty())
        values_failure = compare_quantity(model, where, "parameter", expected.p, got.p, exact, why);
      continue;
    }

    const std::string where = rank_step(comm.rank(), s) + " (compressed step " +
                              std::to_string(s - warmup) + ", after " + std::to_string(warmup) +
                              " warm-up steps)";
    if (checks.frozen && frozen_failure.empty())
      frozen_failure =
          check_frozen_variance(model, where, warmup_variance, got.v, local, mean, settings, dtype);
    std::vector<std::vector<double>> momentum_allowance = zero_allowance(initial);
    for (std::size_t u = 0; u < initial.size(); ++u) {
      const double m_tolerance = momentum_tolerance(dtype) * expected.scale_bound[u];
      momentum_allowance[u].assign(initial[u].size(), m_tolerance);
      for (std::size_t i = 0; i < initial[u].size(); ++i)
        parameter_allowance[u][i] +=
            settings.lr * m_tolerance / (std::sqrt(expected.v[u][i]) + settings.eps) +
            2 * unit_roundoff(dtype) * std::fabs(expected.p[u][i]);
    }
    if (!checks.compressed || !values_failure.empty()) continue;
    const std::string why =
        "After warm-up: each rank's m = b1 * m + (1 - b1) * g from its own gradient, then the "
        "unit's SignAllReduce (whose residual carries on from step to step), then p with the "
        "frozen v (tolerance: " +
        number(momentum_tolerance(dtype)) + " of the unit's largest scale s)." + decoded;
    values_failure =
        compare_quantity(model, where, "momentum m", expected.m, got.m, momentum_allowance, why);
    if (values_failure.empty())
      values_failure =
          compare_quantity(model, where, "parameter", expected.p, got.p, parameter_allowance, why);
  }
  return joined(joined(values_failure, frozen_failure),
                joined(replicas_failure, communication_failure));
}

void expect_one_bit_adam(const std::string& what, int warmup, int steps, const Checks& checks) {
  for (int world : fitting_worlds({2, 4}))
    run_and_report("10.3 OneBitAdam, " + what, world,
                   [&](Comm& comm) { return run_one_bit_adam(comm, warmup, steps, checks); });
}

TEST(Puzzle10_3_one_bit_adam, WarmupIsAdamOnTheMeanGradientBitForBit) {
  expect_one_bit_adam("3 warm-up steps", 3, 3, Checks{.warmup = true});
}

TEST(Puzzle10_3_one_bit_adam, VarianceFreezesAfterWarmup) {
  expect_one_bit_adam("2 warm-up steps, 3 compressed", 2, 5, Checks{.frozen = true});
}

TEST(Puzzle10_3_one_bit_adam, CompressedMomentumMatchesTheSignReplayOnEveryRank) {
  expect_one_bit_adam("2 warm-up steps, 3 compressed", 2, 5, Checks{.compressed = true});
}

TEST(Puzzle10_3_one_bit_adam, AllReducesOnlyDuringWarmup) {
  expect_one_bit_adam("2 warm-up steps, 3 compressed", 2, 5, Checks{.communication = true});
}

}  // namespace dtp::testing::ch10_one_bit_adam
