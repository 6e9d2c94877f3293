// What the chapter 04 checkers share: a small model whose every dimension
// splits over 1, 2, 3 and 4 ranks, the slices a TP rank should hold (worked
// out here from the shapes, never read from the code under test), a
// comparison that decodes a wrong value into the mistake that makes it, and
// the communication a call made.
//
// Where they run: on the rank's device (comm.device()) in checker_dtype()
// (support/checker_precision.h): f64 on the CPU, f32 under
// DTP_CHECK_DTYPE=f32 and on a GPU. The expected values come from the serial
// layers in the same dtype, so in f32 both sides round, in another order;
// each check's tolerance below states both numbers and where the f32 one
// comes from. Communication bytes and memory bounds count elements of the
// dtype's size; replicas must agree bit for bit in both dtypes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "04_tensor_parallel/tensor_parallel.h"
#include "support/checker_precision.h"
#include "support/training.h"

namespace dtp::testing::ch04 {

using namespace dtp::ch04;

// B = 2 sequences of T = 6 tokens: N = 12 tokens split over 1, 2, 3 or 4
// ranks; C = 24 with 12 heads of 2; vocabulary 24; MLP width 96.
inline constexpr std::int64_t kB = 2, kT = 6, kN = kB * kT, kC = 24, kHeads = 12, kVocab = 24;

// The tensor-parallel sizes every layer checker sweeps.
inline std::vector<int> tp_sizes() { return {1, 2, 3, 4}; }

// The layers' model on @p on (a rank's comm.device()) in checker_dtype(on).
inline GPTConfig layer_config(Device on, AttentionKind kind = AttentionKind::naive) {
  GPTConfig c;
  c.vocab_size = static_cast<int>(kVocab);
  c.context = static_cast<int>(kT);
  c.d_model = static_cast<int>(kC);
  c.heads = static_cast<int>(kHeads);
  c.layers = 1;
  c.dtype = checker_dtype(on);
  c.device = on;
  c.init_std = 0.3;  // larger than training's, so that every path matters in the output
  c.attention = kind;
  c.seed = 404;
  return c;
}

// Uniform values in [low, high) on @p on in checker_dtype(on).
inline Tensor random_tensor(const Shape& shape, std::uint64_t seed, Device on, double low = -1.0,
                            double high = 1.0) {
  return Tensor::random_uniform(shape, seed, low, high, checker_dtype(on), on);
}

// A tensor of host values on @p on in checker_dtype(on), shaped.
inline Tensor tensor_of(const std::vector<double>& v, const Shape& shape, Device on) {
  return Tensor::from_values(v, checker_dtype(on), on).view(shape);
}

// The bytes of one element of checker_dtype(on): what a collective moves per value.
inline std::int64_t element_bytes(Device on) {
  return static_cast<std::int64_t>(dtype_size(checker_dtype(on)));
}

// Rows [r0, r0 + n) of a row-major matrix with `row_length` columns (or of a vector: row_length 1).
inline std::vector<double> rows_of(const std::vector<double>& full, std::int64_t row_length,
                                   std::int64_t r0, std::int64_t n) {
  return {full.begin() + r0 * row_length, full.begin() + (r0 + n) * row_length};
}

// Columns [c0, c0 + n) of a row-major [R, K] matrix.
inline std::vector<double> columns_of(const std::vector<double>& full, std::int64_t K,
                                      std::int64_t c0, std::int64_t n) {
  std::vector<double> out;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(full.size()) / K; ++i)
    out.insert(out.end(), full.begin() + i * K + c0, full.begin() + i * K + c0 + n);
  return out;
}

// Rank r's equal part of `size` over t ranks.
inline std::int64_t part(std::int64_t size, int t) { return size / t; }

// @p row repeated for each of the N = B*T tokens: a bias as the output sees it.
inline std::vector<double> every_token(const std::vector<double>& row) {
  std::vector<double> out;
  for (std::int64_t i = 0; i < kN; ++i) out.insert(out.end(), row.begin(), row.end());
  return out;
}

// This rank's token shard of a [N, K] activation: rows chunk r.
inline std::vector<double> my_tokens(const std::vector<double>& full, std::int64_t K, int t,
                                     int r) {
  const std::int64_t rows = static_cast<std::int64_t>(full.size()) / K / t;
  return rows_of(full, K, r * rows, rows);
}

// --- Tolerances ---------------------------------------------------------------------
// In f64 every check keeps training.h's kAbsTolerance + kRelTolerance |expected|
// (1e-10 + 1e-8 |expected|). In f32 each is a count of roundings (a sum of n
// terms added in another order moves by about n x 2^-24 of its terms'
// magnitude), checked against the worst difference measured on the
// reference for t = 1 to 4, with and without sequence parallelism. The
// mistakes the messages decode (a sum left unreduced, a bias added t times,
// a factor t or 1/N) move the values by orders of magnitude more.

