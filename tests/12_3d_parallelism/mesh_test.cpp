// Puzzle 12.1: the device mesh. For every shape dp x pp x tp of every world
// size that fits (1 to 8 rank threads; under mpiexec the processes
// started), each rank's coordinates and the world ranks of each of its
// three groups, in group order, must be the tiers-first placement's:
// w = (d x pp + p) x tp + t. A group that holds the wrong ranks is decoded
// (an axis of another, or TP groups that are not consecutive). Shapes
// that do not make the world are refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "12_3d_parallelism/three_d.h"
#include "dtp/dtp.h"
#include "support/harness.h"
#include "support/training.h"

namespace dtp::testing::mesh {
namespace {

using ch12::MeshShape;

// The world ranks of rank w's group on an axis, in the group's order (by
// that axis's coordinate), as tiers-first placement puts them.
struct Expected {
  std::vector<int> tp, pp, dp;
  int t, p, d;
};

Expected expected_for(const MeshShape& s, int w) {
  Expected e;
  e.t = w % s.tp;
  e.p = (w / s.tp) % s.pp;
  e.d = w / (s.tp * s.pp);
  auto rank = [&](int d, int p, int t) { return (d * s.pp + p) * s.tp + t; };
  for (int t = 0; t < s.tp; ++t) e.tp.push_back(rank(e.d, e.p, t));
  for (int p = 0; p < s.pp; ++p) e.pp.push_back(rank(e.d, p, e.t));
  for (int d = 0; d < s.dp; ++d) e.dp.push_back(rank(d, e.p, e.t));
  return e;
}

std::string list(const std::vector<int>& v) {
  std::string out = "{";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "}";
}

// The world ranks of @p group, in its order.
std::vector<int> members(Comm& group, int world_rank) {
  Tensor mine = Tensor::from_values({static_cast<double>(world_rank)}, DType::f64, group.device());
  Tensor all = Tensor::empty({group.size()}, DType::f64, group.device());
  group.all_gather(mine, all);
  std::vector<int> out;
  for (double v : all.to_vector()) out.push_back(static_cast<int>(v));
  return out;
}

// What a wrong group looks like: the group another axis should have.
std::string decode(const std::vector<int>& got, const Expected& e, const std::string& axis) {
  if (axis != "tp" && got == e.tp) return ": that is this rank's TP group";
  if (axis != "pp" && got == e.pp) return ": that is this rank's pipeline group";
  if (axis != "dp" && got == e.dp) return ": that is this rank's data-parallel group";
  if (axis == "tp" && got.size() == e.tp.size() && got.size() > 1 && got[1] != got[0] + 1)
    return ": a TP group must be consecutive world ranks (one node)";
  return "";
}

std::string check_shape(Comm& world, const MeshShape& shape) {
  const int w = world.rank();
  const ch12::Mesh mesh = ch12::make_mesh(world, shape);
  Comm tp = mesh.tp, pp = mesh.pp, dp = mesh.dp;
  // Every rank gathers its three groups first, whatever it finds after:
  // a rank that stopped early would leave the others in a collective.
  const std::vector<int> got_tp = members(tp, w), got_pp = members(pp, w), got_dp = members(dp, w);
  const Expected e = expected_for(shape, w);
  const std::string who = shape.text() + ", world rank " + std::to_string(w);
  if (mesh.tp_index != e.t || mesh.pp_index != e.p || mesh.dp_index != e.d)
    return who + ": coordinates (dp, pp, tp) = (" + std::to_string(mesh.dp_index) + ", " +
           std::to_string(mesh.pp_index) + ", " + std::to_string(mesh.tp_index) + "), expected (" +
           std::to_string(e.d) + ", " + std::to_string(e.p) + ", " + std::to_string(e.t) +
           "): w = (d x pp + p) x tp + t";
  struct Axis {
    const char* name;
    const Comm* group;
    const std::vector<int>* got;
    const std::vector<int>* want;
    int index;
  };
  for (const Axis& a : {Axis{"tp", &tp, &got_tp, &e.tp, e.t}, Axis{"pp", &pp, &got_pp, &e.pp, e.p},
                        Axis{"dp", &dp, &got_dp, &e.dp, e.d}}) {
    if (*a.got != *a.want)
      return who + ": its " + a.name + " group holds world ranks " + list(*a.got) +
             " in that order, expected " + list(*a.want) + decode(*a.got, e, a.name);
    if (a.group->rank() != a.index)
      return who + ": its rank in the " + a.name + " group is " + std::to_string(a.group->rank()) +
             ", expected its " + a.name + " coordinate " + std::to_string(a.index);
  }
  return "";
}

std::vector<MeshShape> shapes_of(int world) {
  std::vector<MeshShape> shapes;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; tp * pp <= world; ++pp)
      if (world % (tp * pp) == 0) shapes.push_back({world / (tp * pp), pp, tp});
  return shapes;
}

TEST(Puzzle12_1_mesh, EveryShapeOfEveryWorldPlacesTiersFirst) {
  for (int world : all_world_sizes())
    for (const MeshShape& shape : shapes_of(world)) {
      run_and_report("make_mesh(" + shape.text() + ")", world,
                     [&](Comm& comm) { return check_shape(comm, shape); });
      if (HasFailure()) return;
    }
}

TEST(Puzzle12_1_mesh, AShapeThatIsNotTheWorldIsRefused) {
  if (!world_fits(4)) GTEST_SKIP() << "needs 4 ranks";
  struct Case {
    MeshShape shape;
    const char* names;
  };
  for (const Case& c :
       {Case{{2, 2, 2}, "dp 2 x pp 2 x tp 2"}, Case{{1, 1, 2}, "dp 1 x pp 1 x tp 2"},
        Case{{4, 0, 1}, "dp 4 x pp 0 x tp 1"}}) {
    std::vector<std::string> messages(4);
    run_ranks(4, [&](Comm& comm) {
      messages[static_cast<std::size_t>(comm.rank())] =
          error_of([&] { (void)ch12::make_mesh(comm, c.shape); });
    });
    for (const std::string& m : messages) {
      if (m.empty()) continue;  // another process's rank (mpi)
      EXPECT_NE(m.find(c.names), std::string::npos)
          << "make_mesh(" << c.names
          << ") on a world of 4 must be refused naming the shape; got: " << m;
      EXPECT_NE(m.find("4"), std::string::npos) << m;
    }
  }
}

}  // namespace
}  // namespace dtp::testing::mesh
