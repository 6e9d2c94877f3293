// Checkers for 10.4 PowerSGD. The checker replays PowerSGD itself in f64
// (its own matrix products as loops, its own Gram-Schmidt) from the
// gradients every rank's backward produced, and compares each rank after
// every step: the averaged gradients, Q (it persists: the warm start) and
// the rank's own error E (error feedback), on 2 and 3 ranks with r = 1 and
// r = 2. Also: Q's first values come from Rng(seed), the replicas agree
// bitwise, each step all-reduces P and Q of every matrix and every other
// parameter whole (bytes by formula), and a bad rank is refused by name.
// A wrong value is decoded by replaying the likely mistakes too (Q drawn
// afresh, E dropped, P not orthonormalized, ...) and naming the one the
// rank's gradients match.
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "optimizer_checks.h"

namespace dtp::testing::ch10_power_sgd {

using namespace dtp::testing::ch10_optimizers;
using dtp::ch10::PowerSgd;

constexpr std::uint64_t kQSeed = 77;

// A weight the checker expects PowerSGD to compress: a 2-D parameter.
struct WeightMatrix {
  std::size_t unit;
  std::string name;
  std::int64_t offset, out, in;  // in the unit's flat buffers; its shape [out, in]
};

// Every 2-D parameter, units in forward order, parameters in layout order.
std::vector<WeightMatrix> weight_matrices(GPT& model) {
  std::vector<WeightMatrix> matrices;
  std::vector<Unit*> units = model.units();
  for (std::size_t u = 0; u < units.size(); ++u)
    for (const ParamView& p : units[u]->parameters())
      if (p.shape.ndim() == 2) matrices.push_back({u, p.name, p.offset, p.shape[0], p.shape[1]});
  return matrices;
}

std::string matrix_name(GPT& model, const WeightMatrix& w) {
  return "unit '" + model.units()[w.unit]->name() + "' '" + w.name + "'";
}

// Q's first values as the contract draws them: one Rng(seed) filling every
// matrix's [in, r] in order (or, with @p fresh_stream, a new Rng(seed) per
// matrix: a mistake the messages name).
std::vector<std::vector<double>> initial_q(const std::vector<WeightMatrix>& matrices, int r,
                                           DType dtype, bool fresh_stream = false) {
  std::vector<std::vector<double>> qs;
  Rng rng(kQSeed);
  for (const WeightMatrix& w : matrices) {
    if (fresh_stream) rng = Rng(kQSeed);
    Tensor q = Tensor::empty(Shape{w.in, r}, dtype, Device::cpu());
    ops::fill_normal(q, 0, 1, rng);
    qs.push_back(q.to_vector());
  }
  return qs;
}

// What the replay can get wrong on purpose, to name what a rank did.
enum class Mistake { none, fresh_q, no_error_feedback, no_orthonormalization, local_q };

struct MistakeMeaning {
  Mistake mistake;
  const char* meaning;
};

const MistakeMeaning kMistakes[] = {
    {Mistake::fresh_q,
     "PowerSGD with Q drawn afresh from Rng(seed) every step: Q persists from step to step "
     "(the warm start), only its first values are drawn"},
    {Mistake::no_error_feedback,
     "PowerSGD without error feedback (E never added, or reset every step): M = G + E, and "
     "E = M - P Q^T is kept for the next step"},
    {Mistake::no_orthonormalization,
     "PowerSGD without orthonormalizing P's columns (Gram-Schmidt) before Q = M^T P"},
    {Mistake::local_q,
     "PowerSGD whose Q = M^T P is never all-reduced: each rank keeps its own Q, so G = P Q^T "
     "differs between ranks"},
};

// The checker's own PowerSGD, in double, every rank's part of it; @p mistake
// makes it wrong on purpose. After step(): this rank's averaged gradients,
// its Q and every rank's error.
class PowerSgdReplay {
 public:
  PowerSgdReplay(Mistake mistake, std::vector<WeightMatrix> matrices, int r, int rank, int world,
                 std::vector<std::vector<double>> first_q)
      : mistake_(mistake),
        matrices_(std::move(matrices)),
        r_(r),
        rank_(rank),
        world_(world),
        first_q_(first_q),
        q_(static_cast<std::size_t>(world), first_q) {
    errors.resize(static_cast<std::size_t>(world));
    for (std::vector<std::vector<double>>& rank_errors : errors)
      for (const WeightMatrix& w : matrices_)
        rank_errors.emplace_back(static_cast<std::size_t>(w.out * w.in), 0.0);
  }

