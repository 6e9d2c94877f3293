// Checks of resumed runs: a run trained in two slices (--stop-after and
// --save, then --resume) against the run that was never stopped, bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <functional>

#include "dtp/checkpoint.h"
#include "dtp/train_run.h"
#include "dtp/trainer.h"
#include "support/harness.h"
#include "support/training.h"

namespace dtp::testing {

/// How a check trains a config: train() on one device by default; a
/// strategy's checks pass `[&](const TrainConfig& c) { return drivers::run_strategy(c, strategy);
/// }`.
using RunFn = std::function<TrainResult(const TrainConfig&)>;

/// train() on one device, as a RunFn.
inline TrainResult train_one(const TrainConfig& config) { return train(config); }

/// Expects every tensor of checkpoint @p got to equal @p expected's: same
/// names in the same order, same bytes. @p where starts each message.
inline void expect_same_checkpoint_tensors(const Checkpoint& expected, const Checkpoint& got,
                                           const std::string& where) {
  ASSERT_EQ(got.tensors.size(), expected.tensors.size()) << where << ": tensors in the checkpoint";
  for (std::size_t i = 0; i < got.tensors.size(); ++i) {
    const NamedTensor& e = expected.tensors[i];
    const NamedTensor& g = got.tensors[i];
    ASSERT_EQ(g.name, e.name) << where << ": tensor " << i;
    ASSERT_EQ(g.tensor.nbytes(), e.tensor.nbytes()) << where << ": " << e.name;
    EXPECT_EQ(std::memcmp(g.tensor.raw(), e.tensor.raw(), e.tensor.nbytes()), 0)
        << where << ": " << e.name << " differs from the run that was never stopped";
  }
}

/// Trains @p config with @p run, saving into @p folder, and returns the
/// checkpoint it wrote.
inline Checkpoint saved_checkpoint(TrainConfig config, const TempFolder& folder,
                                   const RunFn& run = train_one) {
  config.save_path = folder.file(config.strategy + ".ckpt");
  run(config);
  return read_checkpoint(config.save_path);
}

/// Expects checkpoint @p got, which rank 0 gathered from ranks that held
/// shards or slices, to be the file @p expected (a single-device run of the
/// same model) is: the same names in the same order, the same shapes, and
/// values equal to rounding (close_enough: the ranks summed their gradients
/// in another order). @p hint says what a wrong value would mean.
inline void expect_single_device_layout(const Checkpoint& expected, const Checkpoint& got,
                                        const std::string& where, const std::string& hint) {
  ASSERT_EQ(got.tensors.size(), expected.tensors.size()) << where << ": tensors in the checkpoint";
  for (std::size_t i = 0; i < got.tensors.size(); ++i) {
    const NamedTensor& e = expected.tensors[i];
    const NamedTensor& g = got.tensors[i];
    ASSERT_EQ(g.name, e.name) << where << ": tensor " << i;
    ASSERT_EQ(g.tensor.shape(), e.tensor.shape()) << where << ": " << e.name << "'s shape";
    ASSERT_EQ(g.tensor.dtype(), e.tensor.dtype()) << where << ": " << e.name << "'s dtype";
    const std::vector<double> want = e.tensor.to_vector();
    const std::vector<double> have = g.tensor.to_vector();
    for (std::size_t k = 0; k < want.size(); ++k) {
      if (close_enough(want[k], have[k])) continue;
      ADD_FAILURE() << where << ": " << e.name << " element " << k << ": the single-device run has "
                    << want[k] << ", the gathered checkpoint " << have[k] << " (" << hint << ")";
      break;
    }
  }
}

/// Trains @p config with @p run straight, and in two slices: steps 1 to @p split saved to a file of
/// @p folder, then resumed to the end. Expects the slices' step records (step, loss, loss scale,
/// skipped) and every tensor of both runs' final checkpoints to equal the
/// straight run's, bit for bit. Returns the straight run's records.
inline std::vector<StepRecord> expect_slices_equal_straight_run(const TrainConfig& config,
                                                                std::int64_t split,
                                                                const TempFolder& folder,
                                                                const std::string& where,
                                                                const RunFn& run = train_one) {
  TrainConfig whole = config;
  whole.save_path = folder.file("whole.ckpt");
  const std::vector<StepRecord> straight = run(whole).steps;
  TrainConfig first = config;
  first.stop_after = split;
  first.save_path = folder.file("slice.ckpt");
  std::vector<StepRecord> sliced = run(first).steps;
  EXPECT_EQ(static_cast<std::int64_t>(sliced.size()), split) << where << ": --stop-after " << split;
  EXPECT_EQ(read_checkpoint(first.save_path).step, split)
      << where << ": the first slice's checkpoint's step";
  TrainConfig second = config;
  second.resume_path = first.save_path;
  second.save_path = folder.file("resumed.ckpt");
  for (const StepRecord& r : run(second).steps) sliced.push_back(r);
  if (sliced.size() != straight.size()) {
    ADD_FAILURE() << where << ": " << split << " steps, saved, then resumed trained "
                  << sliced.size() << " steps in all; the straight run trained " << straight.size();
    return straight;
  }
  for (std::size_t s = 0; s < straight.size(); ++s) {
    const std::string step =
        where + ", split after step " + std::to_string(split) + ": step " + std::to_string(s + 1);
    EXPECT_EQ(sliced[s].step, straight[s].step) << step;
    EXPECT_EQ(sliced[s].loss, straight[s].loss) << step << "'s loss";
    EXPECT_EQ(sliced[s].loss_scale, straight[s].loss_scale) << step << "'s loss scale";
    EXPECT_EQ(sliced[s].skipped, straight[s].skipped) << step << " skipped or not";
  }
  expect_same_checkpoint_tensors(
      read_checkpoint(whole.save_path), read_checkpoint(second.save_path),
      where + ", split after step " + std::to_string(split) + ", the final checkpoint");
  return straight;
}

}  // namespace dtp::testing
