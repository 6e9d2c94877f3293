// The checks every ZeRO stage gets, as functions of the stage; each puzzle's
// test file calls them under its own suite name (Puzzle3_k_name).
#pragma once

#include <cstring>

#include "zero_checks.h"

namespace dtp::testing::ch03 {

// 1. Right after the first backward, this rank's gradient shards equal its
//    slice of the single-device gradient of the whole global batch, within
//    first_step_tolerance() (training.h): 1e-10 + 1e-8 |expected| in f64; in
//    f32 4e-6 + 2e-5 |expected|, its bound for sums of up to 350 roundings
//    of gradients below 0.2. Measured here in f32 (worlds 2-4, every stage):
//    at most 8.9e-8.
inline void expect_first_step_shards(Stage stage) {
  const UnitGradients expected =
      first_step_gradients(on_device(tiny_config(12, 1), checker_device()));
  for (int world : {2, 3, 4}) {
    run_and_report(
        stage_name(stage) + ", first-step gradient shards vs the single-device mean", world,
        [&](Comm& comm) {
          const TrainConfig config = on_device(tiny_config(12, 1), comm.device());
          const UnitGradients local = first_step_gradients(config, comm.rank(), comm.size());
          StagedTrainer run = plug(stage, comm, config);
          GPT& model = run.trainer->model();
          std::string failure = "rank " + std::to_string(comm.rank()) + ": backward never finished";
          run.trainer->on_after_backward([&] {
            UnitGradients got;
            for (Unit* unit : model.units())
              got.push_back(run.stage->gradient_shard(unit->index()).to_vector());
            failure = check_first_step_gradient_shards(
                expected, local, model, shard_ranges(model, comm.size(), comm.rank()), got,
                comm.rank(), comm.size(), config.model.dtype);
          });
          run.trainer->step();
          return failure;
        });
  }
}

// 2. After K steps the parameters (as the shards make them up, and the full
//    parameters the model holds where the stage keeps them) and the losses
//    equal single-device training; after every step the parameters are
//    bitwise identical on every rank. @p recipe is placed on each rank's
//    device in checker_dtype() (on_device).
//
//    Tolerance: training_tolerance() (training.h): 1e-10 + 1e-8 |expected|
//    in f64; in f32 5e-6 + 2e-5 |expected|, its bound for 3 SGD steps of
//    sums added in another order. Measured here in f32 (worlds 1-4, every
//    stage): parameters at most 9.3e-9 apart, losses 2.5e-8.
//
//    AdamW in f32 gets the exact checks (replicas, full parameters against
//    the shards) but no comparison with single-device training: AdamW
//    divides each gradient by its own RMS, so an element whose gradient is
//    at rounding level steps by up to lr in a direction rounding decides.
//    block.0's 'attn.v.weight' element 57 is one: its first gradient is
//    -7.8e-8, and summing in another order moves f32 gradients by up to
//    9e-8, so the two runs may step it up to 2 lr = 0.02 apart per step
//    (measured 1e-5 on 3 ranks), as far as a real mistake moves it. f64
//    rounds at 1e-16, far below AdamW's eps (1e-8), so f64 compares them;
//    SGD's comparison runs in both dtypes.
inline void expect_matches_single(Stage stage, const TrainConfig& recipe,
                                  const std::vector<int>& worlds) {
  const TrainConfig single = on_device(recipe, checker_device());
  const bool compares_values = single.model.dtype == DType::f64 || recipe.optimizer != "adamw";
  const ModelState expected = single_device(single);
  const Closeness within = training_tolerance(single.model.dtype);
  const bool keeps_full = stage == Stage::zero1 || stage == Stage::zero2 || stage == Stage::offload;
  for (int world : worlds) {
    run_and_report(
        stage_name(stage) + " (" + recipe.optimizer + ") vs single device", world,
        [&](Comm& comm) -> std::string {
          const TrainConfig config = on_device(recipe, comm.device());
          StagedTrainer run = plug(stage, comm, config);
          GPT& model = run.trainer->model();
          std::vector<double> losses;
          std::string failure;
          for (std::int64_t s = 1; s <= config.steps; ++s) {
            losses.push_back(run.trainer->step().loss);
            const UnitGradients full = gathered_parameters(comm, model, *run.stage);
            std::string drift =
                bitwise_across_ranks(comm, flatten(full), "the gathered parameters", s);
            if (drift.empty() && keeps_full) {
              UnitGradients held;
              for (Unit* unit : model.units()) held.push_back(unit->params().to_vector());
              drift = bitwise_across_ranks(comm, flatten(held),
                                           "the full parameters the model holds", s);
              if (drift.empty() && held != full)
                drift = "rank " + std::to_string(comm.rank()) + ", after step " +
                        std::to_string(s) +
                        ": the model's full parameters differ from the updated shards (every "
                        "rank's shard must be all-gathered into params() after the update" +
                        (stage == Stage::offload
                             ? std::string("; for offload: copy each updated host shard into "
                                           "this rank's slice of params() before the all-gather)")
                             : std::string(")"));
            }
            if (failure.empty()) failure = drift;
          }
          const std::vector<double> mean = mean_over_ranks(comm, losses);
          if (!failure.empty() || !compares_values) return failure;
          ModelState got;
          got.losses = mean;
          got.params = gathered_parameters(comm, model, *run.stage);
          std::string message;
          for (std::size_t s = 0; s < expected.losses.size(); ++s)
            if (!within.holds(expected.losses[s], got.losses[s]))
              message += "\n    step " + std::to_string(s + 1) +
                         " loss (mean over ranks): expected " + number(expected.losses[s]) +
                         ", got " + number(got.losses[s]);
          message += compare_units("parameter (gathered from the shards) after the last step",
                                   model, expected.params, got.params, within);
          if (message.empty()) return "";
          return "rank " + std::to_string(comm.rank()) +
                 " differs from single-device training on the same global batch (" +
                 dtype_name(config.model.dtype) + ", tolerance " + within.str() + "):" + message;
        });
  }
  if (!compares_values)
    GTEST_SKIP() << "f32 AdamW: the replicas (bitwise equal on every rank after every step) and "
                    "the model's full parameters against the shards were checked; the values are "
                    "not compared with single-device training, where AdamW steps an element with "
                    "a rounding-level gradient in a direction rounding decides (see "
                    "expect_matches_single). The f64 run and the SGD tests compare them";
}

// 3. Memory, per rank and category, against the lesson's formulas.
inline void expect_memory(Stage stage) {
  for (int world : {3, 4}) {
    run_and_report(stage_name(stage) + " memory per rank", world, [&](Comm& comm) -> std::string {
      const TrainConfig config = on_device(adamw_config(12, 2), comm.device());
      StagedTrainer run = plug(stage, comm, config);
      GPT& model = run.trainer->model();
      run.trainer->step();
      run.trainer->step();  // steady state: the tracker's peaks are this step's
      const ShardSizes size = shard_sizes(model, comm.size(), comm.rank());
      const auto e = static_cast<std::int64_t>(dtype_size(config.model.dtype));
      const std::int64_t states = optimizer_states(config);
      MemoryTracker& tracker = *current_memory_tracker();
      const std::string where = "rank " + std::to_string(comm.rank()) + " of " +
                                std::to_string(comm.size()) +
                                " (Psi = " + std::to_string(size.total) +
                                " elements, this rank's shards S = " + std::to_string(size.shards) +
                                ", largest unit U = " + std::to_string(size.largest_unit) + ", " +
                                std::to_string(e) + " bytes each): ";
      auto expect = [&](const char* what, std::int64_t got, std::int64_t want,
                        const std::string& formula, const std::string& hint) -> std::string {
        if (got == want) return "";
        return where + what + " is " + std::to_string(got) + " bytes, expected " + formula + " = " +
               std::to_string(want) + " (" + hint + ")";
      };
      auto at_most = [&](const char* what, std::int64_t got, std::int64_t bound,
                         const std::string& formula, const std::string& hint) -> std::string {
        if (got <= bound) return "";
        return where + what + " is " + std::to_string(got) + " bytes, more than " + formula +
               " = " + std::to_string(bound) + " (" + hint + ")";
      };
      const std::int64_t optimizer = tracker.live(MemoryCategory::optimizer);
      const std::int64_t params = tracker.live(MemoryCategory::params);
      const std::int64_t grads = tracker.live(MemoryCategory::grads);
      const std::int64_t params_peak = tracker.peak(MemoryCategory::params);
      const std::int64_t grads_peak = tracker.peak(MemoryCategory::grads);
      const std::string whole_model = "an optimizer over the whole model would hold 2 Psi";
      std::string f;
      switch (stage) {
        case Stage::zero1:
          f = expect("optimizer state", optimizer, states * size.shards * e, "2 S e", whole_model);
          if (f.empty())
            f = expect("parameters", params, size.total * e, "Psi e",
                       "ZeRO-1 keeps the full parameters");
          if (f.empty())
            f = expect("gradients", grads, (size.total + size.shards) * e, "(Psi + S) e",
                       "full gradients plus this rank's gradient shards");
          break;
        case Stage::zero2:
          f = expect("optimizer state", optimizer, states * size.shards * e, "2 S e", whole_model);
          if (f.empty())
            f = expect("parameters", params, size.total * e, "Psi e",
                       "ZeRO-2 keeps the full parameters");
          if (f.empty())
            f = expect(
                "gradients between steps", grads, size.shards * e, "S e",
                "only the shards: release each unit's full gradient right after reducing it");
          if (f.empty())
            f = at_most("the gradient peak", grads_peak, (size.shards + size.largest_unit) * e,
                        "(S + U) e",
                        "at most one unit's full gradient at a time: reduce and release it in its "
                        "grad-ready hook");
          break;
        case Stage::zero3:
        case Stage::prefetch: {
          const bool two = stage == Stage::prefetch;
          const std::int64_t units = size.largest_unit + (two ? size.second_unit : 0);
          f = expect("optimizer state", optimizer, states * size.shards * e, "2 S e", whole_model);
          if (f.empty())
            f = expect(
                "parameters between steps", params, size.shards * e, "S e",
                params == size.total * e ? "only the shards; got exactly Psi e, one whole model: "
                                           "are the parameter shards views "
                                           "into the full buffers (parameter_shard_views)? A view "
                                           "keeps its whole buffer alive "
                                           "after set_buffers(Tensor(), Tensor()); copy each shard "
                                           "into a tensor of its own"
                : params == (size.total + size.shards) * e
                    ? "only the shards; got (Psi + S) e, the shards plus every unit's full "
                      "parameters: "
                      "release each unit's full buffers (set_buffers(Tensor(), Tensor())) in the "
                      "constructor and after each forward and backward"
                    : "only the shards: release every unit's full parameters after it ran");
          if (f.empty())
            f = at_most("the parameter peak", params_peak, (size.shards + units) * e,
                        two ? "(S + two largest units) e" : "(S + U) e",
                        two ? "the unit computing and the one arriving, no more"
                            : "one unit's full parameters at a time: release after forward and "
                              "after backward");
          if (f.empty())
            f = expect("gradients between steps", grads, size.shards * e, "S e", "only the shards");
          if (f.empty())
            f = at_most("the gradient peak", grads_peak, (size.shards + size.largest_unit) * e,
                        "(S + U) e", "one unit's full gradient at a time");
          break;
        }
        case Stage::offload: {
          f = expect("optimizer state (host)",
                     tracker.live(MemoryCategory::optimizer, Device::Kind::cpu),
                     (states + 1) * size.shards * e, "3 S e",
                     "the two AdamW states and the host master copy of the parameter shards");
          if (f.empty() && comm.device().is_cuda())
            f = expect("optimizer state on the device",
                       tracker.live(MemoryCategory::optimizer, Device::Kind::cuda), 0, "0",
                       "offloaded: nothing of the optimizer on the GPU");
          break;
        }
      }
      return f;
    });
  }
}

// 4. Communication per step: reduce-scatters and all-gathers as the lesson
//    counts them, and no all-reduce but the one number of the gradient norm.
inline void expect_communication(Stage stage) {
  const bool gathers_twice = stage == Stage::zero3 || stage == Stage::prefetch;
  for (int world : {2, 3}) {
    run_and_report(
        stage_name(stage) + " communication per step", world, [&](Comm& comm) -> std::string {
          const TrainConfig config = on_device(tiny_config(12, 2), comm.device());
          StagedTrainer run = plug(stage, comm, config);
          GPT& model = run.trainer->model();
          const ShardSizes size = shard_sizes(model, comm.size(), comm.rank());
          const auto units = static_cast<std::int64_t>(model.units().size());
          const auto e = static_cast<std::int64_t>(dtype_size(config.model.dtype));
          for (std::int64_t s = 1; s <= config.steps; ++s) {
            const CommStats before = comm.stats();
            run.trainer->step();
            const CommStats after = comm.stats();
            auto calls = [&](const char* kind) {
              auto count = [&](const CommStats& stats) {
                auto it = stats.collective_calls.find(kind);
                return it == stats.collective_calls.end() ? std::int64_t{0} : it->second;
              };
              return count(after) - count(before);
            };
            const std::int64_t gathers = calls("all_gather"), scatters = calls("reduce_scatter");
            const std::int64_t reduces = calls("all_reduce");
            const std::int64_t others = after.total_collective_calls() -
                                        before.total_collective_calls() - gathers - scatters -
                                        reduces;
            const std::int64_t want_gathers = (gathers_twice ? 2 : 1) * units;
            const std::int64_t bytes = after.collective_bytes - before.collective_bytes;
            // CommStats counts each call's full unit buffer, so per pass over the
            // units: Psi elements of the model's dtype. Gather passes (1 or 2) +
            // one reduce-scatter pass, plus the gradient norm's one number, an f64
            // in every dtype.
            const std::int64_t passes = (gathers_twice ? 2 : 1) + 1;
            const std::int64_t want_bytes =
                passes * size.total * e + static_cast<std::int64_t>(dtype_size(DType::f64));
            if (gathers != want_gathers || scatters != units || reduces != 1 || others != 0 ||
                bytes != want_bytes)
              return "rank " + std::to_string(comm.rank()) + ", step " + std::to_string(s) +
                     ": expected " + std::to_string(units) + " reduce-scatters (one per unit), " +
                     std::to_string(want_gathers) + " all-gathers (" +
                     (gathers_twice ? "two per unit: before forward and before backward"
                                    : "one per unit") +
                     "), 1 all-reduce (the gradient norm, one number) and nothing else, " +
                     std::to_string(want_bytes) + " bytes counted; got " +
                     std::to_string(scatters) + " reduce-scatters, " + std::to_string(gathers) +
                     " all-gathers, " + std::to_string(reduces) + " all-reduces, " +
                     std::to_string(others) + " other collectives, " + std::to_string(bytes) +
                     " bytes" +
                     (reduces > 1 ? " (an all-reduce of gradients is DDP's, not ZeRO's)" : "");
          }
          return "";
        });
  }
}

// 5. Units smaller than the world: with d_model 1 the embedding holds
//    vocab + context = 3 elements, fewer than 4 ranks, so the last rank's
//    shard of it is empty.
inline void expect_units_smaller_than_the_world(Stage stage) {
  TrainConfig config = tiny_config(8, 2);
  config.model.d_model = 1;
  config.model.heads = 1;
  config.model.vocab_size = 2;
  config.model.context = 1;
  config.seq = 1;
  expect_matches_single(stage, config, {4});
}

// 6. Bad input: finish_backward() with no backward since the last step.
inline void expect_finish_without_backward_is_an_error(Stage stage) {
  run_and_report(stage_name(stage) + " finish_backward without a backward", 2,
                 [&](Comm& comm) -> std::string {
                   const TrainConfig config = on_device(tiny_config(12, 1), comm.device());
                   StagedTrainer run = plug(stage, comm, config);  // a stub fails here
                   run.trainer->step();
                   try {
                     run.stage->finish_backward();
                     return "rank " + std::to_string(comm.rank()) +
                            ": finish_backward() after a step with no new backward: expected a "
                            "dtp::Error naming a unit "
                            "that was not reduced, got none";
                   } catch (const dtp::Error&) {
                   }
                   return "";
                 });
}

// 7. (FSDP) When a unit's forward starts, it holds its own full parameters:
//    checked at step 1, where they are the initial ones, by a hook added
//    after the stage's. Blocks have equal sizes, so gathering the wrong block
//    gives no size error: only the values show it.
inline void expect_each_unit_runs_with_its_own_parameters(Stage stage) {
  // The initial parameters as the trainer builds them (it resolves the
  // vocabulary and context from the data first).
  Trainer fresh(on_device(tiny_config(12, 1), checker_device()));
  GPT& initial = fresh.model();
  std::vector<std::vector<double>> own;
  for (Unit* unit : initial.units()) own.push_back(unit->params().to_vector());
  for (int world : {2, 3}) {
    run_and_report(
        stage_name(stage) + " parameters at each unit's forward", world,
        [&](Comm& comm) -> std::string {
          StagedTrainer run = plug(stage, comm, on_device(tiny_config(12, 1), comm.device()));
          GPT& model = run.trainer->model();
          std::string failure;
          model.on_before_forward([&](Unit& unit) {
            if (!failure.empty()) return;
            if (!unit.has_params()) {
              failure =
                  "rank " + std::to_string(comm.rank()) + ", step 1: unit '" + unit.name() +
                  "' had no parameters when its forward started (gather them in on_before_forward)";
              return;
            }
            const std::vector<double> got = unit.params().to_vector();
            if (got == own[static_cast<std::size_t>(unit.index())]) return;
            std::string whose;
            for (std::size_t u = 0; u < own.size(); ++u)
              if (got == own[u])
                whose = " (they are unit '" + initial.units()[u]->name() +
                        "''s: the wrong unit was gathered)";
            failure =
                "rank " + std::to_string(comm.rank()) + ", step 1: when unit '" + unit.name() +
                "''s forward started, its parameters were not its own initial parameters" + whose;
          });
          run.trainer->step();
          return failure;
        });
  }
}

}  // namespace dtp::testing::ch03