  // One all_reduce_gradients from every rank's local gradient [rank][unit].
  void step(const std::vector<UnitValues>& local) {
    // Every parameter averaged whole first; the matrices' elements are replaced below.
    gradients = local[0];
    for (std::size_t u = 0; u < gradients.size(); ++u)
      for (std::size_t i = 0; i < gradients[u].size(); ++i) {
        double sum = 0;
        for (const UnitValues& rank : local) sum += rank[u][i];
        gradients[u][i] = sum / world_;
      }
    for (std::size_t k = 0; k < matrices_.size(); ++k) {
      const WeightMatrix& w = matrices_[k];
      const std::size_t out = static_cast<std::size_t>(w.out), in = static_cast<std::size_t>(w.in),
                        r = static_cast<std::size_t>(r_);
      if (mistake_ == Mistake::fresh_q)
        for (std::vector<std::vector<double>>& q : q_) q[k] = first_q_[k];
      // M = G + E on every rank; P = mean over ranks of M Q ([out, r]).
      std::vector<std::vector<double>> ms;
      std::vector<double> p(out * r, 0.0);
      for (std::size_t q = 0; q < local.size(); ++q) {
        std::vector<double> m(out * in);
        for (std::size_t i = 0; i < out * in; ++i)
          m[i] = local[q][w.unit][static_cast<std::size_t>(w.offset) + i] + errors[q][k][i];
        for (std::size_t row = 0; row < out; ++row)
          for (std::size_t j = 0; j < r; ++j) {
            double dot = 0;
            for (std::size_t c = 0; c < in; ++c) dot += m[row * in + c] * q_[q][k][c * r + j];
            p[row * r + j] += dot;
          }
        ms.push_back(std::move(m));
      }
      for (double& x : p) x /= world_;
      if (mistake_ != Mistake::no_orthonormalization) orthonormalize(p, out, r);
      // Q = mean over ranks of M^T P ([in, r]).
      std::vector<std::vector<double>> qs(local.size(), std::vector<double>(in * r, 0.0));
      for (std::size_t q = 0; q < local.size(); ++q)
        for (std::size_t c = 0; c < in; ++c)
          for (std::size_t j = 0; j < r; ++j) {
            double dot = 0;
            for (std::size_t row = 0; row < out; ++row) dot += ms[q][row * in + c] * p[row * r + j];
            qs[q][c * r + j] = dot;
          }
      for (std::size_t q = 0; q < local.size(); ++q) {
        if (mistake_ == Mistake::local_q) {
          q_[q][k] = qs[q];
          continue;
        }
        std::vector<double> mean(in * r, 0.0);
        for (const std::vector<double>& each : qs)
          for (std::size_t i = 0; i < in * r; ++i) mean[i] += each[i];
        for (double& x : mean) x /= world_;
        q_[q][k] = mean;
      }
      // G = P Q^T; E = M - G, each rank's own.
      for (std::size_t q = 0; q < local.size(); ++q) {
        std::vector<double> g(out * in);
        for (std::size_t row = 0; row < out; ++row)
          for (std::size_t c = 0; c < in; ++c) {
            double dot = 0;
            for (std::size_t j = 0; j < r; ++j) dot += p[row * r + j] * q_[q][k][c * r + j];
            g[row * in + c] = dot;
          }
        for (std::size_t i = 0; i < out * in; ++i)
          errors[q][k][i] = mistake_ == Mistake::no_error_feedback ? 0 : ms[q][i] - g[i];
        if (q == static_cast<std::size_t>(rank_))
          for (std::size_t i = 0; i < out * in; ++i)
            gradients[w.unit][static_cast<std::size_t>(w.offset) + i] = g[i];
      }
    }
  }

