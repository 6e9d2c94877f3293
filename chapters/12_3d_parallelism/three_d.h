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

#include <memory>
#include <string>
#include <vector>

#include "04_tensor_parallel/tensor_parallel.h"
#include "05_pipeline/pipeline.h"
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

// --- provided: this rank's part of the model --------------------------------------------

/// How a 3D run cuts and schedules the model.
struct ThreeDOptions {
  /// The pipeline schedule: afab, 1f1b or interleaved (zb-h1 splits the
  /// backward, which chapter 04's units do not).
  ch05::ScheduleKind schedule = ch05::ScheduleKind::one_f_one_b;
  int microbatches = 2;           ///< m: micro-batches per step of each DP replica
  int chunks = 1;                 ///< v: model chunks per rank (>= 2 for interleaved)
  bool sequence_parallel = true;  ///< shard activations over the TP group between the linears
  /// Full activation recomputation (chapter 09): a block keeps only its
  /// input from its forward and runs the forward again in its backward
  /// (MemoryCategory::recompute), TP collectives included.
  bool recompute = false;
};

/// The virtual stages of a GPT of @p layers blocks cut into @p virtual_stages
/// (p x v) pieces of layers / (p x v) blocks each; the embedding joins the
/// first piece, the head the last (unit 0 is the embedding, unit L + 1 the
/// head). Throws dtp::Error naming both when the layers do not divide.
std::vector<ch05::UnitRange> three_d_partition(int layers, int virtual_stages);

/// This rank's part of a GPT on the mesh (provided): for each of its v
/// model chunks (virtual stages pp_index, pp_index + pp, ...), chapter 04's
/// tensor-parallel units of that stage over mesh.tp, run by a chapter 05
/// StageModule, so chapter 05's executor (5.7) runs them. Under sequence
/// parallelism what crosses a stage boundary is the token shard [b T / t, C].
/// Units of other stages are not built: a rank holds 1/(pp x tp) of the model.
class ThreeDModel {
 public:
  /// Copies this rank's slices of its stages out of @p full (the serial
  /// model, the same on every rank). Throws dtp::Error naming the flag-like
  /// setting at fault: heads, vocabulary or MLP width not divisible by tp,
  /// layers not divisible by pp x v, an interleaved schedule with v < 2 or
  /// m not a multiple of pp, a zb-h1 schedule. @p mesh must outlive it.
  ThreeDModel(Mesh& mesh, const GPT& full, const ThreeDOptions& options);
  ~ThreeDModel();

  /// The pipeline schedule of the step (the same on every rank; chapter
  /// 05's make_schedule, built on the first call).
  const ch05::Schedule& schedule();
  /// This rank's stages, chunk 0 first: what execute_schedule takes.
  std::vector<ch05::StageModule*> chunks();
  /// Every unit this rank holds, chunk by chunk, in forward order.
  std::vector<Unit*> units();
  /// The tensor-parallel blocks among them.
  std::vector<ch04::TensorParallelBlock*> blocks();
  /// The head, or nullptr when this rank does not hold the last stage.
  ch04::TensorParallelHead* head();
  /// Whether activations are token shards between the linears.
  bool sequence_parallel() const { return options_.sequence_parallel; }
  /// @p batch (this DP replica's rows, [B / dp, T]) cut into m micro-batches.
  /// Throws dtp::Error when the rows do not split into m, or (under sequence
  /// parallelism) a micro-batch's tokens not into tp shards.
  std::vector<ch05::MicroBatch> microbatches(const Batch& batch) const;
  /// Zeroes the gradients of every unit this rank holds.
  void zero_grad();
  /// The serial model's config.
  const GPTConfig& config() const { return config_; }
  /// The options it was built with.
  const ThreeDOptions& options() const { return options_; }

 private:
  class Runner;
  Mesh& mesh_;
  GPTConfig config_;
  ThreeDOptions options_;
  ch05::Schedule schedule_;
  std::shared_ptr<Runner> runner_;
  std::vector<std::unique_ptr<ch05::StageModule>> stages_;
};

// --- puzzles 2 and 3: one step on the mesh ---------------------------------------------

/// Puzzle 12.2. One step's gradients on the mesh, for this DP replica's rows
/// @p batch: run the schedule of @p model over the pipeline group on its
/// micro-batches (chapter 05's execute_schedule), then make every gradient
/// the one single-device training would hold for the whole global batch:
/// - under sequence parallelism each rank saw only its token shard, so the
///   replicated gradients (every block's, and the head's LayerNorm on the
///   last stage) are partial sums over the TP group: sum them there, once;
/// - each DP replica saw its own rows: every gradient this rank holds
///   becomes its mean over the DP group (a group of one rank needs
///   nothing, and the checkers count the calls).
/// The gradients must be zero before the call (the trainer zeroes them).
/// Returns the mean loss of this replica's micro-batches on the ranks of
/// the last stage, 0 on the others (as execute_schedule does).
double three_d_step(Mesh& mesh, ThreeDModel& model, const Batch& batch);

/// Puzzle 12.3. The global gradient norm over the mesh: the 2-norm of every
/// gradient of the whole (unsharded) model, the same number on every rank,
/// after three_d_step. A TP-sharded gradient's squares are summed over the
/// TP group; a replicated one (chapter 04's is_replicated) is the same on
/// every TP rank and counts once; the stages hold different units, so the
/// pipeline group sums too; the DP replicas hold the same gradients and must
/// not. When @p max_norm > 0 and the norm is finite and exceeds it, scales every
/// gradient this rank holds by max_norm / (norm + 1e-6) (the runtime's
/// clip_grad_norm). Returns the norm before clipping.
double clip_grad_norm_3d(Mesh& mesh, ThreeDModel& model, double max_norm);

}  // namespace dtp::ch12
