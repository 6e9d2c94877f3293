// What the chapter 03 checkers share: plugging a stage into the trainer, the
// full parameters a stage's shards make up, and the memory and communication
// formulas of chapters/03_zero_fsdp/README.md, computed here from the shard
// lengths (never read from the code under test).
//
// Where they run: models and data on the rank's device (comm.device(); the
// single-device reference on checker_device()) in checker_dtype(): f64 on
// the CPU, f32 under DTP_CHECK_DTYPE=f32 and on a GPU. Communication counts,
// bytes and memory (elements x the dtype's element size), and the replicas'
// bitwise agreement are exact in both dtypes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "03_zero_fsdp/zero.h"
#include "support/checker_precision.h"
#include "support/training.h"

namespace dtp::testing::ch03 {

using dtp::ch03::ShardedOptimizer;

enum class Stage { zero1, zero2, zero3, prefetch, offload };

inline std::string stage_name(Stage stage) {
  switch (stage) {
    case Stage::zero1:
      return "3.1 Zero1";
    case Stage::zero2:
      return "3.2 Zero2";
    case Stage::zero3:
      return "3.3 Zero3";
    case Stage::prefetch:
      return "3.4 Zero3Prefetch";
    case Stage::offload:
      return "3.5 Zero1Offload";
  }
  return "?";
}

inline std::unique_ptr<ShardedOptimizer> make_stage(Stage stage, Comm& comm, GPT& model,
                                                    const TrainConfig& config) {
  switch (stage) {
    case Stage::zero1:
      return std::make_unique<dtp::ch03::Zero1>(comm, model, config);
    case Stage::zero2:
      return std::make_unique<dtp::ch03::Zero2>(comm, model, config);
    case Stage::zero3:
      return std::make_unique<dtp::ch03::Zero3>(comm, model, config);
    case Stage::prefetch:
      return std::make_unique<dtp::ch03::Zero3Prefetch>(comm, model, config);
    case Stage::offload:
      return std::make_unique<dtp::ch03::Zero1Offload>(comm, model, config);
  }
  return nullptr;
}

// A rank's trainer with the stage plugged in as zero.h shows.
struct StagedTrainer {
  std::unique_ptr<Trainer> trainer;
  ShardedOptimizer* stage = nullptr;  // owned by the trainer
};

inline StagedTrainer plug(Stage stage, Comm& comm, const TrainConfig& config) {
  StagedTrainer run;
  run.trainer = std::make_unique<Trainer>(config, comm.rank(), comm.size());
  std::unique_ptr<ShardedOptimizer> zero = make_stage(stage, comm, run.trainer->model(), config);
  run.stage = zero.get();
  run.trainer->on_after_backward([raw = run.stage] { raw->finish_backward(); });
  run.trainer->set_optimizer(std::move(zero));
  return run;
}

// This rank's shard of every unit.
inline std::vector<ChunkRange> shard_ranges(GPT& model, int world, int rank) {
  std::vector<ChunkRange> ranges;
  for (Unit* unit : model.units()) ranges.push_back(chunk_range(unit->numel(), world, rank));
  return ranges;
}

// The full parameters of every unit as every rank's parameter shards make
// them up (the checker's own all-gather; call it outside counted steps).
inline UnitGradients gathered_parameters(Comm& comm, GPT& model, ShardedOptimizer& stage) {
  UnitGradients full;
  for (Unit* unit : model.units()) {
    Tensor shard = stage.parameter_shard(unit->index()).to(comm.device());
    Tensor gathered = Tensor::empty(Shape{unit->numel()}, shard.dtype(), comm.device());
    comm.all_gather(shard, gathered);
    full.push_back(gathered.to_vector());
  }
  return full;
}

// "" when this rank's flat values equal every other rank's, bit for bit.
inline std::string bitwise_across_ranks(Comm& comm, const std::vector<double>& mine,
                                        const std::string& what, std::int64_t step) {
  const auto n = static_cast<std::int64_t>(mine.size());
  Tensor local = Tensor::from_values(mine, DType::f64).to(comm.device());
  Tensor all = Tensor::empty(Shape{n * comm.size()}, DType::f64, comm.device());
  comm.all_gather(local, all);
  const std::vector<double> everyone = all.to_vector();
  for (int r = 0; r < comm.size(); ++r) {
    for (std::int64_t i = 0; i < n; ++i) {
      const double theirs = everyone[static_cast<std::size_t>(r * n + i)];
      if (std::memcmp(&theirs, &mine[static_cast<std::size_t>(i)], sizeof(double)) != 0)
        return "rank " + std::to_string(comm.rank()) + ", after step " + std::to_string(step) +
               ": " + what + " element " + std::to_string(i) + " is " +
               number(mine[static_cast<std::size_t>(i)]) + " here but " + number(theirs) +
               " on rank " + std::to_string(r) +
               ": the replicas drifted apart (every rank must apply the same update to the same "
               "shard)";
    }
  }
  return "";
}

inline std::vector<double> flatten(const UnitGradients& per_unit) {
  std::vector<double> flat;
  for (const auto& unit : per_unit) flat.insert(flat.end(), unit.begin(), unit.end());
  return flat;
}

// --- the formulas of the lesson, from shard lengths ------------------------------

struct ShardSizes {
  std::int64_t total = 0;         // Psi: elements of the whole model
  std::int64_t shards = 0;        // sum over units of this rank's shard length
  std::int64_t largest_unit = 0;  // elements of the largest unit
  std::int64_t second_unit = 0;   // elements of the second largest unit
};

inline ShardSizes shard_sizes(GPT& model, int world, int rank) {
  ShardSizes sizes;
  std::vector<std::int64_t> units;
  for (Unit* unit : model.units()) {
    sizes.total += unit->numel();
    sizes.shards += chunk_range(unit->numel(), world, rank).length;
    units.push_back(unit->numel());
  }
  std::sort(units.rbegin(), units.rend());
  sizes.largest_unit = units.empty() ? 0 : units[0];
  sizes.second_unit = units.size() < 2 ? 0 : units[1];
  return sizes;
}

// Optimizer states per parameter element: AdamW keeps m and v, SGD momentum.
inline int optimizer_states(const TrainConfig& config) {
  if (config.optimizer == "adamw") return 2;
  return config.momentum != 0 ? 1 : 0;
}

// A config for memory and communication checks: tiny_config with AdamW (two
// states, so an optimizer over the whole model shows as 2 Psi).
inline TrainConfig adamw_config(std::int64_t global_batch = 12, std::int64_t steps = 3) {
  TrainConfig config = tiny_config(global_batch, steps);
  config.optimizer = "adamw";
  config.lr = 0.01;
  config.weight_decay = 0.1;
  return config;
}

}  // namespace dtp::testing::ch03