  // This rank's Q of matrix @p k.
  const std::vector<double>& q(std::size_t k) const {
    return q_[static_cast<std::size_t>(rank_)][k];
  }

  UnitValues gradients;                                  // this rank's, per unit
  std::vector<std::vector<std::vector<double>>> errors;  // [rank][matrix]

 private:
  // Classical Gram-Schmidt on the columns of a [rows, r] matrix: each
  // column minus its projections on the finished columns before it, then
  // divided by its norm.
  static void orthonormalize(std::vector<double>& a, std::size_t rows, std::size_t r) {
    for (std::size_t j = 0; j < r; ++j) {
      std::vector<double> column(rows);
      for (std::size_t i = 0; i < rows; ++i) column[i] = a[i * r + j];
      for (std::size_t k = 0; k < j; ++k) {
        double dot = 0;
        for (std::size_t i = 0; i < rows; ++i) dot += a[i * r + j] * a[i * r + k];
        for (std::size_t i = 0; i < rows; ++i) column[i] -= dot * a[i * r + k];
      }
      double norm = 0;
      for (double x : column) norm += x * x;
      norm = std::sqrt(norm);
      for (std::size_t i = 0; i < rows; ++i) a[i * r + j] = column[i] / norm;
    }
  }

  Mistake mistake_;
  std::vector<WeightMatrix> matrices_;
  int r_, rank_, world_;
  std::vector<std::vector<double>> first_q_;
  std::vector<std::vector<std::vector<double>>> q_;  // [rank][matrix]: equal but for local_q
};

// How near a rank's values must be to the replay's, as a fraction of the
// largest |value| of the parameter (or Q, or E) compared. The replay adds
// its products in its own order, ops::matmul in another: each product sums
// at most 64 terms (in, out <= 64), so it moves by at most 64 u of the sum
// of its terms' magnitudes (u = 2^-53 in f64, 2^-24 in f32 for a rank that
// stores P, Q and M in f32), and Gram-Schmidt divides by column norms that
// cancellation can make 10-100x smaller than the columns (P's columns are
// near parallel when M is near rank 1): f64 64 u x 100 = 7e-13 per step,
// over 3 steps (E carries it) 2e-12; f32 4e-6 x 100 x 3 = 1.1e-3. The
// mistakes are of the size of the values themselves (a Q drawn afresh, a
// dropped E, a P left unnormalized scales G by |P|^2). Measured on the
// reference (ops::matmul, modified Gram-Schmidt): 1.6e-15 in f64, 3e-6 in f32.
double replay_tolerance(DType dtype) { return tolerance(dtype, 1e-11, 2e-3); }

// The meaning of the first mistake whose replay @p got (this rank's
// gradients) matches, or "".
std::string matching_mistake(const UnitValues& got, const std::vector<PowerSgdReplay>& replays,
                             DType dtype) {
  for (std::size_t k = 1; k < replays.size(); ++k) {
    bool close = true;
    for (std::size_t u = 0; u < got.size() && close; ++u) {
      const std::vector<double>& expected = replays[k].gradients[u];
      const double allowed = replay_tolerance(dtype) * largest_magnitude(expected);
      close = !find_mismatch(expected, got[u], std::vector<double>(expected.size(), allowed));
    }
    if (close) return std::string(kMistakes[k - 1].meaning);
  }
  return "";
}

// What @p got is when it is the replay's @p expected times a factor that
// names a mistake: the world size (summed, not averaged) or its inverse.
std::string scale_mistake(const std::vector<double>& expected, const std::vector<double>& got,
                          double allowed, int world) {
  double ge = 0, ee = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ge += got[i] * expected[i];
    ee += expected[i] * expected[i];
  }
  if (ee == 0) return "";
  const double ratio = ge / ee;
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (std::fabs(ratio * expected[i] - got[i]) > allowed * std::max(1.0, std::fabs(ratio)))
      return "";
  char text[32];
  std::snprintf(text, sizeof text, "%.2fx", ratio);
  if (std::fabs(ratio - world) < 1e-3 * world)
    return " It is " + std::string(text) +
           " the replay's: summed over the ranks, not averaged (ReduceOp::avg)?";
  if (std::fabs(ratio - 1.0 / world) < 1e-3 / world)
    return " It is " + std::string(text) + " the replay's: divided by the world size twice?";
  return "";
}