// 4.1-4.4: the longest chain is the MLP's backward: proj's 96 and fc's 24
// terms each way, GELU and the t-way reduction, ~150 roundings x 6e-8 = 1e-5
// relative, and 1e-5 x summands below 2 = 2e-5 absolute where a sum cancels.
// Measured at most 1.9e-6 (4.1's dx, of 5.6).
inline Closeness layer_tolerance(DType dtype) {
  return tolerance(dtype, {kAbsTolerance, kRelTolerance}, {2e-5, 1e-5});
}

// 4.5: an output row is one table row plus the position (one rounding); a
// gradient row adds at most the N = 12 tokens' dx rows: 12 x 6e-8 = 1e-6
// relative, x values below 2 = 2e-6 absolute. Measured 0 (the same additions
// in the same order).
inline Closeness embedding_tolerance(DType dtype) {
  return tolerance(dtype, {kAbsTolerance, kRelTolerance}, {2e-6, 1e-6});
}

// 4.6, for logits up to @p largest_logit in magnitude: a row's loss is
// log(sum of exp) + max - target logit; the serial loss forms m + log(s) in
// f32, so it rounds at the logits' magnitude M = largest_logit + ln V. About
// 8 roundings at M (the log-sum-exp, the difference and the row loss, on
// both sides) plus 30 in the sum of 24 exponentials and its t-way
// all-reduce: (8 M + 30) x 2^-24 absolute. Logits below 4: 5e-6, measured
// at most 2.3e-8 (12 rows) and 2.7e-7 (one row, its f32 loss's half ulp);
// logits near 1000: 4.8e-4, measured 8.2e-6.
inline Closeness loss_tolerance(DType dtype, double largest_logit) {
  const double magnitude = largest_logit + std::log(static_cast<double>(kVocab));
  return tolerance(dtype, {kAbsTolerance, kRelTolerance}, {(8 * magnitude + 30) * 0x1p-24, 0});
}

// 4.6's logits gradient, loss_scale / N x (softmax - onehot), each element
// at most @p largest_gradient = loss_scale / N: the softmax carries the same
// (8 M + 30) x 2^-24 relative error as the loss (exp of an argument rounded
// at M), so that much of the largest gradient, absolute. Logits below 4:
// 1.3e-7 of 0.025, measured 2.8e-9; logits near 1000: 1.2e-5, measured
// 5.5e-7.
inline Closeness loss_gradient_tolerance(DType dtype, double largest_logit,
                                         double largest_gradient) {
  const double magnitude = largest_logit + std::log(static_cast<double>(kVocab));
  return tolerance(dtype, {kAbsTolerance, kRelTolerance},
                   {(8 * magnitude + 30) * 0x1p-24 * largest_gradient, 0});
}

// 4.7: two LayerNorms (statistics over 24 features), attention and the MLP
// as in layer_tolerance, forward and backward, and parameter gradients that
// add up 12 tokens: ~300 roundings x 6e-8 = 2e-5 relative; 2e-5 x summands
// below 5 = 1e-4 absolute. Measured at most 7.6e-6 (a weight gradient of
// 14.7) and 4.9e-6 (dx, of 1.4).
inline Closeness block_tolerance(DType dtype) {
  return tolerance(dtype, {kAbsTolerance, kRelTolerance}, {1e-4, 2e-5});
}

// A wrong value's likely cause: "got" matches `values` (within tolerance).
struct Mistake {
  std::string what;
  std::vector<double> values;
};

inline bool all_close(const std::vector<double>& a, const std::vector<double>& b,
                      const Closeness& within) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!within.holds(a[i], b[i])) return false;
  return true;
}

// Adds element-wise.
inline std::vector<double> plus(std::vector<double> a, const std::vector<double>& b,
                                double scale = 1.0) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += scale * b[i];
  return a;
}
inline std::vector<double> times(std::vector<double> a, double factor) {
  for (double& v : a) v *= factor;
  return a;
}

// The one factor f with got = f x expected in every element (within
// @p within), or 0 when there is none: a wrong scale, decoded.
inline double uniform_ratio(const std::vector<double>& expected, const std::vector<double>& got,
                            const Closeness& within) {
  if (expected.size() != got.size()) return 0;
  double ge = 0, ee = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    ge += got[i] * expected[i];
    ee += expected[i] * expected[i];
  }
  if (ee == 0 || !std::isfinite(ge)) return 0;
  const double f = ge / ee;
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (!within.holds(f * expected[i], got[i])) return 0;
  return f;
}

// A ratio as the checkers print it: "12.00x".
inline std::string times_text(double ratio) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2fx", ratio);
  return text;
}

