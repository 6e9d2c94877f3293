// Puzzle 4.8: the mesh and the whole tensor-parallel GPT. First-step
// gradients equal the single-device gradients of the same global batch (so a
// wrong scale shows as a ratio), then K steps of training equal single-device
// training, with every replicated parameter bitwise equal across the TP group
// and every parameter bitwise equal across the DP group after every step.
#include <memory>

#include "drivers/04_tensor_parallel/tp_strategy.h"
#include "tp_checks.h"

namespace dtp::testing::ch04 {
namespace {

// tiny_config with heads, vocabulary and tokens that split over 4 ranks.
TrainConfig tp_config() {
  TrainConfig config = tiny_config(/*global_batch=*/8, /*steps=*/3);
  config.model.heads = 4;
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
    Tensor mine = Tensor::from_values({static_cast<double>(world_rank)});
    Tensor all = Tensor::empty(Shape{group.size()}, DType::f64);
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

// The serial model after the first backward of the whole global batch.
std::unique_ptr<Trainer> serial_after_first_backward(const TrainConfig& config) {
  auto trainer = std::make_unique<Trainer>(config);
  Batch batch = trainer->sampler().batch(0);
  trainer->model().zero_grad();
  trainer->model().forward(batch.inputs, batch.targets);
  trainer->model().backward();
  return trainer;
}

TEST(Puzzle4_8_tensor_parallel_gpt, FirstStepGradientsEqualTheSingleDeviceGradients) {
  const TrainConfig config = tp_config();
  std::unique_ptr<Trainer> serial = serial_after_first_backward(config);
  std::vector<Unit*> serial_units = serial->model().units();
  for (const Layout& layout : layouts())
    run_and_report(
        "4.8 first-step gradients, " + layout.str(), layout.tp * layout.dp, [&](Comm& world) {
          Mesh mesh = make_mesh(world, layout.tp);
          TensorParallelTrainer trainer(config, mesh, TensorParallelOptions{layout.sp});
          Batch batch = trainer.sampler().batch(0);
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
                layout.sp ? "(replicated: under sequence parallelism sum it over the TP group in "
                            "finish_backward: the blocks' and the head's LayerNorm)"
                          : "");
          if (m.empty()) return std::string();
          return "world rank " + std::to_string(world.rank()) + " (TP rank " +
                 std::to_string(mesh.tp.rank()) + ", DP rank " + std::to_string(mesh.dp.rank()) +
                 ") differs from the single-device gradient of the same global batch (a k.00x "
                 "ratio: a mean taken "
                 "as a sum, or a reduction done twice):" +
                 m;
        });
}

TEST(Puzzle4_8_tensor_parallel_gpt, TrainingEqualsSingleDeviceTrainingAndReplicasAgreeEveryStep) {
  const TrainConfig config = tp_config();
  Trainer serial(config);
  std::vector<double> serial_losses;
  for (std::int64_t s = 0; s < config.steps; ++s) serial_losses.push_back(serial.step().loss);
  std::vector<Unit*> serial_units = serial.model().units();
  for (const Layout& layout : layouts())
    run_and_report("4.8 training, " + layout.str(), layout.tp * layout.dp, [&](Comm& world) {
      Mesh mesh = make_mesh(world, layout.tp);
      TensorParallelTrainer trainer(config, mesh, TensorParallelOptions{layout.sp});
      std::vector<Unit*> units = trainer.model().units();
      std::string m;
      for (std::int64_t s = 0; s < config.steps && m.empty(); ++s) {
        const double loss = trainer.step().loss;
        if (!close_enough(serial_losses[static_cast<std::size_t>(s)], loss))
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
                                  "DP group before the update.");
      }
      if (m.empty())
        for (std::size_t u = 0; u < units.size(); ++u)
          m += check_unit_slices("value after " + std::to_string(config.steps) + " steps",
                                 mesh.tp.rank(), layout.tp, *serial_units[u], *units[u], false);
      if (m.empty()) return std::string();
      return "world rank " + std::to_string(world.rank()) + " (TP rank " +
             std::to_string(mesh.tp.rank()) + ", DP rank " + std::to_string(mesh.dp.rank()) +
             ") differs from single-device training:" + m;
    });
}

}  // namespace
}  // namespace dtp::testing::ch04