// "" or the first element of @p got (one parameter, Q or E) farther from
// @p expected than replay_tolerance() of its largest |expected|.
std::string compare_values(const std::string& where, const std::vector<double>& expected,
                           const std::vector<double>& got, DType dtype, int world,
                           const std::string& why) {
  const double allowed = replay_tolerance(dtype) * largest_magnitude(expected);
  const Mismatch m = find_mismatch(expected, got, std::vector<double>(expected.size(), allowed));
  if (!m) return "";
  const auto i = static_cast<std::size_t>(m.first);
  return where + " element " + std::to_string(m.first) + ": " +
         expected_got(expected[i], got[i], m, expected.size()) + ". " + why +
         scale_mistake(expected, got, allowed, world);
}

// Each rank's PowerSgd after construction: its matrices are the model's
// 2-D parameters in order, Q [in, r] drawn as the contract says, E zero.
std::string check_construction(GPT& model, const PowerSgd& psgd, int r, int rank, DType dtype) {
  const std::vector<WeightMatrix> expected = weight_matrices(model);
  const std::vector<PowerSgd::Matrix>& got = psgd.matrices();
  const std::string who = "rank " + std::to_string(rank) + ", before the first step";
  if (got.size() != expected.size())
    return who + ": matrices() holds " + std::to_string(got.size()) + " matrices, expected " +
           std::to_string(expected.size()) +
           " (every parameter with two dimensions, the embeddings' tables and the head's weight "
           "included)";
  const std::vector<std::vector<double>> first = initial_q(expected, r, dtype);
  const std::vector<std::vector<double>> fresh = initial_q(expected, r, dtype, true);
  for (std::size_t k = 0; k < expected.size(); ++k) {
    const WeightMatrix& w = expected[k];
    const PowerSgd::Matrix& m = got[k];
    const std::string name = matrix_name(model, w);
    if (m.unit != static_cast<int>(w.unit) || m.name != w.name)
      return who + ": matrix " + std::to_string(k) + " is unit " + std::to_string(m.unit) + " '" +
             m.name + "', expected " + name +
             " (units in forward order, parameters in layout order)";
    if (!m.q.defined() || m.q.shape() != Shape{w.in, r} || m.q.dtype() != dtype)
      return who + ", " + name + ": Q is " + (m.q.defined() ? m.q.describe() : "undefined") +
             ", expected " + dtype_name(dtype) + " " + Shape{w.in, r}.str() + " ([in, r])";
    if (!m.error.defined() || m.error.shape() != Shape{w.out, w.in} || m.error.dtype() != dtype)
      return who + ", " + name + ": E is " +
             (m.error.defined() ? m.error.describe() : "undefined") + ", expected " +
             dtype_name(dtype) + " " + Shape{w.out, w.in}.str() + " ([out, in])";
    const std::vector<double> q = m.q.to_vector();
    if (const Mismatch bad = find_mismatch(first[k], q)) {
      const auto i = static_cast<std::size_t>(bad.first);
      std::string hint =
          "Q starts as ops::fill_normal(q, 0, 1, rng) with ONE Rng rng(seed) filling every "
          "matrix's Q in order, so every rank draws the same";
      if (!find_mismatch(fresh[k], q)) hint = "each matrix drew from a fresh Rng(seed); " + hint;
      return who + ", " + name + " Q element " + std::to_string(bad.first) + ": " +
             expected_got(first[k][i], q[i], bad, q.size()) + ". " + hint;
    }
    const std::vector<double> e = m.error.to_vector();
    if (const Mismatch bad = find_mismatch(std::vector<double>(e.size(), 0.0), e))
      return who + ", " + name + " E element " + std::to_string(bad.first) + ": expected 0, got " +
             number(e[static_cast<std::size_t>(bad.first)]) + ". The error starts at zero.";
  }
  return "";
}

