// Puzzle 12.2: one step on the 3D mesh. On every layout (dp x pp x tp,
// 1F1B, interleaved or AFAB, with and without sequence parallelism), the
// first step's gradients of every unit a rank holds equal its TP slices of
// single-device training's on the whole global batch; K steps of training
// equal single-device training, with every replica bitwise equal inside its
// group after every step; and each group carries exactly the traffic the
// lesson's formulas give.
#include <gtest/gtest.h>

#include "12_3d_parallelism/three_d_checks.h"
#include "drivers/12_3d_parallelism/plan.h"

namespace dtp::testing::ch12 {
namespace {

// What a wrong first-step gradient usually is.
std::string gradient_hint(const Layout& l) {
  std::string hint = "a k.00x ratio: a mean taken as a sum, or a reduction done twice";
  if (l.shape.dp > 1) hint += "; 0.50x: the DP all-reduce missing or summing where it averages";
  if (l.sp && l.shape.tp > 1)
    hint +=
        "; replicated parameters at 0.50x: the TP sum of 4.7 (and the head's LayerNorm) "
        "missing; at 2.00x: summed over TP twice, or every gradient summed over TP";
  return hint;
}

TEST(Puzzle12_2_three_d_step, FirstStepGradientsEqualTheSingleDeviceGradients) {
  const TrainConfig base = three_d_config(checker_device());
  std::unique_ptr<Trainer> serial = serial_after_first_backward(base);
  const std::vector<Unit*> serial_units = serial->model().units();
  for (const Layout& l : layouts()) {
    run_and_report("12.2 first-step gradients, " + l.str(), l.world(), [&](Comm& world) {
      const TrainConfig config = three_d_config(world.device());
      Mesh mesh = checker_mesh(world, l.shape);
      ThreeDTrainer trainer(config, mesh, l.options());
      Batch batch = trainer.trainer().sampler().batch(0, config.model.device);
      trainer.model().zero_grad();
      const double loss = three_d_step(mesh, trainer.model(), batch);
      (void)loss;
      const std::string m =
          check_held_units("first-step gradient", mesh, trainer.model(), serial_units, true,
                           first_step_tolerance(DType::f64),
                           "(replicated: under sequence parallelism sum it over the TP group, "
                           "once, after the schedule: the blocks' and the head's LayerNorm)");
      if (m.empty()) return std::string();
      return who(world, mesh) +
             " differs from the single-device gradient of the same global "
             "batch (" +
             gradient_hint(l) + "):" + m;
    });
    if (HasFailure()) return;
  }
}

TEST(Puzzle12_2_three_d_step, TrainingEqualsSingleDeviceTrainingAndReplicasAgreeEveryStep) {
  const TrainConfig base = three_d_config(checker_device());
  Trainer serial(base);
  std::vector<double> serial_losses;
  for (std::int64_t s = 0; s < base.steps; ++s) serial_losses.push_back(serial.step().loss);
  const std::vector<Unit*> serial_units = serial.model().units();
  for (const Layout& l : layouts()) {
    run_and_report("12.2 training, " + l.str(), l.world(), [&](Comm& world) {
      const TrainConfig config = three_d_config(world.device());
      const Closeness within = training_tolerance(DType::f64);
      Mesh mesh = checker_mesh(world, l.shape);
      ThreeDTrainer trainer(config, mesh, l.options());
      const std::vector<Unit*> units = trainer.model().units();
      // Every rank runs every step (a rank that stopped at its first
      // difference would leave the others waiting in a collective); the
      // first step that differs on this rank is the one reported.
      std::string m;
      for (std::int64_t s = 0; s < config.steps; ++s) {
        std::string step;
        const double loss = trainer.step().loss;
        const double want = serial_losses[static_cast<std::size_t>(s)];
        if (!within.holds(want, loss))
          step += "\n    step " + std::to_string(s + 1) +
                  " loss (mean of the global batch): " + "expected " + number(want) + ", got " +
                  number(loss);
        std::vector<std::pair<std::string, Tensor>> replicated, everything;
        for (Unit* unit : units)
          for (const ParamView& p : unit->parameters()) {
            const std::string name =
                "step " + std::to_string(s + 1) + " unit '" + unit->name() + "' '" + p.name + "'";
            if (ch04::is_replicated(p.name)) replicated.push_back({name, p.value});
            everything.push_back({name, p.value});
          }
        step += check_replicas_agree(mesh.tp, replicated,
                                     "Its gradient must be the same on every TP rank before the "
                                     "update (under sequence parallelism: summed over the group).");
        step += check_replicas_agree(mesh.dp, everything,
                                     "Every gradient must be averaged over the DP group before "
                                     "the update.",
                                     "DP");
        if (m.empty()) m = step;
      }
      if (m.empty())
        m += check_held_units("value after " + std::to_string(config.steps) + " steps", mesh,
                              trainer.model(), serial_units, false, within);
      if (m.empty()) return std::string();
      return who(world, mesh) + " differs from single-device training:" + m;
    });
    if (HasFailure()) return;
  }
}

// Point-to-point traffic of the pipeline group in one step: each F of a
// virtual stage other than the last sends its output on, each B of one
// other than the first sends its input gradient back.
struct PipelineTraffic {
  std::int64_t messages = 0, bytes = 0;
};

PipelineTraffic pipeline_formula(const Layout& l, const TrainConfig& c, int p) {
  const int virtual_stages = l.shape.pp * l.chunks;
  const std::int64_t rows = c.batch / l.shape.dp / l.microbatches;
  const std::int64_t boundary = rows * c.seq * c.model.d_model * 8 / (l.sp ? l.shape.tp : 1);
  PipelineTraffic t;
  for (int chunk = 0; chunk < l.chunks; ++chunk) {
    const int v = chunk * l.shape.pp + p;
    const int sends = (v + 1 < virtual_stages) + (v > 0);
    t.messages += std::int64_t{sends} * l.microbatches;
  }
  t.bytes = t.messages * boundary;
  return t;
}

// Parameter elements of one TP rank's slice of @p unit: the lesson's
// formulas as chapter 12's planner writes them (plan::unit_parameters_per_rank,
// proven against the memory tracker in tests/plan): the embedding's token rows
// [V / t, C] and whole positions; a block's q, k, v and fc split by output
// rows, the projections by input columns, LayerNorms and row-parallel biases
// whole; the head's LayerNorm whole and its LM rows [V / t, C].
std::int64_t unit_elements(const GPTConfig& c, int t, int unit) {
  return plan::unit_parameters_per_rank(plan::model_of(c, c.context), unit, t);
}

// The units rank (p, chunk k) holds: virtual stage k pp + p of pp x v
// stages of L / (pp v) blocks, the embedding on the first, the head on the last.
std::vector<int> held_units(const GPTConfig& c, const Layout& l, int p) {
  const int stages = l.shape.pp * l.chunks, per = c.layers / stages;
  std::vector<int> units;
  for (int k = 0; k < l.chunks; ++k) {
    const int v = k * l.shape.pp + p;
    if (v == 0) units.push_back(0);
    for (int b = v * per; b < (v + 1) * per; ++b) units.push_back(1 + b);
    if (v + 1 == stages) units.push_back(c.layers + 1);
  }
  return units;
}

// The TP group's collectives in one step of a rank holding @p units: each
// unit's forward and backward per micro-batch (a recomputed block's forward
// twice), and once after the schedule the sums of the replicated gradients
// under sequence parallelism, as chapter 04's units issue them
// (plan::tensor_parallel_unit_collectives, checked against them by
// tests/plan).
ch04::CommUse tensor_parallel_formula(const Layout& l, const TrainConfig& c,
                                      const std::vector<int>& units) {
  const plan::ModelShape model = plan::model_of(c.model, static_cast<int>(c.seq));
  const std::int64_t tokens = c.batch / l.shape.dp / l.microbatches * c.seq;
  ch04::CommUse use;
  auto add = [&](int u, plan::Pass pass, std::int64_t times) {
    for (const plan::CollectiveCall& call :
         plan::tensor_parallel_unit_collectives(model, u, pass, tokens, 8, l.sp)) {
      use.calls[call.kind] += times;
      use.bytes += call.bytes * times;
    }
  };
  for (int u : units) {
    const bool block = u >= 1 && u <= c.model.layers;
    add(u, plan::Pass::forward, l.microbatches * (block && l.recompute ? 2 : 1));
    add(u, plan::Pass::backward, l.microbatches);
    add(u, plan::Pass::reduction, 1);
  }
  return use;
}

TEST(Puzzle12_2_three_d_step, EachGroupCarriesWhatTheFormulasSay) {
  for (const Layout& l : layouts()) {
    run_and_report("12.2 traffic per group, " + l.str(), l.world(), [&](Comm& world) {
      const TrainConfig config = three_d_config(world.device());
      Mesh mesh = checker_mesh(world, l.shape);
      ThreeDTrainer trainer(config, mesh, l.options());
      Batch batch = trainer.trainer().sampler().batch(0, config.model.device);
      trainer.model().zero_grad();
      const CommStats pp0 = mesh.pp.stats(), dp0 = mesh.dp.stats(), tp0 = mesh.tp.stats();
      three_d_step(mesh, trainer.model(), batch);
      const CommStats pp1 = mesh.pp.stats(), dp1 = mesh.dp.stats();
      std::string m;
      // Pipeline: the boundary tensors, and nothing else.
      const PipelineTraffic want = pipeline_formula(l, config, mesh.pp_index);
      const std::int64_t sent = pp1.messages_sent - pp0.messages_sent;
      const std::int64_t sent_bytes = pp1.bytes_sent - pp0.bytes_sent;
      if (sent != want.messages || sent_bytes != want.bytes)
        m += "\n    pipeline group: sent " + std::to_string(sent) + " messages of " +
             std::to_string(sent_bytes) + " bytes, expected " + std::to_string(want.messages) +
             " of " + std::to_string(want.bytes) +
             " (one per F of a virtual stage but the last and per B of one but the first, "
             "each a micro-batch's boundary tensor" +
             (l.sp ? ": under sequence parallelism the token shard [b T / t, C]" : "") + ")";
      const ch04::CommUse pp_coll = ch04::comm_use(pp0, pp1);
      if (!pp_coll.calls.empty())
        m += "\n    pipeline group: made " + pp_coll.str() +
             ", expected no collectives (the pipeline group only sends and receives in a step)";
      // Data parallel: one averaging all-reduce per unit this rank holds.
      const std::vector<int> units = held_units(config.model, l, mesh.pp_index);
      std::int64_t held_bytes = 0;
      for (int u : units) held_bytes += unit_elements(config.model, l.shape.tp, u) * 8;
      if (l.shape.dp > 1)
        m += ch04::check_comm("the DP group", world.rank(), ch04::comm_use(dp0, dp1),
                              {{"all_reduce", static_cast<std::int64_t>(units.size())}}, held_bytes,
                              "one all-reduce (mean) of each held unit's gradients, once a step");
      else if (!ch04::comm_use(dp0, dp1).calls.empty())
        m += "\n    a DP group of one rank made " + ch04::comm_use(dp0, dp1).str() +
             ": it has nothing to reduce";
      // Tensor parallel: chapter 04's collectives, and the replicated sums once.
      const ch04::CommUse tp_want = tensor_parallel_formula(l, config, units);
      m += ch04::check_comm("the TP group", world.rank(), ch04::comm_use(tp0, mesh.tp.stats()),
                            tp_want.calls, tp_want.bytes,
                            "chapter 04's collectives in each unit's forward and backward of "
                            "every micro-batch" +
                                std::string(l.sp ? ", then the replicated gradients' sums, once "
                                                   "a step (more: summed per micro-batch, or "
                                                   "twice)"
                                                 : ""));
      if (m.empty()) return std::string();
      return who(world, mesh) + ":" + m;
    });
    if (HasFailure()) return;
  }
}

TEST(Puzzle12_2_three_d_step, EachRankHoldsItsShareOfTheModelAndNoMore) {
  for (const Layout& l : layouts()) {
    run_and_report("12.2 memory per rank, " + l.str(), l.world(), [&](Comm& world) {
      const TrainConfig config = three_d_config(world.device());
      Mesh mesh = checker_mesh(world, l.shape);
      std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
      ThreeDTrainer trainer(config, mesh, l.options());
      trainer.step();
      std::int64_t elements = 0;
      std::string units;
      for (int u : held_units(trainer.config().model, l, mesh.pp_index)) {
        elements += unit_elements(trainer.config().model, l.shape.tp, u);
        units += (units.empty() ? "" : ", ") + std::to_string(u);
      }
      const std::int64_t want = elements * 8;
      std::string m;
      // SGD with momentum keeps one buffer per parameter.
      for (MemoryCategory category :
           {MemoryCategory::params, MemoryCategory::grads, MemoryCategory::optimizer}) {
        const std::int64_t got = tracker->live(category);
        if (got != want)
          m += "\n    " + std::string(memory_category_name(category)) + ": " + std::to_string(got) +
               " bytes live after a step, expected " + std::to_string(want) + " (units " + units +
               ", each this TP rank's slice" +
               (got > want ? "; more: a unit of another stage built, or a whole copy kept" : "") +
               ")";
      }
      if (m.empty()) return std::string();
      return who(world, mesh) + ":" + m;
    });
    if (HasFailure()) return;
  }
}

// Full recomputation keeps a block's input alone between its forward and
// backward: on AFAB with every micro-batch alive, the stage's peak of kept
// activations falls, and the backward's forward again shows up as
// MemoryCategory::recompute, with the same gradients (the first checker).
TEST(Puzzle12_2_three_d_step, RecomputationKeepsLessBetweenForwardAndBackward) {
  const Layout plain{{1, 2, 2}, ch05::ScheduleKind::afab, 1, 4, true, false};
  Layout recomputed = plain;
  recomputed.recompute = true;
  if (!world_fits(plain.world())) GTEST_SKIP() << "needs 4 ranks";
  std::vector<std::int64_t> peaks[2], recompute_peaks[2];
  for (int r = 0; r < 2; ++r) {
    const Layout& l = r ? recomputed : plain;
    peaks[r].assign(4, 0);
    recompute_peaks[r].assign(4, 0);
    run_and_report("12.2 memory, " + l.str(), l.world(), [&](Comm& world) {
      const TrainConfig config = three_d_config(world.device());
      Mesh mesh = checker_mesh(world, l.shape);
      ThreeDTrainer trainer(config, mesh, l.options());
      Batch batch = trainer.trainer().sampler().batch(0, config.model.device);
      trainer.model().zero_grad();
      std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
      tracker->reset_peaks();
      three_d_step(mesh, trainer.model(), batch);
      peaks[r][static_cast<std::size_t>(world.rank())] = tracker->peak(MemoryCategory::activations);
      recompute_peaks[r][static_cast<std::size_t>(world.rank())] =
          tracker->peak(MemoryCategory::recompute);
      return std::string();
    });
  }
  for (std::size_t w = 0; w < 4; ++w) {
    if (peaks[0][w] == 0) continue;  // another process's rank (mpi)
    EXPECT_LT(peaks[1][w], peaks[0][w])
        << "world rank " << w << ": with --recompute the peak of kept activations is "
        << peaks[1][w] << " bytes, not below the " << peaks[0][w] << " without it";
    EXPECT_GT(recompute_peaks[1][w], 0) << "world rank " << w << ": nothing was recomputed";
    EXPECT_EQ(recompute_peaks[0][w], 0) << "world rank " << w;
  }
}

}  // namespace
}  // namespace dtp::testing::ch12
