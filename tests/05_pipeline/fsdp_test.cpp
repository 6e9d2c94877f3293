// Puzzle 5.8: pipeline x FSDP on world 4 = 2 stages x 2 shards (and 2 x 1,
// 1 x 2). Each rank holds 1/d of its stage's units; the step's gradient
// shards equal the same slices of the single-device mean gradient, the
// collectives are the ones the lesson counts, the parameters peak at the
// shards plus one whole unit, and K steps of training equal single-device
// training.
#include <algorithm>

#include "drivers/05_pipeline/pp_strategy.h"
#include "pipeline_checks.h"

namespace dtp::testing::ch05 {
namespace {

struct Layout {
  int pp, dp;
  ScheduleKind kind;
};

std::string describe(const Layout& l) {
  return "pp " + std::to_string(l.pp) + " x dp " + std::to_string(l.dp) + " with FSDP, " +
         schedule_kind_name(l.kind);
}

PipelineOptions fsdp_options(const Layout& l) {
  PipelineOptions options;
  options.pp = l.pp;
  options.dp = l.dp;
  options.microbatches = 2 * l.pp;
  options.schedule = l.kind;
  options.fsdp = true;
  return options;
}

// The last micro-batch's share of the step's gradient (its gradient scaled
// by 1/m), averaged over the d replicas: what a shard holds when each
// reduce-scatter result is copied into it instead of added, so that the
// last micro-batch overwrites the others.
UnitGradients last_microbatch_share(const TrainConfig& config, int dp, int m) {
  UnitGradients mean;
  for (int r = 0; r < dp; ++r) {
    Trainer trainer(config, r, dp);  // its sampler gives replica r's slice of the batch
    GPT& model = trainer.model();
    const MicroBatch last =
        split_microbatches(trainer.sampler().batch(0, config.model.device), m).back();
    model.zero_grad();
    model.forward(last.inputs, last.targets);
    model.backward(1.0 / m);
    const UnitGradients grads = gradients_of(model);
    mean.resize(grads.size());
    for (std::size_t u = 0; u < grads.size(); ++u) {
      mean[u].resize(grads[u].size(), 0.0);
      for (std::size_t i = 0; i < grads[u].size(); ++i) mean[u][i] += grads[u][i] / dp;
    }
  }
  return mean;
}

// True when `got` equals `want` in each of the n elements, within
// first_step_tolerance() of @p dtype (in f32 the reduce-scatter adds the d
// replicas' sums of at most 64 tokens each: 128 x 2^-24 x 0.31 = 2.4e-6 <
// 4e-6; measured at most 1.2e-7, 1.3% of the tolerance).
bool equal(const double* want, const double* got, std::int64_t n, DType dtype) {
  const Closeness within = first_step_tolerance(dtype);
  for (std::int64_t i = 0; i < n; ++i)
    if (!within.holds(want[i], got[i])) return false;
  return true;
}

const std::vector<Layout> kLayouts = {{2, 2, ScheduleKind::one_f_one_b},
                                      {2, 2, ScheduleKind::afab},
                                      {2, 1, ScheduleKind::one_f_one_b},
                                      {1, 2, ScheduleKind::one_f_one_b},
                                      {2, 2, ScheduleKind::interleaved}};

TEST(Puzzle5_8_pipeline_fsdp,
     FirstStepGradientShardsAreTheSingleDeviceMeanAndCollectivesAsCounted) {
  for (const Layout& l : kLayouts) {
    if (!world_fits(l.pp * l.dp)) continue;
    const PipelineOptions options = fsdp_options(l);
    const TrainConfig config = pipeline_config(4 * l.pp, 2 * options.microbatches * l.dp, 1);
    const UnitGradients expected = first_step_gradients(config);
    const UnitGradients last = last_microbatch_share(config, l.dp, options.microbatches);
    run_and_report(describe(l), l.pp * l.dp, [&](Comm& world) -> std::string {
      PipelineMesh mesh = make_pipeline_mesh(world, l.pp);
      const TrainConfig rank_config = on_device(config, world.device());
      // This replica's own gradient: its slice of the batch, never reduced.
      const UnitGradients local = first_step_gradients(rank_config, mesh.dp.rank(), l.dp);
      PipelineTrainer trainer(rank_config, mesh, options);
      const CommStats before = mesh.dp.stats();
      // The gradient shards right after the executor, before clipping and the update.
      std::vector<GradientPiece> pieces, copied;
      std::vector<std::vector<double>> got;
      const auto microbatches = split_microbatches(
          trainer.sampler().batch(0, rank_config.model.device), options.microbatches);
      for (StageModule* chunk : trainer.chunks()) chunk->zero_grad();
      for (int c = 0; c < static_cast<int>(trainer.chunks().size()); ++c)
        trainer.fsdp(c)->zero_grad();
      execute_schedule(mesh.pp, trainer.schedule(), trainer.chunks(), microbatches);
      const CommStats after = mesh.dp.stats();
      std::string message;
      int units = 0;
      for (int c = 0; c < static_cast<int>(trainer.chunks().size()); ++c) {
        StageModule& chunk = *trainer.chunks()[static_cast<std::size_t>(c)];
        PipelineFsdp& fsdp = *trainer.fsdp(c);
        std::vector<Unit*> mine = chunk.units();
        for (std::size_t u = 0; u < mine.size(); ++u, ++units) {
          const Unit& unit = *mine[u];
          const ChunkRange range = chunk_range(unit.numel(), l.dp, mesh.dp.rank());
          const Tensor& shard = fsdp.gradient_shards()[u];
          if (shard.numel() != range.length) {
            message += "\n    unit '" + unit.name() + "' gradient shard holds " +
                       std::to_string(shard.numel()) + " elements; expected " +
                       std::to_string(range.length) + " (chunk_range(numel, d, rank))";
            continue;
          }
          got.push_back(shard.to_vector());
          const auto index = static_cast<std::size_t>(unit.index());
          const auto o = static_cast<std::size_t>(range.offset);
          const Unit* at = &unit;
          const GradientPiece piece{"'" + unit.name() + "' shard",
                                    &expected[index][o],
                                    &local[index][o],
                                    got.back().data(),
                                    range.length,
                                    [at, range](std::int64_t i) {
                                      return "unit '" + at->name() + "' " +
                                             locate(*at, range.offset + i);
                                    }};
          pieces.push_back(piece);
          copied.push_back(piece);
          copied.back().local = &last[index][o];
        }
      }
      // Every wrong shard the last micro-batch's share alone: judged with
      // that share in place of the local gradient, in its own words.
      bool wrong = false, all_last = true;
      for (const GradientPiece& p : copied)
        if (!equal(p.expected, p.got, p.numel, rank_config.model.dtype)) {
          wrong = true;
          all_last = all_last && equal(p.local, p.got, p.numel, rank_config.model.dtype);
        }
      GradientWording words;
      words.micro_batches = "m";
      words.loss_scale = "StageModule::backward's loss_scale";
      words.local =
          "this replica's own local gradient, never averaged over the stage's d replicas "
          "(reduce-scatter skipped?)";
      words.local_example = "this replica's local gradient";
      if (wrong && all_last && options.microbatches > 1) {
        words.local =
            "the last micro-batch's share alone: the reduce-scatter result was copied into the "
            "shard instead of added";
        words.local_example = "the last micro-batch's share";
        pieces = copied;
      }
      if (message.empty())
        message = judge_gradient_pieces(pieces, "gradient shards after the step's micro-batches",
                                        world.rank(), l.dp, options.microbatches, words,
                                        rank_config.model.dtype);
      // Per micro-batch and unit: two all-gathers (forward, backward) and one reduce-scatter.
      const auto calls = [&](const CommStats& s, const char* kind) {
        auto it = s.collective_calls.find(kind);
        return it == s.collective_calls.end() ? std::int64_t{0} : it->second;
      };
      const std::int64_t m = options.microbatches;
      const std::int64_t gathers = calls(after, "all_gather") - calls(before, "all_gather");
      const std::int64_t scatters =
          calls(after, "reduce_scatter") - calls(before, "reduce_scatter");
      if (message.empty() && (gathers != 2 * m * units || scatters != m * units))
        message = "world rank " + std::to_string(world.rank()) + ": " + std::to_string(gathers) +
                  " all-gathers and " + std::to_string(scatters) +
                  " reduce-scatters over the stage's DP group in one step; expected 2 x m " +
                  "x units = " + std::to_string(2 * m * units) +
                  " and m x units = " + std::to_string(m * units) + " (each of the " +
                  std::to_string(units) + " units gathered before its forward and its backward " +
                  "of each of the m = " + std::to_string(m) +
                  " micro-batches, its gradient reduce-scattered after)";
      return message;
    });
  }
}

TEST(Puzzle5_8_pipeline_fsdp, TrainingEqualsSingleDeviceTraining) {
  for (const Layout& l : kLayouts) {
    if (!world_fits(l.pp * l.dp)) continue;
    const PipelineOptions options = fsdp_options(l);
    const TrainConfig config = pipeline_config(4 * l.pp, 2 * options.microbatches * l.dp, 3);
    const ModelState expected = single_device(config);
    run_and_report(describe(l), l.pp * l.dp, [&](Comm& world) -> std::string {
      PipelineMesh mesh = make_pipeline_mesh(world, l.pp);
      PipelineTrainer trainer(on_device(config, world.device()), mesh, options);
      std::vector<double> losses;
      for (std::int64_t s = 0; s < config.steps; ++s) losses.push_back(trainer.step().loss);
      // Gather each unit (FSDP holds only shards) to compare it whole.
      std::vector<bool> mine(trainer.model().units().size(), false);
      for (int c = 0; c < static_cast<int>(trainer.chunks().size()); ++c) {
        std::vector<Unit*> units = trainer.chunks()[static_cast<std::size_t>(c)]->units();
        for (std::size_t u = 0; u < units.size(); ++u) {
          trainer.fsdp(c)->gather_unit(static_cast<int>(u));
          mine[static_cast<std::size_t>(units[u]->index())] = true;
        }
      }
      return compare_stage(expected, trainer.model(), mine, losses, world.rank());
    });
  }
}

// Memory inside a step. A unit's full parameters exist only while it
// computes: gathered before its forward and released after it, gathered
// again before its backward and released once its gradient is reduced. So
// over a step a rank's parameter bytes peak at its shards plus the largest
// unit it holds, (S + U) e: chapter 03's ZeRO-3 formula on the rank's own
// units, exactly (every unit is gathered at least once per step).
TEST(Puzzle5_8_pipeline_fsdp, ParameterPeakIsTheShardsPlusOneGatheredUnit) {
  for (const Layout& l :
       {Layout{2, 2, ScheduleKind::one_f_one_b}, Layout{2, 2, ScheduleKind::interleaved}}) {
    if (!world_fits(4)) GTEST_SKIP() << "needs 4 ranks";
    const PipelineOptions options = fsdp_options(l);
    const TrainConfig config = pipeline_config(4 * l.pp, 2 * options.microbatches * l.dp, 2);
    run_and_report(describe(l), 4, [&](Comm& world) -> std::string {
      PipelineMesh mesh = make_pipeline_mesh(world, l.pp);
      PipelineTrainer trainer(on_device(config, world.device()), mesh, options);
      trainer.step();
      MemoryTracker& tracker = *current_memory_tracker();
      tracker.reset_peaks();
      trainer.step();
      std::int64_t shards = 0, largest = 0, stage = 0;
      for (StageModule* chunk : trainer.chunks())
        for (Unit* unit : chunk->units()) {
          shards += chunk_range(unit->numel(), l.dp, mesh.dp.rank()).length;
          largest = std::max(largest, unit->numel());
          stage += unit->numel();
        }
      const auto e = static_cast<std::int64_t>(dtype_size(config.model.dtype));
      const std::int64_t peak = tracker.peak(MemoryCategory::params);
      const std::int64_t want = (shards + largest) * e;
      if (peak == want) return "";
      return "world rank " + std::to_string(world.rank()) + ", step 2: the parameter bytes " +
             "peaked at " + std::to_string(peak) + ", expected (S + U) e = (" +
             std::to_string(shards) + " + " + std::to_string(largest) + ") x " + std::to_string(e) +
             " = " + std::to_string(want) + " (this rank's shards S, its largest unit U)" +
             (peak >= (shards + stage) * e
                  ? ": every unit of the rank's stage was whole at once. Release a unit's "
                    "gathered parameters in the after-forward hook (set_buffers(Tensor(), "
                    "Tensor())), not only after its backward"
              : peak > want ? ": more than one unit was whole at once; release each right "
                              "after it ran"
                            : "");
    });
  }
}

TEST(Puzzle5_8_pipeline_fsdp, ShardsHoldOneDthOfTheStage) {
  const Layout l{2, 2, ScheduleKind::one_f_one_b};
  if (!world_fits(4)) GTEST_SKIP() << "needs 4 ranks";
  const PipelineOptions options = fsdp_options(l);
  const TrainConfig config = pipeline_config(4, 8, 1);
  run_and_report(describe(l), 4, [&](Comm& world) -> std::string {
    PipelineMesh mesh = make_pipeline_mesh(world, l.pp);
    PipelineTrainer trainer(on_device(config, world.device()), mesh, options);
    std::string message;
    std::vector<Unit*> units = trainer.chunks()[0]->units();
    for (std::size_t u = 0; u < units.size(); ++u) {
      const std::int64_t want = chunk_range(units[u]->numel(), 2, mesh.dp.rank()).length;
      const std::int64_t got = trainer.fsdp()->parameter_shards()[u].numel();
      if (got != want || units[u]->has_params())
        message += "\n    world rank " + std::to_string(world.rank()) + ": unit '" +
                   units[u]->name() + "' keeps " + std::to_string(got) +
                   " parameters in its shard (expected " + std::to_string(want) + ")" +
                   (units[u]->has_params()
                        ? " and still holds its full parameters (release them: set_buffers)"
                        : "");
    }
    return message;
  });
}

}  // namespace
}  // namespace dtp::testing::ch05