// What one step's all_reduce_gradients must move: P [out, r] and Q [in, r]
// of every matrix, every other parameter whole, each in one all_reduce.
std::string check_communication(GPT& model, const StepComm& c, int r, int rank, std::int64_t step,
                                DType dtype) {
  std::int64_t calls = 0, elements = 0, factor_elements = 0, whole_elements = 0;
  for (Unit* unit : model.units())
    for (const ParamView& p : unit->parameters()) {
      ++calls;
      if (p.shape.ndim() == 2) {
        ++calls;
        factor_elements += r * (p.shape[0] + p.shape[1]);
      } else {
        whole_elements += p.shape.numel();
      }
      elements += p.shape.numel();
    }
  const auto size = static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t bytes = (factor_elements + whole_elements) * size;
  if (c.all_reduces == calls && c.other_collectives == 0 && c.bytes == bytes) return "";
  std::string hint;
  if (c.bytes == elements * size)
    hint = " That is the whole gradient's bytes: were the matrices all-reduced uncompressed?";
  else if (c.bytes == whole_elements * size)
    hint = " That is only the parameters that are not 2-D: P and Q never travelled?";
  return rank_step(rank, step) + ", all_reduce_gradients: expected " + std::to_string(calls) +
         " all_reduce calls (P and Q of each matrix, each other parameter whole) moving " +
         std::to_string(bytes) +
         " bytes = (sum over matrices of r (out + in) = " + std::to_string(factor_elements) +
         ", plus " + std::to_string(whole_elements) + " other elements) x " + std::to_string(size) +
         " bytes of " + dtype_name(dtype) + ", and no other collective; got " +
         std::to_string(c.all_reduces) + " all_reduce calls, " +
         std::to_string(c.other_collectives) + " other collective calls, " +
         std::to_string(c.bytes) + " bytes." + hint;
}

// Which checks a run makes (each test makes some).
struct Checks {
  bool construction = false;   // matrices(), Q's draw, E zero
  bool values = false;         // gradients, Q, E against the replay; replicas bitwise
  bool communication = false;  // calls and bytes per step
};

