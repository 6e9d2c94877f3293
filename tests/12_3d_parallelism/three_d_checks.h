// What chapter 12's step checkers share: the model every 3D run trains,
// the layouts they sweep, the single-device run they are compared with,
// and the gradients and values a rank should hold (its stages' TP slices
// of the serial model's, worked out by chapter 04's checkers from shapes
// alone, never read from the code under test).
//
// Models and data are f64 on the CPU: the 3D composition adds pipeline and
// TP partial sums in another order than one device, and the comparisons
// use training.h's f64 tolerances.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "04_tensor_parallel/tp_checks.h"
#include "12_3d_parallelism/three_d.h"
#include "drivers/12_3d_parallelism/three_d_trainer.h"

namespace dtp::testing::ch12 {

using namespace dtp::ch12;
using ch04::check_unit_slices;

// tiny_config with 4 blocks (pp x v up to 4) and 2 heads (tp 2), a global
// batch of 8 sequences of 8 tokens: 2 DP replicas x 2 micro-batches of 2
// sequences, 16 tokens that split over tp 2 under sequence parallelism.
inline TrainConfig three_d_config(Device on, std::int64_t steps = 3) {
  TrainConfig config = tiny_config(/*global_batch=*/8, steps);
  config.model.layers = 4;
  config.model.device = on;
  config.model.dtype = DType::f64;
  return config;
}

// One 3D layout a checker runs.
struct Layout {
  MeshShape shape;
  ch05::ScheduleKind kind = ch05::ScheduleKind::one_f_one_b;
  int chunks = 1;
  int microbatches = 2;
  bool sp = true;
  bool recompute = false;
  int world() const { return shape.dp * shape.pp * shape.tp; }
  ThreeDOptions options() const { return {kind, microbatches, chunks, sp, recompute}; }
  std::string str() const {
    return shape.text() + ", " + ch05::schedule_kind_name(kind) +
           (chunks > 1 ? " v " + std::to_string(chunks) : "") + ", m " +
           std::to_string(microbatches) + (sp ? ", sequence-parallel" : "") +
           (recompute ? ", recomputed" : "");
  }
};

// The layouts the step checkers sweep (those whose world fits the backend).
inline std::vector<Layout> layouts() {
  using K = ch05::ScheduleKind;
  std::vector<Layout> all;
  for (const Layout& l : {Layout{{2, 2, 2}, K::one_f_one_b, 1, 2, true},
                          Layout{{2, 2, 2}, K::interleaved, 2, 2, true},
                          Layout{{1, 2, 2}, K::one_f_one_b, 1, 2, false},
                          Layout{{1, 4, 2}, K::afab, 1, 4, true, true},
                          Layout{{2, 2, 1}, K::one_f_one_b, 1, 2, false}})
    if (world_fits(l.world())) all.push_back(l);
  return all;
}

// The tiers-first mesh of @p shape, built here rather than by 12.1's
// make_mesh, so 12.2 and 12.3 are graded whatever 12.1 does.
inline Mesh checker_mesh(Comm& world, const MeshShape& shape) {
  const int w = world.rank(), t = w % shape.tp, p = (w / shape.tp) % shape.pp,
            d = w / (shape.tp * shape.pp);
  Comm tp = world.split(d * shape.pp + p, t);
  Comm pp = world.split(d * shape.tp + t, p);
  Comm dp = world.split(p * shape.tp + t, d);
  return Mesh{std::move(tp), std::move(pp), std::move(dp), t, p, d};
}

// "world rank 5 (dp 1, pp 0, tp 1)".
inline std::string who(Comm& world, const Mesh& mesh) {
  return "world rank " + std::to_string(world.rank()) + " (dp " + std::to_string(mesh.dp_index) +
         ", pp " + std::to_string(mesh.pp_index) + ", tp " + std::to_string(mesh.tp_index) + ")";
}

// Compares the gradients (or values) of every unit this rank holds with
// their TP slices of the serial model's units.
// A wrong replicated parameter gets @p hint, but the embedding's position
// table its own: it is whole on every TP rank already.
inline std::string check_held_units(const std::string& what, const Mesh& mesh, ThreeDModel& model,
                                    const std::vector<Unit*>& serial, bool gradients,
                                    const Closeness& within, const std::string& hint = "") {
  std::string m;
  for (Unit* unit : model.units())
    m += check_unit_slices(
        what, mesh.tp_index, mesh.tp.size(), *serial[static_cast<std::size_t>(unit->index())],
        *unit, gradients, within,
        unit->index() == 0 && !hint.empty()
            ? "(the position table: 4.5's backward gathers every token's gradient, so it is "
              "whole on every TP rank already; reduce it over DP only, never over TP)"
            : hint);
  return m;
}

// Installs the TP slices of the serial model's gradients into every unit
// this rank holds (so 12.3 is checked on exact gradients, whatever 12.2 does).
inline void install_gradients(const Mesh& mesh, ThreeDModel& model,
                              const std::vector<Unit*>& serial) {
  for (Unit* unit : model.units())
    for (ParamView& p : unit->parameters()) {
      const ParamView& f = serial[static_cast<std::size_t>(unit->index())]->parameter(p.name);
      p.grad.copy_from(ch04::tensor_of(
          ch04::expected_slice(f.grad.to_vector(), f.shape, p.shape, mesh.tp.size(), mesh.tp_index),
          p.shape, p.grad.device()));
    }
}

}  // namespace dtp::testing::ch12
