// Puzzles 5.2 and 5.7: running a pipeline. The naive step and the executor
// must give every unit the batch's mean gradient (first-step gradients, so a
// wrong scale shows as a ratio and a missing accumulation as one
// micro-batch's gradient), return the batch's mean loss on the last stage,
// send exactly the messages the data flow needs, and (the executor) leave
// the simulated clock where the verifier says. Then K steps of training
// through the provided trainer equal single-device training, for every
// schedule.
#include "drivers/05_pipeline/pp_strategy.h"
#include "pipeline_checks.h"

namespace dtp::testing::ch05 {
namespace {

// What one rank saw in one hand-driven step.
struct StepFacts {
  std::string failure;
  double loss = 0;
  std::int64_t sent = 0;
  double clock = 0;
};

void add_line(std::string& message, const std::string& line) {
  message += (message.empty() ? "" : "\n    ") + line;
}

// One step of `s` on the ranks (executor), checked against the serial model.
void check_one_step(const Schedule& s, int layers, const std::string& what) {
  const int p = s.stages, m = s.microbatches;
  if (!world_fits(p)) GTEST_SKIP() << "needs " << p << " ranks";
  const TrainConfig config = pipeline_config(layers, 2 * m);
  const MicroBatchGradients expected = micro_batch_gradients(config, m);
  const ScheduleReport verifier = simulate_schedule(s);
  ASSERT_TRUE(verifier.ok()) << verifier.problem;
  std::vector<StepFacts> facts(static_cast<std::size_t>(p));
  run_and_report(
      what, p,
      [&](Comm& pp) -> std::string {
        HandPipeline pipe(config, pp, s);
        pp.reset_stats();
        const double loss = execute_schedule(pp, s, pipe.pointers, pipe.microbatches(m));
        const CommStats stats = pp.stats();
        StepFacts mine{
            check_stage_gradients(expected, pipe.trainer->model(), pipe.mine, pp.rank(), m), loss,
            stats.messages_sent, stats.clock};
        // Every rank learns every rank's facts (after the counts were taken).
        Tensor row = Tensor::from_values({loss, static_cast<double>(mine.sent), mine.clock},
                                         DType::f64, pp.device());
        Tensor all = Tensor::empty(Shape{3 * p}, DType::f64, pp.device());
        pp.all_gather(row, all);
        const std::vector<double> v = all.to_vector();
        std::string message = mine.failure;
        const bool holds_loss = pp.rank() == (s.virtual_stages() - 1) % p;
        if (holds_loss) {
          const std::string l = check_step_loss(expected, loss, m, config.model.dtype);
          if (!l.empty()) add_line(message, "rank " + std::to_string(pp.rank()) + ": " + l);
        } else if (loss != 0) {
          add_line(message, "rank " + std::to_string(pp.rank()) + " returned loss " + number(loss) +
                                "; only the rank holding the last stage returns it (0 elsewhere)");
        }
        if (pp.rank() == 0) {
          double total = 0, makespan = 0;
          int last = 0;
          std::string per_rank;
          for (int r = 0; r < p; ++r) {
            total += v[static_cast<std::size_t>(3 * r + 1)];
            if (v[static_cast<std::size_t>(3 * r + 2)] > makespan)
              makespan = v[static_cast<std::size_t>(3 * r + 2)], last = r;
            per_rank += (r ? ", " : "") + number(v[static_cast<std::size_t>(3 * r + 1)]);
          }
          const double want = 2.0 * (s.virtual_stages() - 1) * m;
          if (total != want)
            add_line(message, "the ranks sent " + number(total) + " messages (per rank: " +
                                  per_rank + "); expected 2(pv-1)m = " + number(want) +
                                  ": one activation per micro-batch across each of the pv-1 stage "
                                  "boundaries, and one "
                                  "gradient back (nothing from the last stage forward, nothing "
                                  "from the first back)");
          else if (makespan > verifier.makespan + 1e-9)
            add_line(message,
                     "rank " + std::to_string(last) + " ended the step at " + number(makespan) +
                         " on the simulated clock; the verifier's makespan for this schedule is " +
                         number(verifier.makespan) +
                         ": receive each message right before the action that needs it (a receive "
                         "placed "
                         "earlier makes the rank wait for it before work that does not need it)");
          else if (makespan < verifier.makespan - 1e-9)
            add_line(message, "the last rank to finish (rank " + std::to_string(last) +
                                  ") ended the step at " + number(makespan) +
                                  " on the simulated clock, before the verifier's makespan " +
                                  number(verifier.makespan) +
                                  ": some action did not wait for the message it needs (one "
                                  "micro-batch's message "
                                  "taken for another's: is every message sent and received with "
                                  "its pipeline_tag()?)");
        }
        return message;
      },
      explain_pipeline_failure);
}

TEST(Puzzle5_2_naive_pipeline, OneMicroBatchGivesTheSingleDeviceGradientsAndLoss) {
  for (int p : {1, 2, 3, 4}) {
    if (!world_fits(p)) continue;
    const TrainConfig config = pipeline_config(4, 4);
    const MicroBatchGradients expected = micro_batch_gradients(config, 1);
    Schedule shape = empty_schedule("naive", p, 1);
    run_and_report(
        "naive_pipeline_step", p,
        [&](Comm& pp) -> std::string {
          HandPipeline pipe(config, pp, shape);
          pp.reset_stats();
          const double loss = naive_pipeline_step(pp, *pipe.pointers[0], pipe.microbatches(1)[0]);
          const CommStats stats = pp.stats();
          std::string message =
              check_stage_gradients(expected, pipe.trainer->model(), pipe.mine, pp.rank(), 1);
          const int rank = pp.rank();
          if (rank == p - 1) {
            const std::string l = check_step_loss(expected, loss, 1, config.model.dtype);
            if (!l.empty()) message += "\n    rank " + std::to_string(rank) + ": " + l;
          } else if (loss != 0) {
            message += "\n    rank " + std::to_string(rank) + " returned loss " + number(loss) +
                       "; only the last returns it";
          }
          const std::int64_t want = (rank > 0) + (rank < p - 1);
          if (stats.messages_sent != want)
            message += "\n    rank " + std::to_string(rank) + " of " + std::to_string(p) +
                       " sent " + std::to_string(stats.messages_sent) + " messages; expected " +
                       std::to_string(want) +
                       " (its output forward unless last, its input gradient back unless first)";
          return message;
        },
        explain_pipeline_failure);
  }
}

TEST(Puzzle5_7_executor, RunsRandomValidOrdersWithAndWithoutSplitBackwardAndChunks) {
  // Orders no schedule puzzle produces: the executor must follow the data.
  std::uint64_t seed = 1;
  for (auto [p, m, v, split] :
       {std::tuple{2, 3, 1, false}, std::tuple{3, 4, 1, false}, std::tuple{4, 2, 1, false},
        std::tuple{2, 3, 1, true}, std::tuple{3, 2, 1, true}, std::tuple{2, 2, 2, false},
        std::tuple{3, 3, 2, false}, std::tuple{2, 2, 2, true}}) {
    if (::testing::Test::HasFailure())
      return;  // the first failing order says it; the rest repeat it
    const Schedule s = random_schedule(p, m, v, split, seed++);
    check_one_step(s, 2 * 2 * v + 2,
                   "execute_schedule on a random valid order, p " + std::to_string(p) + ", m " +
                       std::to_string(m) + ", v " + std::to_string(v) +
                       (split ? ", split backward" : ""));
  }
}

TEST(Puzzle5_7_executor, EveryScheduleGivesTheMeanGradientLossMessagesAndClock) {
  for (ScheduleKind kind : {ScheduleKind::afab, ScheduleKind::one_f_one_b,
                            ScheduleKind::interleaved, ScheduleKind::zb_h1}) {
    for (auto [p, m] : {std::pair{2, 4}, std::pair{4, 4}, std::pair{3, 6}}) {
      if (::testing::Test::HasFailure()) return;
      const Schedule s = make_schedule(kind, p, m, 2);
      check_one_step(s, 2 * p * s.chunks,
                     std::string("execute_schedule(") + schedule_kind_name(kind) + ", p " +
                         std::to_string(p) + ", m " + std::to_string(m) + ")");
    }
  }
}

TEST(Puzzle5_7_executor, ArgumentsThatDoNotFitTheScheduleAreErrors) {
  const Schedule s = random_schedule(2, 2, 1, false, 7);
  const TrainConfig config = pipeline_config(2, 4);
  run_and_report(
      "execute_schedule with arguments that do not fit", 2, [&](Comm& pp) -> std::string {
        HandPipeline pipe(config, pp, s);
        std::string message;
        auto expect_error = [&](const std::string& what, const std::function<void()>& call) {
          try {
            call();
            add_line(message,
                     "rank " + std::to_string(pp.rank()) + ": execute_schedule with " + what +
                         " returned; it must throw dtp::Error naming the mismatch (DTP_CHECK)");
          } catch (const dtp::Error&) {
          }
        };
        const Schedule three = random_schedule(3, 2, 1, false, 7);
        expect_error("a schedule for 3 stages on 2 ranks",
                     [&] { execute_schedule(pp, three, pipe.pointers, pipe.microbatches(2)); });
        expect_error("no chunks", [&] { execute_schedule(pp, s, {}, pipe.microbatches(2)); });
        expect_error("4 micro-batches for m = 2",
                     [&] { execute_schedule(pp, s, pipe.pointers, pipe.microbatches(4)); });
        return message;
      });
}

TEST(Puzzle5_7_executor, TrainingThroughTheTrainerEqualsSingleDeviceTraining) {
  for (ScheduleKind kind : {ScheduleKind::afab, ScheduleKind::one_f_one_b,
                            ScheduleKind::interleaved, ScheduleKind::zb_h1}) {
    for (auto [p, dp] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}}) {
      if (!world_fits(p * dp)) continue;
      if (::testing::Test::HasFailure()) return;
      PipelineOptions options;
      options.pp = p;
      options.dp = dp;
      options.microbatches = 2 * p;
      options.schedule = kind;
      const TrainConfig config = pipeline_config(2 * p * 2, 4 * p * dp, 3);
      const ModelState expected = single_device(config);
      run_and_report(
          std::string("PipelineTrainer, ") + schedule_kind_name(kind) + ", pp " +
              std::to_string(p) + " x dp " + std::to_string(dp),
          p * dp,
          [&](Comm& world) -> std::string {
            PipelineMesh mesh = make_pipeline_mesh(world, p);
            PipelineTrainer trainer(on_device(config, world.device()), mesh, options);
            std::vector<bool> mine(trainer.model().units().size(), false);
            for (StageModule* chunk : trainer.chunks())
              for (Unit* unit : chunk->units())
                mine[static_cast<std::size_t>(unit->index())] = true;
            std::vector<double> losses;
            mesh.pp.reset_stats();
            for (std::int64_t step = 1; step <= config.steps; ++step) {
              losses.push_back(trainer.step().loss);
              // The replicas of a stage must stay bitwise equal.
              for (StageModule* chunk : trainer.chunks())
                for (Unit* unit : chunk->units()) {
                  Tensor ours = Tensor::empty(unit->params().shape(), unit->params().dtype(),
                                              unit->params().device());
                  ours.copy_from(unit->params());
                  mesh.dp.broadcast(ours, 0);
                  if (ours.to_vector() != unit->params().to_vector())
                    return "world rank " + std::to_string(world.rank()) + ", step " +
                           std::to_string(step) + ": unit '" + unit->name() +
                           "' differs from DP rank 0's copy of the same stage " +
                           "(replicas must stay bitwise equal: is every gradient averaged over "
                           "--dp?)";
                }
            }
            // Sum the pipeline's messages over its stages (after the count was taken).
            Tensor sent = Tensor::full({1}, static_cast<double>(mesh.pp.stats().messages_sent),
                                       DType::f64, mesh.pp.device());
            mesh.pp.all_reduce(sent);
            const double want =
                2.0 * (p * trainer.chunks().size() - 1) * options.microbatches * config.steps;
            if (sent.item(0) != want)
              return "world rank " + std::to_string(world.rank()) + ": the " + std::to_string(p) +
                     " stages of this pipeline sent " + number(sent.item(0)) + " messages in " +
                     std::to_string(config.steps) +
                     " steps; expected 2(pv-1)m per step = " + number(want);
            return compare_stage(expected, trainer.model(), mine, losses, world.rank());
          },
          explain_pipeline_failure);
    }
  }
}

}  // namespace
}  // namespace dtp::testing::ch05