// Trains @p steps steps on this rank with SGD on PowerSGD's averaged
// gradients (rank @p r) and makes @p checks; "" or the first failure of each
// kind. Every rank runs the same collectives whatever it finds.
std::string run_power_sgd(Comm& comm, int r, int steps, const Checks& checks) {
  const TrainConfig config = optimizer_config(steps, comm.device());
  Trainer trainer(config, comm.rank(), comm.size());
  GPT& model = trainer.model();
  const DType dtype = config.model.dtype;
  PowerSgd psgd(comm, model, r, kQSeed);
  std::string construction_failure, values_failure, replicas_failure, communication_failure;
  if (checks.construction)
    construction_failure = check_construction(model, psgd, r, comm.rank(), dtype);

  const std::vector<WeightMatrix> matrices = weight_matrices(model);
  const std::vector<std::vector<double>> first_q = initial_q(matrices, r, dtype);
  std::vector<PowerSgdReplay> replays;
  replays.emplace_back(Mistake::none, matrices, r, comm.rank(), comm.size(), first_q);
  for (const MistakeMeaning& mistake : kMistakes)
    replays.emplace_back(mistake.mistake, matrices, r, comm.rank(), comm.size(), first_q);

  UnitValues local, averaged;
  StepComm c;
  trainer.on_after_backward([&] {
    local = gradients_of(model);
    const CommStats before = comm.stats();
    psgd.all_reduce_gradients();
    c = comm_between(before, comm.stats());
    averaged = gradients_of(model);
  });
  for (int s = 1; s <= steps; ++s) {
    trainer.step();
    // The checker's own collectives, the same on every rank.
    const std::vector<UnitValues> all_local = gather_from_ranks(comm, local, dtype);
    std::vector<std::pair<std::string, Tensor>> replicated;
    for (Unit* unit : model.units())
      replicated.push_back({"unit '" + unit->name() + "' gradients", unit->grads()});
    // Q lives on the host; the checker's gather runs on comm.device().
    for (std::size_t k = 0; k < psgd.matrices().size(); ++k)
      if (psgd.matrices()[k].q.defined())
        replicated.push_back(
            {"matrices()[" + std::to_string(k) + "].q", psgd.matrices()[k].q.to(comm.device())});
    const std::string replicas = check_replicas_agree(
        comm, replicated,
        "P and Q are all-reduced, so G = P Q^T (and the next step's Q) is the same on every "
        "rank.",
        "DP");
    for (PowerSgdReplay& replay : replays) replay.step(all_local);

    if (checks.communication && communication_failure.empty())
      communication_failure = check_communication(model, c, r, comm.rank(), s, dtype);
    if (!checks.values) continue;
    if (replicas_failure.empty() && !replicas.empty())
      replicas_failure = rank_step(comm.rank(), s) + ": the replicas differ:" + replicas;
    if (!values_failure.empty()) continue;
    const PowerSgdReplay& expected = replays[0];
    const std::string mistake = matching_mistake(averaged, replays, dtype);
    const std::string why =
        "(checker's replay in double, rank r = " + std::to_string(r) + ", tolerance " +
        number(replay_tolerance(dtype)) + " of the largest |value|)." +
        (mistake.empty() ? "" : " This step's gradients match " + mistake + ".");
    const std::vector<Unit*> units = model.units();
    for (std::size_t u = 0; u < units.size() && values_failure.empty(); ++u)
      for (const ParamView& p : units[u]->parameters()) {
        const auto from = static_cast<std::ptrdiff_t>(p.offset);
        const auto to = from + static_cast<std::ptrdiff_t>(p.shape.numel());
        const std::vector<double> want(expected.gradients[u].begin() + from,
                                       expected.gradients[u].begin() + to);
        const std::vector<double> have(averaged[u].begin() + from, averaged[u].begin() + to);
        const std::vector<double> before(local[u].begin() + from, local[u].begin() + to);
        const std::string rule = p.shape.ndim() == 2 ? "G = P Q^T " : "Averaged whole ";
        const std::string unchanged =
            have == before && want != before
                ? " The gradient is what backward left: the result never reached it (computed "
                  "on a host copy and not copied back with copy_from?)."
                : "";
        values_failure =
            compare_values(rank_step(comm.rank(), s) + ", unit '" + units[u]->name() + "' '" +
                               p.name + "' gradient after all_reduce_gradients",
                           want, have, dtype, comm.size(), rule + why + unchanged);
        if (!values_failure.empty()) break;
      }
    for (std::size_t k = 0; k < matrices.size() && values_failure.empty(); ++k) {
      if (k >= psgd.matrices().size()) break;
      const PowerSgd::Matrix& got = psgd.matrices()[k];
      const std::string name = rank_step(comm.rank(), s) + ", " + matrix_name(model, matrices[k]);
      values_failure =
          compare_values(name + " Q", expected.q(k), got.q.to_vector(), dtype, comm.size(),
                         "Q = mean of M^T P, kept for the next step " + why);
      if (values_failure.empty())
        values_failure = compare_values(name + " E (this rank's error)",
                                        expected.errors[static_cast<std::size_t>(comm.rank())][k],
                                        got.error.to_vector(), dtype, comm.size(),
                                        "E = M - P Q^T with this rank's own M = G + E " + why);
    }
  }
  return joined(joined(construction_failure, values_failure),
                joined(replicas_failure, communication_failure));
}

void expect_power_sgd(int r, int steps, const Checks& checks) {
  for (int world : fitting_worlds({2, 3}))
    run_and_report("10.4 PowerSgd, rank r = " + std::to_string(r), world,
                   [&](Comm& comm) { return run_power_sgd(comm, r, steps, checks); });
}

