// Puzzle 12.3: the global gradient norm over the mesh, and clipping by it.
// Every rank is given the exact TP slices of single-device training's
// first-step gradients (so 12.2 does not matter here); the norm must be the
// single-device norm on every rank, and clipping must scale every gradient
// as the runtime's clip_grad_norm does. Then training with clipping on
// equals single-device training with it.
#include <gtest/gtest.h>

#include <cmath>

#include "12_3d_parallelism/three_d_checks.h"

namespace dtp::testing::ch12 {
namespace {

// What a wrong norm usually is, from its square's ratio to the right one.
std::string decode_norm(const Layout& l, double expected, double got, double replicated_squares,
                        double stage_squares, double total_squares) {
  const double g2 = got * got;
  auto near = [&](double a) { return std::fabs(g2 - a) <= 1e-9 * std::fabs(a) + 1e-300; };
  const int t = l.shape.tp;
  if (near(total_squares * l.shape.dp) && l.shape.dp > 1)
    return ": that is the norm with the squares summed over the DP group too (the replicas hold "
           "the same gradients: count them once)";
  if (near(total_squares + (t - 1) * replicated_squares) && t > 1)
    return ": that is the norm with every TP rank counting the replicated parameters (count "
           "them on one TP rank)";
  if (near(stage_squares) && l.shape.pp > 1)
    return ": that is this pipeline stage's norm alone (sum the squares over the pipeline group)";
  (void)expected;
  return "";
}

// The single-device model's gradient norm.
double serial_norm(const std::vector<Unit*>& units) {
  double squares = 0;
  for (Unit* unit : units) squares += ops::sum_squares(unit->grads());
  return std::sqrt(squares);
}

TEST(Puzzle12_3_clip_grad_norm_3d, NormIsTheSingleDeviceNormOnEveryRank) {
  const TrainConfig base = three_d_config(checker_device());
  std::unique_ptr<Trainer> serial = serial_after_first_backward(base);
  const std::vector<Unit*> serial_units = serial->model().units();
  const double expected = serial_norm(serial_units);
  for (const Layout& l : layouts()) {
    run_and_report("12.3 global norm, " + l.str(), l.world(), [&](Comm& world) {
      const TrainConfig config = three_d_config(world.device());
      Mesh mesh = checker_mesh(world, l.shape);
      ThreeDTrainer trainer(config, mesh, l.options());
      install_gradients(mesh, trainer.model(), serial_units);
      // The squares a wrong count would add, from the serial model.
      double replicated = 0, stage = 0;
      for (Unit* unit : trainer.model().units())
        for (const ParamView& p :
             serial_units[static_cast<std::size_t>(unit->index())]->parameters()) {
          const double s = ops::sum_squares(p.grad);
          stage += s;
          if (ch04::is_replicated(p.name)) replicated += s;
        }
      double all_replicated = 0;
      for (Unit* unit : serial_units)
        for (const ParamView& p : unit->parameters())
          if (ch04::is_replicated(p.name)) all_replicated += ops::sum_squares(p.grad);
      const double norm = clip_grad_norm_3d(mesh, trainer.model(), 0.0);
      if (std::fabs(norm - expected) <= 1e-12 + 1e-10 * expected) return std::string();
      return who(world, mesh) + ": clip_grad_norm_3d returned " + number(norm) +
             ", expected the single-device norm " + number(expected) +
             decode_norm(l, expected, norm, all_replicated, stage, expected * expected);
    });
    if (HasFailure()) return;
  }
}

TEST(Puzzle12_3_clip_grad_norm_3d, ClippingScalesEveryGradientAsClipGradNormDoes) {
  const TrainConfig base = three_d_config(checker_device());
  std::unique_ptr<Trainer> serial = serial_after_first_backward(base);
  const std::vector<Unit*> serial_units = serial->model().units();
  const double norm = serial_norm(serial_units);
  // Three limits: half the norm (clips), twice it and 0 (neither clips).
  struct Case {
    double max_norm;
    double factor;
    const char* what;
  };
  const Case cases[] = {{norm / 2, (norm / 2) / (norm + 1e-6),
                         "half the norm: scale by "
                         "max_norm / (norm + 1e-6)"},
                        {norm * 2, 1.0, "twice the norm: leave the gradients alone"},
                        {0.0, 1.0, "0: no clipping"}};
  for (const Case& c : cases)
    for (const Layout& l : layouts()) {
      run_and_report(
          "12.3 clipping at " + std::string(c.what) + ", " + l.str(), l.world(), [&](Comm& world) {
            const TrainConfig config = three_d_config(world.device());
            Mesh mesh = checker_mesh(world, l.shape);
            ThreeDTrainer trainer(config, mesh, l.options());
            install_gradients(mesh, trainer.model(), serial_units);
            clip_grad_norm_3d(mesh, trainer.model(), c.max_norm);
            // The expected gradients: the serial ones times the factor.
            std::string m;
            for (Unit* unit : trainer.model().units())
              for (const ParamView& p : unit->parameters()) {
                const ParamView& f =
                    serial_units[static_cast<std::size_t>(unit->index())]->parameter(p.name);
                std::vector<double> want = ch04::expected_slice(
                    f.grad.to_vector(), f.shape, p.shape, mesh.tp.size(), mesh.tp_index);
                for (double& x : want) x *= c.factor;
                m += ch04::check_values("unit '" + unit->name() + "' gradient of '" + p.name +
                                            "' after clipping at " + c.what,
                                        mesh.tp_index, want, p.grad.to_vector(),
                                        first_step_tolerance(DType::f64));
              }
            if (m.empty()) return std::string();
            return who(world, mesh) + ":" + m;
          });
      if (HasFailure()) return;
    }
}

TEST(Puzzle12_3_clip_grad_norm_3d, TrainingWithClippingEqualsSingleDeviceTraining) {
  TrainConfig base = three_d_config(checker_device());
  base.grad_clip = 0.05;  // below every step's norm here: every step clips
  Trainer serial(base);
  std::vector<double> losses, norms;
  for (std::int64_t s = 0; s < base.steps; ++s) {
    const StepRecord r = serial.step();
    losses.push_back(r.loss);
    norms.push_back(r.grad_norm);
  }
  const std::vector<Unit*> serial_units = serial.model().units();
  for (const Layout& l : layouts()) {
    run_and_report("12.3 training with clipping, " + l.str(), l.world(), [&](Comm& world) {
      TrainConfig config = three_d_config(world.device());
      config.grad_clip = base.grad_clip;
      const Closeness within = training_tolerance(DType::f64);
      Mesh mesh = checker_mesh(world, l.shape);
      ThreeDTrainer trainer(config, mesh, l.options());
      std::string m;
      // Every rank runs every step (one that stopped early would leave the
      // others waiting in a collective); its first difference is reported.
      for (std::int64_t s = 0; s < config.steps; ++s) {
        const StepRecord r = trainer.step();
        const std::size_t i = static_cast<std::size_t>(s);
        if (!m.empty()) continue;
        if (!within.holds(norms[i], r.grad_norm))
          m += "\n    step " + std::to_string(s + 1) + " gradient norm: expected " +
               number(norms[i]) + ", got " + number(r.grad_norm);
        if (!within.holds(losses[i], r.loss))
          m += "\n    step " + std::to_string(s + 1) + " loss: expected " + number(losses[i]) +
               ", got " + number(r.loss);
      }
      if (m.empty())
        m += check_held_units("value after " + std::to_string(config.steps) + " clipped steps",
                              mesh, trainer.model(), serial_units, false, within);
      if (m.empty()) return std::string();
      return who(world, mesh) + " differs from single-device training with clipping at " +
             number(config.grad_clip) + ":" + m;
    });
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace dtp::testing::ch12
