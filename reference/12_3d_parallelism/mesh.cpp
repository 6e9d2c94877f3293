// Puzzle 12.1: the device mesh, tiers first. World rank w holds coordinates
// t = w % tp, p = (w / tp) % pp, d = w / (tp x pp). Each group is the ranks
// that share the other two coordinates: split by those (the color), ordered
// by its own coordinate (the key).
#include "12_3d_parallelism/three_d.h"

#include "dtp/error.h"

namespace dtp::ch12 {

Mesh make_mesh(Comm& world, const MeshShape& shape) {
  DTP_CHECK(shape.dp >= 1 && shape.pp >= 1 && shape.tp >= 1, "make_mesh: every axis needs at ",
            "least one rank, got ", shape.text());
  DTP_CHECK(shape.dp * shape.pp * shape.tp == world.size(), "make_mesh: ", shape.text(), " is ",
            shape.dp * shape.pp * shape.tp, " ranks, but the world has ", world.size());
  const int w = world.rank();
  const int t = w % shape.tp, p = (w / shape.tp) % shape.pp, d = w / (shape.tp * shape.pp);
  Mesh mesh{world.split(d * shape.pp + p, t),            // TP: same (d, p)
            world.split(d * shape.tp + t, p),            // PP: same (d, t)
            world.split(p * shape.tp + t, d), t, p, d};  // DP: same (p, t)
  return mesh;
}

}  // namespace dtp::ch12
