/// @file zero_plus_plus.h
/// @brief ZeRO++ training (provided, not a puzzle): ZeRO-3 whose three
/// collectives are puzzle 10.5's.
///
/// Every rank owns a 1/N shard of every unit's parameters (dtp::chunk_range
/// over the world), its gradient shard and a shard-sized optimizer, as in
/// chapter 03's ZeRO-3. A unit's full parameters exist only while it
/// computes; the parts say how they travel:
///
/// | moment | plain ZeRO-3 | with the part |
/// |---|---|---|
/// | before a unit's forward | all-gather (world) | qwZ: quantized_all_gather, 8 bits |
/// | after its forward | release | hpZ: keep secondary_shard (node), release |
/// | before its backward | all-gather again (world) | hpZ: secondary_all_gather (node) |
/// | its gradients final | reduce-scatter, mean (world) | qgZ: quantized_reduce_scatter |
///
/// Without hpZ the backward gathers as the forward did (quantized under
/// qwZ). The "node" is the communicator of hpz_ranks consecutive world
/// ranks (world.split(rank / hpz_ranks)), the ranks a cluster places in one
/// node and CostModel::with_nodes charges the inside link. With no part on
/// this is ZeRO-3 exactly: the uncompressed peer the benchmark measures
/// ZeRO++ against.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/gpt.h"
#include "dtp/optim.h"
#include "dtp/trainer.h"

namespace dtp::ch10 {

/// Which of ZeRO++'s three parts are on.
struct ZeroPlusPlusParts {
  bool qwz = false;          ///< the weights' all-gathers quantized to 8 bits
  int hpz_ranks = 0;         ///< hpZ's group: ranks per node; 0: no secondary partition
  int qgz_bits = 0;          ///< qgZ's bits per gradient code, 4 or 8; 0: plain reduce-scatter
  std::int64_t block = 256;  ///< values per quantization block (qwZ, qgZ)

  /// "qwz,hpz:2,qgz:4", or "none".
  std::string text() const;
};

/// Parses `--zeropp`'s list: "none", or any of "qwz", "hpz", "qgz" (4-bit
/// gradients, as the paper) and "qgz8", comma-separated, each at most once;
/// hpz takes @p hpz_ranks. Throws dtp::Error naming what it expected.
ZeroPlusPlusParts parse_zeropp(const std::string& text, int hpz_ranks, std::int64_t block);

/// Throws dtp::Error unless @p parts fit a world of @p world ranks: hpz_ranks
/// from 1 to world dividing it, qgz_bits 0, 4 or 8, block at least 1.
void validate_zeropp(const ZeroPlusPlusParts& parts, int world);

/// ZeRO-3 with ZeRO++'s parts, as the file comment says. An Optimizer: the
/// Trainer calls clip_gradients() and step(); finish_backward() goes after
/// every backward (Trainer::on_after_backward).
class ZeroPlusPlus : public Optimizer {
 public:
  /// Copies this rank's shards out of @p model's full parameters, releases
  /// them, splits the node communicator (collective over @p world) and
  /// installs the hooks. @p world and @p model must outlive this object.
  ZeroPlusPlus(Comm& world, GPT& model, const TrainConfig& config, const ZeroPlusPlusParts& parts);
  /// Removes the hooks.
  ~ZeroPlusPlus() override;
  ZeroPlusPlus(const ZeroPlusPlus&) = delete;
  ZeroPlusPlus& operator=(const ZeroPlusPlus&) = delete;

  /// Updates this rank's parameter shards (no communication).
  void step(double lr) override;
  /// The shard optimizer's name: "sgd" or "adamw".
  std::string name() const override;
  /// The norm of the averaged gradient over every rank's shards (one
  /// all-reduce of one number); clips the shards as clip_grad_norm would.
  double clip_gradients(double max_norm) override;
  /// Throws dtp::Error naming the first unit whose gradient was not
  /// reduced since the last step (did backward run?).
  void finish_backward();

  /// The parts this run uses.
  const ZeroPlusPlusParts& parts() const { return parts_; }
  /// The hpZ node (the world's ranks hpz_ranks at a time); the world
  /// communicator itself when hpZ is off.
  Comm& node() { return node_ ? *node_ : world_; }
  /// This rank's parameter shard of unit @p unit (chunk world.rank() of its numel).
  const Tensor& parameter_shard(int unit) const;
  /// This rank's gradient shard of unit @p unit: the averaged gradient's
  /// chunk once the unit's backward reduced it.
  const Tensor& gradient_shard(int unit) const;
  /// Collective over the world: every unit's full parameters and optimizer
  /// state on rank 0, under a single-device checkpoint's names (plain
  /// gathers, not quantized); the other ranks get an empty list.
  std::vector<NamedTensor> gather_checkpoint();

 private:
  void gather_for_forward(Unit& unit);
  void keep_secondary_and_release(Unit& unit);
  void gather_for_backward(Unit& unit);
  void reduce_and_release(Unit& unit);
  Tensor gather_from_world(const Unit& unit);

  Comm& world_;
  GPT& model_;
  ZeroPlusPlusParts parts_;
  std::unique_ptr<Comm> node_;            // hpZ's group; null when off
  std::vector<Tensor> parameter_shards_;  // per unit: chunk world.rank()
  std::vector<Tensor> gradient_shards_;   // per unit, the same length
  std::vector<Tensor> secondary_shards_;  // per unit, between its forward and backward (hpZ)
  std::vector<bool> reduced_;             // per unit: reduced since the last step
  std::unique_ptr<Optimizer> optimizer_;  // over (parameter shard, gradient shard) pairs
};

}  // namespace dtp::ch10