// "" when got matches expected within @p within; else names the rank, what,
// the first wrong element, how many are wrong and, when got is exactly one
// of the known mistakes, says which.
inline std::string check_values(const std::string& what, int rank,
                                const std::vector<double>& expected, const std::vector<double>& got,
                                const Closeness& within,
                                const std::vector<Mistake>& mistakes = {}) {
  if (got.size() != expected.size())
    return "\n    rank " + std::to_string(rank) + ": " + what + " has " +
           std::to_string(got.size()) + " elements, expected " + std::to_string(expected.size());
  std::int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < expected.size(); ++i)
    if (!within.holds(expected[i], got[i])) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++wrong;
    }
  if (wrong == 0) return "";
  const auto f = static_cast<std::size_t>(first);
  std::string message = "\n    rank " + std::to_string(rank) + ": " + what + " element " +
                        std::to_string(first) + ": expected " + number(expected[f]) + ", got " +
                        number(got[f]) + " (" + std::to_string(wrong) + " of " +
                        std::to_string(expected.size()) + " elements wrong)";
  for (const Mistake& m : mistakes)
    if (all_close(m.values, got, within)) return message + "\n      = " + m.what;
  if (all_close(times(expected, 0), got, within))
    return message + "\n      = all zeros: never written";
  return message;
}

// A provided constructor's refusal of a size that does not split over 4
// ranks: a dtp::Error whose message holds `expected` (it names the size).
inline void expect_refusal_on_4_ranks(const std::function<void(Comm&)>& build,
                                      const std::string& expected) {
  if (!world_fits(4)) return;
  const std::string error = error_of([&] { run_ranks(4, build); });
  EXPECT_NE(error.find(expected), std::string::npos)
      << "expected a dtp::Error saying \"" << expected << "\"; got: " << error;
}

// Collective calls by kind and bytes between two snapshots of one Comm.
struct CommUse {
  std::map<std::string, std::int64_t> calls;
  std::int64_t bytes = 0;
  std::int64_t count(const std::string& kind) const {
    auto it = calls.find(kind);
    return it == calls.end() ? 0 : it->second;
  }
  std::string str() const {
    std::string s;
    for (const auto& [kind, n] : calls)
      if (n > 0) s += (s.empty() ? "" : ", ") + std::to_string(n) + " " + kind;
    return (s.empty() ? std::string("no collectives") : s) + " (" + std::to_string(bytes) +
           " bytes)";
  }
};

inline CommUse comm_use(const CommStats& before, const CommStats& after) {
  CommUse use;
  for (const auto& [kind, n] : after.collective_calls) {
    auto it = before.collective_calls.find(kind);
    const std::int64_t delta = n - (it == before.collective_calls.end() ? 0 : it->second);
    if (delta != 0) use.calls[kind] = delta;
  }
  use.bytes = after.collective_bytes - before.collective_bytes;
  return use;
}

// "" when `got` is exactly `expected_calls` (kind -> count) with `expected_bytes`.
inline std::string check_comm(const std::string& when, int rank, const CommUse& got,
                              const std::map<std::string, std::int64_t>& expected_calls,
                              std::int64_t expected_bytes, const std::string& why) {
  bool ok = got.bytes == expected_bytes;
  std::map<std::string, std::int64_t> want = expected_calls;
  for (const auto& [kind, n] : got.calls) ok = ok && want[kind] == n;
  for (const auto& [kind, n] : want) ok = ok && got.count(kind) == n;
  if (ok) return "";
  CommUse expected;
  expected.calls = expected_calls;
  expected.bytes = expected_bytes;
  return "\n    rank " + std::to_string(rank) + ": " + when + " made " + got.str() + ", expected " +
         expected.str() + ": " + why;
}

// Host values of a tensor.
inline std::vector<double> values(const Tensor& t) { return t.to_vector(); }

// Fresh shard tensors on @p on for a Linear whose weight is [out, in] (bias
// [out] when has_bias).
inline void give_linear(Linear& layer, const std::vector<double>& weight,
                        const std::vector<double>& bias, Device on) {
  const Shape shape{layer.out_features, layer.in_features};
  layer.weight = tensor_of(weight, shape, on);
  layer.weight_grad = Tensor::zeros(shape, checker_dtype(on), on);
  if (layer.has_bias) {
    layer.bias = tensor_of(bias, Shape{layer.out_features}, on);
    layer.bias_grad = Tensor::zeros(Shape{layer.out_features}, checker_dtype(on), on);
  }
}

// Loads rank r's output rows of `full` into a column-parallel layer.
inline void load_rows(ColumnParallelLinear& layer, const Linear& full, int t, int r) {
  const std::int64_t n = part(full.out_features, t);
  give_linear(layer.local, rows_of(values(full.weight), full.in_features, r * n, n),
              full.has_bias ? rows_of(values(full.bias), 1, r * n, n) : std::vector<double>{},
              full.weight.device());
}

