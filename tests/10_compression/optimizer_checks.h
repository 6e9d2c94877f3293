// What the checkers of 1-bit Adam (10.3) and PowerSGD (10.4) share: the
// training setup, every rank's local gradients gathered for the checker's
// own replay, rounding as the model's dtype stores a value, and element
// comparisons whose messages name the rank, step, unit, parameter and
// element.
//
// Each rank trains its model on its own device (comm.device()) in
// checker_dtype(): f64 on the CPU, f32 under DTP_CHECK_DTYPE=f32 and on a
// GPU. Each checker replays the puzzle's arithmetic itself from the
// gradients every rank's backward produced (read with to_vector(), wherever
// they live), so the optimizer's state can be compared step by step; the
// puzzles compute on the host on every device, so the same comparisons hold
// on a GPU. Communication counts and bytes, and the replicas' agreement,
// are exact in both dtypes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "10_compression/compression.h"
#include "support/checker_precision.h"
#include "support/training.h"

namespace dtp::testing::ch10_optimizers {

// Per unit, flat: a model's parameters, gradients or optimizer state.
using UnitValues = std::vector<std::vector<double>>;

// tiny_config on @p device (the rank's comm.device()) in checker_dtype():
// 2 blocks, width 16, 12 sequences of 8 tokens per step, SGD (PowerSGD's
// checks keep it; 1-bit Adam replaces the optimizer).
inline TrainConfig optimizer_config(std::int64_t steps, Device device) {
  return on_device(tiny_config(12, steps), device);
}

// The worlds of @p wanted that the backend can run (NCCL: one GPU per rank;
// the nccl flavour asks for 2 ranks at least, so one always fits).
inline std::vector<int> fitting_worlds(std::initializer_list<int> wanted) {
  std::vector<int> worlds;
  for (int world : wanted)
    if (world_fits(world)) worlds.push_back(world);
  return worlds;
}

// @p x as the model's @p dtype stores it (double to float rounds to nearest).
inline double round_to(DType dtype, double x) {
  return dtype == DType::f32 ? static_cast<double>(static_cast<float>(x)) : x;
}

// Every rank's @p mine (per unit, the same sizes on every rank), indexed
// [rank][unit][element]: one all_gather, in the model's dtype, so no value
// changes on the way.
inline std::vector<UnitValues> gather_from_ranks(Comm& comm, const UnitValues& mine, DType dtype) {
  std::vector<double> flat;
  for (const std::vector<double>& values : mine)
    flat.insert(flat.end(), values.begin(), values.end());
  const Tensor shard = Tensor::from_values(flat, dtype, comm.device());
  Tensor all = Tensor::empty(Shape{shard.numel() * comm.size()}, dtype, comm.device());
  comm.all_gather(shard, all);
  const std::vector<double> values = all.to_vector();
  std::vector<UnitValues> ranks(static_cast<std::size_t>(comm.size()), mine);
  std::size_t at = 0;
  for (UnitValues& rank : ranks)
    for (std::vector<double>& unit : rank)
      for (double& x : unit) x = values[at++];
  return ranks;
}

// The largest |x| of @p values (0 for none): the scale a tolerance is stated against.
inline double largest_magnitude(const std::vector<double>& values) {
  double largest = 0;
  for (double x : values) largest = std::max(largest, std::fabs(x));
  return largest;
}

// The first element where @p got is not within @p allowed[i] of
// @p expected (-1: none), and how many are not.
struct Mismatch {
  std::int64_t first = -1;
  std::int64_t count = 0;
  explicit operator bool() const { return first >= 0; }
};

inline Mismatch find_mismatch(const std::vector<double>& expected, const std::vector<double>& got,
                              const std::vector<double>& allowed) {
  Mismatch m;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const bool ok = i < got.size() && std::fabs(expected[i] - got[i]) <= allowed[i];
    if (ok) continue;
    if (m.first < 0) m.first = static_cast<std::int64_t>(i);
    ++m.count;
  }
  return m;
}

// Bitwise: every element exactly equal.
inline Mismatch find_mismatch(const std::vector<double>& expected, const std::vector<double>& got) {
  return find_mismatch(expected, got, std::vector<double>(expected.size(), 0.0));
}

// "unit 'block.0' 'attn.q.weight' element 5": where flat element @p flat of
// unit @p u sits.
inline std::string element_name(GPT& model, std::size_t u, std::int64_t flat) {
  const Unit& unit = *model.units()[u];
  return "unit '" + unit.name() + "' " + locate(unit, flat);
}

// "rank 1, step 4": how every message of these checkers starts.
inline std::string rank_step(int rank, std::int64_t step) {
  return "rank " + std::to_string(rank) + ", step " + std::to_string(step);
}

// "expected 0.25, got 0.5 (12 of 640 elements differ)", with all 17
// digits where 12 would show two different values alike.
inline std::string expected_got(double expected, double got, const Mismatch& m, std::size_t of) {
  std::string e = number(expected), g = number(got);
  if (e == g) {
    char digits[2][40];
    std::snprintf(digits[0], sizeof digits[0], "%.17g", expected);
    std::snprintf(digits[1], sizeof digits[1], "%.17g", got);
    e = digits[0];
    g = digits[1];
  }
  return "expected " + e + ", got " + g + " (" + std::to_string(m.count) + " of " +
         std::to_string(of) + " elements differ)";
}

// Two failure messages as one ("" when both are empty).
inline std::string joined(const std::string& first, const std::string& second) {
  if (first.empty() || second.empty()) return first + second;
  return first + "\n    " + second;
}

}  // namespace dtp::testing::ch10_optimizers
