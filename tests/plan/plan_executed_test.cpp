// The planner against the executed 3D step (chapter 12's ThreeDTrainer and
// the reference 12.2): on every layout chapter 12's checkers run, on 2, 4
// and 8 GPUs per node, the clock each rank reaches after three_d_step is
// the planner's simulate_step_clock for its pipeline stage, and the bytes
// of parameters, gradients and optimizer state the tracker holds on each
// rank are the planner's stage_memory for that stage, and so are the peaks
// of activations and recomputed activations during three_d_step.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "12_3d_parallelism/three_d_checks.h"
#include "drivers/12_3d_parallelism/plan.h"

namespace dtp::testing::ch12 {
namespace {

// The planner's description of a chapter 12 run of @p l on @p config with
// nodes of @p G GPUs (the whole world when fewer).
plan::PlanInput plan_of(const TrainConfig& config, const Layout& l, int G, const CostModel& net,
                        const CostModel& node) {
  plan::PlanInput input;
  input.model = plan::model_of(config.model, static_cast<int>(config.seq));
  input.cluster.gpus_per_node = std::min(G, l.world());
  input.cluster.nodes = l.world() / input.cluster.gpus_per_node;
  input.cluster.alpha = net.alpha;
  input.cluster.beta = net.beta;
  input.cluster.node_alpha = node.alpha;
  input.cluster.node_beta = node.beta;
  input.layout.tp = l.shape.tp;
  input.layout.pp = l.shape.pp;
  input.layout.dp = l.shape.dp;
  input.layout.global_batch = static_cast<int>(config.batch);
  input.layout.microbatch = static_cast<int>(config.batch) / l.shape.dp / l.microbatches;
  input.layout.schedule = l.kind;
  input.layout.chunks = l.chunks;
  input.layout.sequence_parallel = l.sp;
  input.layout.recompute = l.recompute ? plan::Recompute::full : plan::Recompute::none;
  input.precision = plan::Precision::uniform(DType::f64);
  input.validate();
  return input;
}

TEST(PlanExecuted, TheClockOfEveryRankIsThePlannersForItsStage) {
  const CostModel net{1e-3, 1e-6}, node{1e-4, 1e-8};
  const ch05::ActionCosts costs{0.5, 1.25, 1, 1};
  for (const Layout& l : layouts())
    for (int G : {2, 4, 8}) {
      if (G > l.world() && G != 8) continue;  // the same as G = world
      std::vector<double> clocks(static_cast<std::size_t>(l.world()), -1);
      const TrainConfig base = three_d_config(Device::cpu());
      const plan::PlanInput input = plan_of(base, l, G, net, node);
      run_ranks(
          l.world(),
          [&](Comm& world) {
            const TrainConfig config = three_d_config(world.device());
            Mesh mesh = checker_mesh(world, l.shape);
            ThreeDTrainer trainer(config, mesh, l.options());
            Batch batch = trainer.trainer().sampler().batch(0, config.model.device);
            trainer.model().zero_grad();
            for (ch05::StageModule* s : trainer.model().chunks())
              s->set_clock(mesh.pp, costs, false);
            world.barrier();
            world.reset_stats();
            three_d_step(mesh, trainer.model(), batch);
            clocks[static_cast<std::size_t>(world.rank())] = world.stats().clock;
          },
          input.cluster.cost_model());
      const plan::StepClock predicted =
          plan::simulate_step_clock(input, plan::layout_schedule(input), &costs);
      for (int w = 0; w < l.world(); ++w) {
        const double got = clocks[static_cast<std::size_t>(w)];
        if (got < 0) continue;  // another process's rank (mpi)
        const int p = (w / l.shape.tp) % l.shape.pp;
        const plan::RankClock& want = predicted.stages[static_cast<std::size_t>(p)];
        EXPECT_NEAR(got, want.end, 1e-9 * want.end)
            << l.str() << ", " << input.cluster.gpus_per_node << " GPUs per node, world rank " << w
            << " (stage " << p << "): the executed step's clock ended at " << got
            << ", the planner says " << want.end << " (compute " << want.compute << ", tp "
            << want.tp << ", pp " << want.pp << ", dp " << want.dp << ", idle " << want.idle << ")";
      }
    }
}

TEST(PlanExecuted, EveryRanksStateIsThePlannersToTheByte) {
  for (const Layout& l : layouts()) {
    TrainConfig base = three_d_config(Device::cpu());
    base.optimizer = "adamw";  // m and v: the planner's uniform precision
    const plan::PlanInput input = plan_of(base, l, 8, CostModel{}, CostModel{});
    const ch05::Schedule schedule = plan::layout_schedule(input);
    std::vector<plan::Memory> got(static_cast<std::size_t>(l.world()));
    std::vector<bool> ran(static_cast<std::size_t>(l.world()), false);
    run_ranks(l.world(), [&](Comm& world) {
      TrainConfig config = three_d_config(world.device());
      config.optimizer = "adamw";
      Mesh mesh = checker_mesh(world, l.shape);
      ThreeDTrainer trainer(config, mesh, l.options());
      trainer.step();
      MemoryTracker& tracker = *current_memory_tracker();
      plan::Memory& m = got[static_cast<std::size_t>(world.rank())];
      m.params = tracker.live(MemoryCategory::params);
      m.grads = tracker.live(MemoryCategory::grads);
      m.optimizer = tracker.live(MemoryCategory::optimizer);
      ran[static_cast<std::size_t>(world.rank())] = true;
    });
    for (int w = 0; w < l.world(); ++w) {
      if (!ran[static_cast<std::size_t>(w)]) continue;
      const int p = (w / l.shape.tp) % l.shape.pp;
      const plan::Memory want = plan::stage_memory_under(input, p, schedule);
      const plan::Memory& m = got[static_cast<std::size_t>(w)];
      EXPECT_EQ(m.params, want.params) << l.str() << ", world rank " << w << " params";
      EXPECT_EQ(m.grads, want.grads) << l.str() << ", world rank " << w << " grads";
      EXPECT_EQ(m.optimizer, want.optimizer) << l.str() << ", world rank " << w << " optimizer";
    }
  }
}

// What a difference of @p bytes in an activation peak is, in the tensors a
// micro-batch holds on a rank (N: its tokens; n: this rank's share of them
// under sequence parallelism). In the checkers' small model a logits slice
// or a micro-batch's probabilities may have the same size.
std::string decode_activations(std::int64_t bytes, const plan::PlanInput& input) {
  const plan::Layout& l = input.layout;
  const std::int64_t N = static_cast<std::int64_t>(l.microbatch) * input.model.seq;
  const std::int64_t n = N / (l.sequence_parallel ? l.tp : 1), C = input.model.hidden;
  const std::int64_t e = input.precision.activation_bytes;
  auto count = [&](std::int64_t rows, const char* what) {
    return std::to_string(bytes / (rows * C * e)) + " x one [" + std::to_string(rows) + ", " +
           std::to_string(C) + "] " + what + " kept (or freed) that the other side does not";
  };
  const std::string text = std::to_string(bytes) + " bytes: ";
  if (l.sequence_parallel && bytes % (N * C * e) == 0)
    return text + count(N, "tensor (an all-gathered input, a row-parallel partial sum)");
  if (bytes % (n * C * e) == 0)
    return text + count(n, "activation (a received input, a unit's output, a LayerNorm output)");
  return text + "no whole number of [" + std::to_string(n) + ", " + std::to_string(C) +
         "] activations: a tensor of another shape (q/k/v, probabilities, MLP hidden, logits, "
         "LayerNorm statistics, the loss's sums)";
}

TEST(PlanExecuted, EveryRanksActivationPeaksAreThePlannersToTheByte) {
  for (AttentionKind attention : {AttentionKind::naive, AttentionKind::flash})
    for (const Layout& l : layouts()) {
      TrainConfig base = three_d_config(Device::cpu());
      base.model.attention = attention;
      const plan::PlanInput input = plan_of(base, l, 8, CostModel{}, CostModel{});
      const ch05::Schedule schedule = plan::layout_schedule(input);
      std::vector<ActivationPeaks> got(static_cast<std::size_t>(l.world()));
      std::vector<bool> ran(static_cast<std::size_t>(l.world()), false);
      run_ranks(l.world(), [&](Comm& world) {
        TrainConfig config = three_d_config(world.device());
        config.model.attention = attention;
        Mesh mesh = checker_mesh(world, l.shape);
        ThreeDTrainer trainer(config, mesh, l.options());
        Batch batch = trainer.trainer().sampler().batch(0, config.model.device);
        trainer.model().zero_grad();
        MemoryTracker& tracker = *current_memory_tracker();
        tracker.reset_peaks();
        three_d_step(mesh, trainer.model(), batch);
        ActivationPeaks& peaks = got[static_cast<std::size_t>(world.rank())];
        peaks.activations = tracker.peak(MemoryCategory::activations);
        peaks.recompute = tracker.peak(MemoryCategory::recompute);
        peaks.combined = tracker.peak_activations_with_recompute();
        ran[static_cast<std::size_t>(world.rank())] = true;
      });
      for (int w = 0; w < l.world(); ++w) {
        if (!ran[static_cast<std::size_t>(w)]) continue;  // another process's rank (mpi)
        const int p = (w / l.shape.tp) % l.shape.pp;
        const ActivationPeaks want = plan::runtime_activation_peaks(input, p, schedule);
        const ActivationPeaks& peaks = got[static_cast<std::size_t>(w)];
        const std::string where = l.str() + ", " + attention_kind_name(attention) +
                                  " attention, world rank " + std::to_string(w) + " (stage " +
                                  std::to_string(p) + ")";
        EXPECT_EQ(peaks.activations, want.activations)
            << where << ": the tracker's peak of activations over three_d_step is "
            << peaks.activations << " bytes, the planner's " << want.activations
            << "; the difference is "
            << decode_activations(peaks.activations - want.activations, input);
        EXPECT_EQ(peaks.recompute, want.recompute)
            << where << ": the tracker's peak of recompute (a recomputed block's forward made "
            << "again in its backward) is " << peaks.recompute << " bytes, the planner's "
            << want.recompute
            << (l.recompute ? "; the difference is " +
                                  decode_activations(peaks.recompute - want.recompute, input)
                            : std::string("; nothing is recomputed in this layout"));
        EXPECT_EQ(peaks.combined, want.combined)
            << where << ": the tracker's peak of activations and recompute together is "
            << peaks.combined << " bytes, the planner's " << want.combined << "; the difference is "
            << decode_activations(peaks.combined - want.combined, input);
        EXPECT_EQ(plan::stage_memory_under(input, p, schedule).activations, want.combined)
            << where << ": stage_memory's activations are not the combined peak";
      }
    }
}

}  // namespace
}  // namespace dtp::testing::ch12
