// Puzzle 4.8: the mesh and the whole tensor-parallel GPT. First-step
// gradients equal the single-device gradients of the same global batch (so a
// wrong scale shows as a ratio), then K steps of training equal single-device
// training, with every replicated parameter bitwise equal across the TP group
// and every parameter bitwise equal across the DP group after every step;
// the same with each step's batch accumulated over two micro-batches.
#include <memory>

#include "drivers/04_tensor_parallel/tp_strategy.h"
#include "tp_checks.h"

namespace dtp::testing::ch04 {
namespace {

// tiny_config with heads, vocabulary and tokens that split over 4 ranks, its
// model and data on @p on in checker_dtype(on). Its comparisons use
// training.h's tolerances: first_step_tolerance for step 1's gradients,
// training_tolerance after the steps. In f32 those bound 288 tokens' sums
// (chapter 02); a step here adds 64 tokens, and the TP reductions add at
// most 4 partial sums per element, so they bound these too. Measured at most
// 6.9e-8 (a gradient of 0.14), 1.1e-8 (parameters) and 3e-8 (losses).
TrainConfig tp_config(Device on = checker_device()) {
  TrainConfig config = tiny_config(/*global_batch=*/8, /*steps=*/3);
  config.model.heads = 4;
  config.model.device = on;
  config.model.dtype = checker_dtype(on);
  return config;
}

struct Layout {
  int tp, dp;
  bool sp;
  std::string str() const {
    return "tp " + std::to_string(tp) + " x dp " + std::to_string(dp) +
           (sp ? ", sequence-parallel" : "");
  }
};

std::vector<Layout> layouts() {
  std::vector<Layout> all;
  for (bool sp : {false, true})
    for (Layout l : {Layout{2, 1, sp}, Layout{4, 1, sp}, Layout{2, 2, sp}, Layout{4, 2, sp}})
      if (world_fits(l.tp * l.dp)) all.push_back(l);
  return all;
}

std::string mesh_on(Comm& world, int tp) {
  Mesh mesh = make_mesh(world, tp);
  const int w = world.rank();
  std::string m;
  auto members = [](Comm& group, int world_rank) {
    Tensor mine =
        Tensor::from_values({static_cast<double>(world_rank)}, DType::f64, group.device());
    Tensor all = Tensor::empty(Shape{group.size()}, DType::f64, group.device());
    group.all_gather(mine, all);
    return values(all);
  };
  std::vector<double> tp_expected, dp_expected;
  for (int i = 0; i < tp; ++i) tp_expected.push_back(w / tp * tp + i);
  for (int i = 0; i < world.size() / tp; ++i) dp_expected.push_back(w % tp + i * tp);
  const std::string where = "world rank " + std::to_string(w) + " of " +
                            std::to_string(world.size()) + ", tp " + std::to_string(tp) + ": ";
  if (mesh.tp.size() != tp || mesh.tp.rank() != w % tp)
    m += "\n    " + where + "TP group size " + std::to_string(mesh.tp.size()) + " and rank " +
         std::to_string(mesh.tp.rank()) + ", expected " + std::to_string(tp) + " and " +
         std::to_string(w % tp) + " (TP groups are consecutive ranks: TP rank = world rank % tp)";
  else if (members(mesh.tp, w) != tp_expected)
    m += "\n    " + where + "TP group holds world ranks " + number(members(mesh.tp, w).front()) +
         "... expected the consecutive ranks from " + number(tp_expected.front()) +
         " (split color = rank / tp)";
  if (mesh.dp.size() != world.size() / tp || mesh.dp.rank() != w / tp)
    m += "\n    " + where + "DP group size " + std::to_string(mesh.dp.size()) + " and rank " +
         std::to_string(mesh.dp.rank()) + ", expected " + std::to_string(world.size() / tp) +
         " and " + std::to_string(w / tp) +
         " (DP groups hold the ranks with the same TP rank: color = rank % tp)";
  else if (members(mesh.dp, w) != dp_expected)
    m += "\n    " + where + "DP group does not hold world ranks " + number(dp_expected.front()) +
         ", " + number(dp_expected.front() + tp) + ", ... (every tp-th rank)";
  return m;
}

TEST(Puzzle4_8_tensor_parallel_gpt, MakeMeshSplitsTheWorldIntoConsecutiveTensorParallelGroups) {
  for (auto [world, tp] :
       std::vector<std::pair<int, int>>{{4, 2}, {4, 4}, {4, 1}, {8, 2}, {8, 4}, {6, 3}})
    if (world_fits(world))
      run_and_report("4.8 make_mesh, world " + std::to_string(world) + " tp " + std::to_string(tp),
                     world, [tp = tp](Comm& comm) { return mesh_on(comm, tp); });
}

TEST(Puzzle4_8_tensor_parallel_gpt, MakeMeshOfAWorldThatDoesNotSplitIsAnErrorNamingBoth) {
  run_and_report("4.8 make_mesh, world 3 tp 2", 3, [](Comm& comm) -> std::string {
    try {
      make_mesh(comm, 2);
    } catch (const dtp::Error& e) {
      const std::string text = e.what();
      if (text.find('3') != std::string::npos && text.find('2') != std::string::npos) return "";
      return "\n    the error for a world of 3 in TP groups of 2 should name both numbers, got: " +
             text;
    }
    return "\n    make_mesh accepted a world of 3 ranks in TP groups of 2: throw a dtp::Error "
           "naming both";
  });
}

TEST(Puzzle4_8_tensor_parallel_gpt, FirstStepGradientsEqualTheSingleDeviceGradients) {
  std::unique_ptr<Trainer> serial = serial_after_first_backward(tp_config());
  std::vector<Unit*> serial_units = serial->model().units();
  for (const Layout& layout : layouts())
    run_and_report(
        "4.8 first-step gradients, " + layout.str(), layout.tp * layout.dp, [&](Comm& world) {
          const TrainConfig config = tp_config(world.device());
          const Closeness within = first_step_tolerance(config.model.dtype);
          Mesh mesh = make_mesh(world, layout.tp);
          TensorParallelTrainer trainer(config, mesh, TensorParallelOptions{layout.sp});
          Batch batch = trainer.sampler().batch(0, config.model.device);
          TensorParallelGPT& model = trainer.model();
          model.zero_grad();
          model.forward(batch.inputs, batch.targets);
          model.backward();
          model.finish_backward(mesh.dp);
          std::string m;
          std::vector<Unit*> units = model.units();
          for (std::size_t u = 0; u < units.size(); ++u)
            m += check_unit_slices(
                "first-step gradient", mesh.tp.rank(), layout.tp, *serial_units[u], *units[u], true,
                within,
                layout.sp ? "(replicated: under sequence parallelism sum it over the TP group in "
                            "finish_backward: the blocks' and the head's LayerNorm)"
                          : "");
          if (m.empty()) return std::string();
          return "world rank " + std::to_string(world.rank()) + " (TP rank " +
                 std::to_string(mesh.tp.rank()) + ", DP rank " + std::to_string(mesh.dp.rank()) +
                 ") differs from the single-device gradient of the same global batch (a k.00x "
                 "ratio: a mean taken as a sum, or a reduction done twice; " +
                 std::to_string(config.batch / layout.dp * config.seq) +
                 ".00x, the B*T tokens of this rank's batch: 4.6's loss_scale without its "
                 "1/N):" +
                 m;
        });
}

TEST(Puzzle4_8_tensor_parallel_gpt, TrainingEqualsSingleDeviceTrainingAndReplicasAgreeEveryStep) {
  Trainer serial(tp_config());
  std::vector<double> serial_losses;
  for (std::int64_t s = 0; s < serial.config().steps; ++s)
    serial_losses.push_back(serial.step().loss);
  std::vector<Unit*> serial_units = serial.model().units();
  for (const Layout& layout : layouts())
    run_and_report("4.8 training, " + layout.str(), layout.tp * layout.dp, [&](Comm& world) {
      const TrainConfig config = tp_config(world.device());
      const Closeness within = training_tolerance(config.model.dtype);
      Mesh mesh = make_mesh(world, layout.tp);
      TensorParallelTrainer trainer(config, mesh, TensorParallelOptions{layout.sp});
      std::vector<Unit*> units = trainer.model().units();
      std::string m;
      for (std::int64_t s = 0; s < config.steps && m.empty(); ++s) {
        const double loss = trainer.step().loss;
        if (!within.holds(serial_losses[static_cast<std::size_t>(s)], loss))
          m += "\n    step " + std::to_string(s + 1) + " loss: expected " +
               number(serial_losses[static_cast<std::size_t>(s)]) + ", got " + number(loss);
        std::vector<std::pair<std::string, Tensor>> replicated, everything;
        for (std::size_t u = 0; u < units.size(); ++u)
          for (const ParamView& p : units[u]->parameters()) {
            const std::string name = "step " + std::to_string(s + 1) + " unit '" +
                                     units[u]->name() + "' '" + p.name + "'";
            if (p.shape == serial_units[u]->parameter(p.name).shape)
              replicated.push_back({name, p.value});
            everything.push_back({name, p.value});
          }
        m += check_replicas_agree(
            mesh.tp, replicated,
            "Its gradient must be the same on every TP rank (under sequence parallelism: "
            "summed over the group) before the update.");
        m += check_replicas_agree(mesh.dp, everything,
                                  "(across the DP group) Every gradient must be averaged over the "
                                  "DP group before the update.",
                                  "DP");
      }
      if (m.empty())
        for (std::size_t u = 0; u < units.size(); ++u)
          m += check_unit_slices("value after " + std::to_string(config.steps) + " steps",
                                 mesh.tp.rank(), layout.tp, *serial_units[u], *units[u], false,
                                 within);
      if (m.empty()) return std::string();
      return "world rank " + std::to_string(world.rank()) + " (TP rank " +
             std::to_string(mesh.tp.rank()) + ", DP rank " + std::to_string(mesh.dp.rank()) +
             ") differs from single-device training:" + m;
    });
}

// Gradient accumulation: each step's batch runs as two micro-batches (the
// halves of this DP rank's rows), each backward with loss_scale 1/2, then
// finish_backward once and the optimizer. It must equal single-device
// training on the whole batch. Under sequence parallelism the replicated
// gradients are summed over the TP group once per step: summed after every
// backward, the first micro-batch's share counts t times.
constexpr int kMicroBatches = 2;

// Micro-batch k's share of step 1's single-device gradient: the same rows of
// every DP rank's slice, with the loss scaled by 1 / (micro-batches x dp).
UnitGradients micro_batch_share(Trainer& serial, int dp, int k) {
  GPT& model = serial.model();
  model.zero_grad();
  const std::int64_t slice = serial.config().batch / dp, micro = slice / kMicroBatches;
  for (int d = 0; d < dp; ++d) {
    const Batch part =
        serial.sampler().samples(0, d * slice + k * micro, micro, serial.config().model.device);
    model.forward(part.inputs, part.targets);
    model.backward(1.0 / (kMicroBatches * dp));
  }
  return gradients_of(model);
}

// Parameter `p` of serial unit `unit` out of flat per-unit gradients, cut to a TP rank's slice.
std::vector<double> slice_of(const UnitGradients& grads, std::size_t u, Unit& unit,
                             const ParamView& p, int t, int r) {
  const ParamView& f = unit.parameter(p.name);
  const auto begin = grads[u].begin() + f.offset;
  return expected_slice({begin, begin + f.shape.numel()}, f.shape, p.shape, t, r);
}

// Step 1's gradients after two micro-batches against the sum of the two
// shares; names the first three wrong parameters and counts the rest.
std::string check_accumulated_gradients(const UnitGradients& first, const UnitGradients& second,
                                        const std::vector<Unit*>& share_units,
                                        const std::vector<Unit*>& units, int t, int r,
                                        const Closeness& within) {
  std::string m;
  int wrong = 0;
  for (std::size_t u = 0; u < units.size(); ++u)
    for (const ParamView& p : units[u]->parameters()) {
      const std::vector<double> a = slice_of(first, u, *share_units[u], p, t, r);
      const std::vector<double> b = slice_of(second, u, *share_units[u], p, t, r);
      const std::string one = check_values(
          "step 1 gradient of unit '" + units[u]->name() + "' '" + p.name + "'", r, plus(a, b),
          values(p.grad), within,
          {{"t = " + std::to_string(t) +
                " times the first micro-batch's share + the second's: the replicated gradients "
                "were summed over the TP group after every backward. Sum them once per step, "
                "after the last micro-batch (finish_backward)",
            plus(times(a, t), b)},
           {"the last micro-batch's share only: gradients must accumulate over the backward "
            "calls of a step (zero them once, before the first)",
            b},
           {"2.00x the expected: each micro-batch's loss_scale of 1/2 was ignored",
            times(plus(a, b), 2)}});
      if (!one.empty() && ++wrong <= 3) m += one;
    }
  if (wrong > 3) m += "\n    ... and " + std::to_string(wrong - 3) + " more parameters wrong";
  return m;
}

TEST(Puzzle4_8_tensor_parallel_gpt, AccumulatedMicroBatchesEqualSingleDeviceTraining) {
  Trainer serial(tp_config());
  std::vector<double> serial_losses;
  for (std::int64_t s = 0; s < serial.config().steps; ++s)
    serial_losses.push_back(serial.step().loss);
  std::vector<Unit*> serial_units = serial.model().units();
  for (const Layout& layout : layouts()) {
    Trainer shares_model(tp_config());
    const UnitGradients first = micro_batch_share(shares_model, layout.dp, 0);
    const UnitGradients second = micro_batch_share(shares_model, layout.dp, 1);
    std::vector<Unit*> share_units = shares_model.model().units();
    run_and_report(
        "4.8 two accumulated micro-batches per step, " + layout.str(), layout.tp * layout.dp,
        [&](Comm& world) {
          const TrainConfig config = tp_config(world.device());
          const DType dtype = config.model.dtype;
          Mesh mesh = make_mesh(world, layout.tp);
          TensorParallelTrainer trainer(config, mesh, TensorParallelOptions{layout.sp});
          TensorParallelGPT& model = trainer.model();
          std::vector<Unit*> units = model.units();
          const int t = layout.tp, r = mesh.tp.rank();
          const std::int64_t slice = config.batch / layout.dp, micro = slice / kMicroBatches;
          std::string m;
          for (std::int64_t s = 0; s < config.steps; ++s) {
            model.zero_grad();
            double loss = 0;
            for (int k = 0; k < kMicroBatches; ++k) {
              const Batch part = trainer.sampler().samples(s, mesh.dp.rank() * slice + k * micro,
                                                           micro, config.model.device);
              loss += model.forward(part.inputs, part.targets) / kMicroBatches;
              model.backward(1.0 / kMicroBatches);
            }
            model.finish_backward(mesh.dp);
            if (s == 0)
              m += check_accumulated_gradients(first, second, share_units, units, t, r,
                                               first_step_tolerance(dtype));
            trainer.trainer().optimizer().step(trainer.config().schedule().at(s));
            Tensor mean_loss = Tensor::from_values({loss}, DType::f64, world.device());
            if (mesh.dp.size() > 1) mesh.dp.all_reduce(mean_loss, ReduceOp::avg);
            const double expected = serial_losses[static_cast<std::size_t>(s)];
            if (!training_tolerance(dtype).holds(expected, mean_loss.item(0)))
              m += "\n    step " + std::to_string(s + 1) +
                   " loss (the mean of the micro-batches' losses): expected " + number(expected) +
                   ", got " + number(mean_loss.item(0));
          }
          if (m.empty())
            for (std::size_t u = 0; u < units.size(); ++u)
              m += check_unit_slices("value after " + std::to_string(config.steps) + " steps", r, t,
                                     *serial_units[u], *units[u], false, training_tolerance(dtype));
          if (m.empty()) return std::string();
          return "world rank " + std::to_string(world.rank()) + " (TP rank " + std::to_string(r) +
                 ", DP rank " + std::to_string(mesh.dp.rank()) +
                 ") differs from single-device training with " + std::to_string(kMicroBatches) +
                 " micro-batches per step:" + m;
        });
  }
}

}  // namespace
}  // namespace dtp::testing::ch04