TEST(Puzzle10_4_power_sgd, StartsFromQDrawnFromTheSeed) {
  expect_power_sgd(2, 1, Checks{.construction = true});
}

TEST(Puzzle10_4_power_sgd, MatchesTheReplayWithRank1) {
  expect_power_sgd(1, 3, Checks{.values = true});
}

TEST(Puzzle10_4_power_sgd, MatchesTheReplayWithRank2) {
  expect_power_sgd(2, 3, Checks{.values = true});
}

TEST(Puzzle10_4_power_sgd, AllReducesTheFactorsAndTheOtherParametersWhole) {
  expect_power_sgd(2, 2, Checks{.communication = true});
}

// True when @p text holds @p n as a whole number (not inside a longer one).
// (std::regex is avoided: building one on several rank threads at once races
// inside libstdc++'s locale.)
bool names_whole_number(const std::string& text, int n) {
  const std::string digits = std::to_string(n);
  for (std::size_t at = text.find(digits); at != std::string::npos;
       at = text.find(digits, at + 1)) {
    const bool before = at > 0 && std::isdigit(static_cast<unsigned char>(text[at - 1]));
    const std::size_t end = at + digits.size();
    const bool after = end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]));
    if (!before && !after) return true;
  }
  return false;
}

// A rank the factorization cannot have is a dtp::Error that names it (and,
// when too large, the matrix too small for it: the positions table [8, 16]).
TEST(Puzzle10_4_power_sgd, RefusesARankItCannotFactorize) {
  for (const int bad : {0, 9}) {
    run_and_report("10.4 PowerSgd with rank r = " + std::to_string(bad), 2, [&](Comm& comm) {
      Trainer trainer(optimizer_config(1, comm.device()), comm.rank(), comm.size());
      const std::string who = "rank " + std::to_string(comm.rank()) + ", PowerSgd(comm, model, " +
                              std::to_string(bad) + ", seed)";
      try {
        PowerSgd psgd(comm, trainer.model(), bad, kQSeed);
      } catch (const Error& e) {
        const std::string message = e.what();
        const bool names_rank = names_whole_number(message, bad);
        const bool names_matrix = bad == 0 || message.find("positions") != std::string::npos;
        if (names_rank && names_matrix) return std::string();
        return who + " threw \"" + message + "\": the message must name the rank " +
               std::to_string(bad) +
               (bad == 0 ? "" : " and the matrix it exceeds min(out, in) of ('positions' [8, 16])");
      }
      return who +
             " did not throw dtp::Error: a rank below 1, or above min(out, in) of a "
             "matrix, has no rank-r factorization";
    });
  }
}

// A zero gradient gives P = 0: its columns have no direction, and
// Gram-Schmidt must leave them 0 rather than divide by a zero norm.
TEST(Puzzle10_4_power_sgd, AZeroGradientStaysZeroAndFinite) {
  run_and_report("10.4 PowerSgd on all-zero gradients", 2, [&](Comm& comm) {
    Trainer trainer(optimizer_config(1, comm.device()), comm.rank(), comm.size());
    GPT& model = trainer.model();
    PowerSgd psgd(comm, model, 2, kQSeed);
    model.zero_grad();
    psgd.all_reduce_gradients();
    for (Unit* unit : model.units()) {
      const std::vector<double> g = unit->grads().to_vector();
      for (std::size_t i = 0; i < g.size(); ++i)
        if (g[i] != 0)
          return "rank " + std::to_string(comm.rank()) + ", unit '" + unit->name() +
                 "' gradient element " + std::to_string(i) + ": expected 0, got " +
                 std::to_string(g[i]) +
                 (std::isnan(g[i]) ? " (NaN: a column of P with norm 0 was divided by its norm; "
                                     "leave it 0)"
                                   : "");
    }
    return std::string();
  });
}

}  // namespace dtp::testing::ch10_power_sgd
