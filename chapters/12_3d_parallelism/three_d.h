/// @file three_d.h
/// @brief Chapter 12 contract: 3D parallelism on a device mesh.
///
/// Every pairing of the earlier chapters had two axes: data x tensor
/// (chapter 04), pipeline x data (chapter 05). A large run uses three at
/// once, and where each group's ranks sit decides which link each of its
/// collectives crosses. The mesh puts the chattiest axis on the fastest
/// links: tensor parallelism talks at every layer, so its groups are
/// consecutive ranks (one node); pipeline parallelism sends one activation
/// per micro-batch between neighbours; data parallelism reduces once a
/// step, so it is the outermost axis. Sequence parallelism (chapter 04's)
/// is not an axis of its own: it shards activations over the TP group.
/// See chapters/12_3d_parallelism/README.md.
#pragma once

#include <string>

#include "dtp/comm.h"
#include "dtp/error.h"

/// Chapter 12: 3D parallelism.
namespace dtp::ch12 {

/// The sizes of the mesh's three axes; their product is the world size.
struct MeshShape {
  int dp = 1;  ///< data-parallel replicas (outermost)
  int pp = 1;  ///< pipeline stages
  int tp = 1;  ///< tensor-parallel ranks (innermost: one node)
  /// "dp 2 x pp 2 x tp 2".
  std::string text() const;
};

/// One rank's place in the mesh: its three groups and its coordinate on
/// each axis (the group's rank: tp.rank() == tp_index, ...).
struct Mesh {
  Comm tp;           ///< the ranks that differ from this one in their TP coordinate only
  Comm pp;           ///< ... in their pipeline coordinate only
  Comm dp;           ///< ... in their data-parallel coordinate only
  int tp_index = 0;  ///< t: this rank's place in its TP group
  int pp_index = 0;  ///< p: its pipeline stage
  int dp_index = 0;  ///< d: its data-parallel replica
};

/// Puzzle 12.1. Splits @p world into the mesh of @p shape, tiers first:
/// world rank w = (d x pp + p) x tp + t for coordinates (d, p, t). So a TP
/// group is tp consecutive ranks, a pipeline group the ranks tp apart with
/// the same d, a data-parallel group the ranks pp x tp apart; inside each
/// group the ranks are ordered by their coordinate. Every rank calls it
/// (three Comm::split). Throws dtp::Error naming the shape and the world
/// size when an axis is below 1 or dp x pp x tp is not the world size.
/// World 8 as dp 2 x pp 2 x tp 2: TP groups {0,1} {2,3} {4,5} {6,7}, pipeline
/// groups {0,2} {1,3} {4,6} {5,7}, data-parallel groups {0,4} {1,5} {2,6} {3,7}.
Mesh make_mesh(Comm& world, const MeshShape& shape);

}  // namespace dtp::ch12