// Loads rank r's input columns of `full` (and its whole bias) into a row-parallel layer.
inline void load_columns(RowParallelLinear& layer, const Linear& full, int t, int r) {
  const std::int64_t n = part(full.in_features, t);
  const Device on = full.weight.device();
  give_linear(layer.local, columns_of(values(full.weight), full.in_features, r * n, n), {}, on);
  layer.bias = tensor_of(values(full.bias), Shape{full.out_features}, on);
  layer.bias_grad = Tensor::zeros(Shape{full.out_features}, checker_dtype(on), on);
}

// The serial reference's weight gradient rows / columns of rank r.
inline std::vector<double> grad_rows(const Linear& full, int t, int r) {
  const std::int64_t n = part(full.out_features, t);
  return rows_of(values(full.weight_grad), full.in_features, r * n, n);
}
inline std::vector<double> grad_columns(const Linear& full, int t, int r) {
  const std::int64_t n = part(full.in_features, t);
  return columns_of(values(full.weight_grad), full.in_features, r * n, n);
}

// Column sums of a row-major [rows, K] matrix: a bias gradient.
inline std::vector<double> column_sums(const std::vector<double>& m, std::int64_t K) {
  std::vector<double> sums(static_cast<std::size_t>(K), 0.0);
  for (std::size_t i = 0; i < m.size(); ++i) sums[i % static_cast<std::size_t>(K)] += m[i];
  return sums;
}

// Which slice of a serial parameter of shape `full` a TP rank holds, worked
// out from the shard's shape alone: the same shape is a replica, fewer rows
// is a row slice (column-parallel weights and biases, the vocabulary), fewer
// columns a column slice (row-parallel weights).
inline std::vector<double> expected_slice(const std::vector<double>& full, const Shape& full_shape,
                                          const Shape& shard_shape, int t, int r) {
  if (full_shape == shard_shape) return full;
  const std::int64_t row_length = full_shape.ndim() == 2 ? full_shape[1] : 1;
  if (shard_shape[0] * t == full_shape[0])
    return rows_of(full, row_length, r * shard_shape[0], shard_shape[0]);
  return columns_of(full, row_length, r * shard_shape[1], shard_shape[1]);
}

// Compares every parameter's gradient (or value) of a TP unit with its slice
// of the serial unit's, within @p within. `what` is "gradient" or "value".
inline std::string check_unit_slices(const std::string& what, int rank, int t, const Unit& serial,
                                     const Unit& tp, bool gradients, const Closeness& within,
                                     const std::string& hint_for_replicated = "") {
  std::string m;
  for (const ParamView& p : tp.parameters()) {
    const ParamView& f = serial.parameter(p.name);
    const std::vector<double> expected =
        expected_slice(values(gradients ? f.grad : f.value), f.shape, p.shape, t, rank);
    const std::vector<double> got = values(gradients ? p.grad : p.value);
    std::vector<Mistake> mistakes;
    for (int k : {2, 3, 4, 8})
      if (k <= 2 * t)
        mistakes.push_back(
            {std::to_string(k) + ".00x the single-device " + what, times(expected, k)});
    mistakes.push_back({"half the single-device " + what, times(expected, 0.5)});
    std::string one = check_values("unit '" + tp.name() + "' " + what + " of '" + p.name + "'",
                                   rank, expected, got, within, mistakes);
    const double ratio = uniform_ratio(expected, got, within);
    if (!one.empty() && one.find("\n      = ") == std::string::npos && ratio != 0)
      one += "\n      = " + times_text(ratio) + " the single-device " + what + " in every element";
    if (!one.empty() && p.shape == f.shape && !hint_for_replicated.empty())
      one += "\n      " + hint_for_replicated;
    m += one;
  }
  return m;
}

}  // namespace dtp::testing::ch04

namespace dtp::testing::ch04 {

// Gives every parameter of a serial unit a random value, biases included (a
// model fresh from initialization has zero biases, which would hide a bias
// added t times): LayerNorm gains in [0.5, 1.5], the rest in [-0.5, 0.5].
inline void randomize(Unit& unit, std::uint64_t seed) {
  for (ParamView& p : unit.parameters()) {
    const bool gain = p.name.rfind("ln", 0) == 0 && p.name.size() > 7 &&
                      p.name.compare(p.name.size() - 7, 7, ".weight") == 0;
    p.value.copy_from(
        random_tensor(p.shape, seed++, p.value.device(), gain ? 0.5 : -0.5, gain ? 1.5 : 0.5));
  }
}

}  // namespace dtp::testing::ch04
