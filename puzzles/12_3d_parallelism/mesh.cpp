// Chapter 12 — 3D parallelism: the device mesh (12.1).
//
// Replace the `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 12
// The contract is in chapters/12_3d_parallelism/three_d.h; the lesson is in
// chapters/12_3d_parallelism/README.md.
//
// Tools you may use:
//   world.rank(), world.size()
//   world.split(color, key)       a communicator of the ranks that passed the same color,
//                                 ordered by key; every rank calls it
//   shape.dp, shape.pp, shape.tp, shape.text()
//   Mesh{tp_group, pp_group, dp_group, tp_index, pp_index, dp_index}
//   DTP_CHECK(condition, "message parts", value, ...)
//                                 throws dtp::Error with the message
#include "12_3d_parallelism/three_d.h"

namespace dtp::ch12 {

Mesh make_mesh(Comm& world, const MeshShape& shape) {
  // About 12 lines: check the shape; find this rank's three coordinates
  // from its world rank; three splits, each grouping the ranks that share
  // the other two coordinates and ordering them by their own.
  (void)world;
  (void)shape;
  throw dtp::NotSolved("12.1 mesh");
}

}  // namespace dtp::ch12
