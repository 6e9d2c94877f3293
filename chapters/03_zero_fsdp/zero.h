/// @file zero.h
/// @brief Chapter 03 contract: ZeRO-1, ZeRO-2, ZeRO-3 / FSDP with prefetch,
/// and optimizer offload.
///
/// Data parallelism (chapter 02) keeps a full copy of everything on every
/// rank: parameters, gradients and optimizer state. ZeRO removes that
/// redundancy one kind of state at a time. Every rank owns a contiguous 1/N
/// **shard** of every unit's flat buffers (shard_range: the DTP chunking rule,
/// so the last shard may be shorter or empty) and keeps only what its stage
/// says for the rest:
///
/// | stage | full on every rank | sharded |
/// |---|---|---|
/// | ZeRO-1 (3.1) | parameters, gradients | optimizer state |
/// | ZeRO-2 (3.2) | parameters | optimizer state, gradients |
/// | ZeRO-3 / FSDP (3.3, 3.4) | (one or two units at a time) | everything |
/// | offload (3.5) | parameters, gradients | optimizer state, in host memory |
///
/// How a stage plugs into training: each stage is an Optimizer (it is what
/// Trainer::step() calls to clip and update), built on ShardedOptimizer,
/// which is provided. A rank builds `Trainer(config, rank, world)`, creates
/// the stage over the trainer's model, registers the stage's work after
/// backward and hands it to the trainer:
///
/// @code
/// Trainer trainer(config, comm.rank(), comm.size());
/// auto zero = std::make_unique<dtp::ch03::Zero1>(comm, trainer.model(), config);
/// trainer.on_after_backward([z = zero.get()] { z->finish_backward(); });
/// trainer.set_optimizer(std::move(zero));
/// for (int s = 0; s < config.steps; ++s) trainer.step();
/// @endcode
///
/// `dtp train --strategy zero` runs the stages so
/// (drivers/03_zero_fsdp/zero_strategy.h). See chapters/03_zero_fsdp/README.md for the memory and
/// communication formulas the checkers hold every stage to.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtp/checkpoint.h"
#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/optim.h"
#include "dtp/tensor.h"
#include "dtp/trainer.h"

/// Chapter 03: ZeRO and FSDP.
namespace dtp::ch03 {

// --- provided: what every stage shares -----------------------------------------

/// The part of @p unit's flat buffers that rank @p rank of @p world owns:
/// chunk_range(unit.numel(), world, rank). Contiguous; the last non-empty
/// shard holds what is left, and a unit with fewer elements than ranks gives
/// the last ranks empty shards.
inline ChunkRange shard_range(const Unit& unit, int world, int rank) {
  return chunk_range(unit.numel(), world, rank);
}

/// Base of every stage (provided, not a puzzle): this rank's shards and the
/// shard-sized optimizer that updates them.
///
/// It owns, per unit u (in model order): the parameter shard (the tensor
/// passed in, shard_range(u) elements), a gradient shard of the same size
/// and device (MemoryCategory::grads, zeroed), and one optimizer from
/// make_optimizer() over all (parameter shard, gradient shard) pairs. So its
/// optimizer state is exactly the shards' size: 1/N of DDP's.
class ShardedOptimizer : public Optimizer {
 public:
  /// After every backward (Trainer::on_after_backward): whatever the stage
  /// must finish so that every gradient shard holds the averaged gradient.
  virtual void finish_backward() = 0;
  /// The global gradient norm over every rank's gradient shards (one
  /// all-reduce of a single number); when it exceeds @p max_norm > 0 the
  /// shards are scaled down as clip_grad_norm() would scale the full
  /// gradient. Returns the norm before clipping. Call it after the stage has
  /// filled the gradient shards (Trainer::step() does, after backward).
  double clip_gradients(double max_norm) override;
  /// "zero1", "zero2", "zero3", "zero3-prefetch" or "zero1-offload".
  std::string name() const override { return name_; }
  /// This rank's shard of unit @p unit (Unit::index()).
  ChunkRange shard(int unit) const;
  /// This rank's parameter shard of unit @p unit.
  Tensor& parameter_shard(int unit);
  /// This rank's gradient shard of unit @p unit (the averaged gradient once
  /// the stage has reduced it).
  Tensor& gradient_shard(int unit);
  /// The shard-sized optimizer (SGD or AdamW, as the config says).
  Optimizer& shard_optimizer() { return *optimizer_; }
  /// Collective (provided): every unit's full parameters and optimizer
  /// state, gathered from every rank's shards to rank 0 under the names a
  /// single-device run's checkpoint gives them (dtp/checkpoint.h). So
  /// `dtp train --strategy zero --save` writes one consolidated file, the
  /// same layout whatever the stage and world, which --load reads under any
  /// strategy. The other ranks get an empty list.
  std::vector<NamedTensor> gather_checkpoint();
  /// Copies this rank's shard of every unit's parameters and optimizer
  /// state from a consolidated @p checkpoint (read from @p path), and each
  /// unit's full parameters where the stage keeps them; then gives the
  /// shard optimizer this optimizer's update count (steps(), which
  /// Trainer::resume_gathered set). Throws dtp::Error naming @p path and a
  /// tensor it lacks or whose size differs.
  void restore_shards(const Checkpoint& checkpoint, const std::string& path);

 protected:
  /// @p parameter_shards holds one tensor per unit of @p model, in model
  /// order, each of shard_range(unit, comm.size(), comm.rank()).length
  /// elements (views into the full parameters, or tensors of their own).
  /// Throws dtp::Error when a shard has the wrong size.
  ShardedOptimizer(std::string name, Comm& comm, GPT& model, const TrainConfig& config,
                   std::vector<Tensor> parameter_shards);
  /// One update of every parameter shard from its gradient shard.
  void update_shards(double lr);

  Comm& comm_;  ///< the data-parallel ranks
  GPT& model_;  ///< this rank's model

 private:
  std::string name_;
  std::vector<ChunkRange> shards_;
  std::vector<Tensor> parameter_shards_;
  std::vector<Tensor> gradient_shards_;
  std::unique_ptr<Optimizer> optimizer_;
};

/// The views of every unit's own shard of its full parameters (provided):
/// unit u's params().slice(shard.offset, shard.length). ZeRO-1 and ZeRO-2
/// keep the full parameters, so their shards are views into them.
std::vector<Tensor> parameter_shard_views(GPT& model, int world, int rank);

// --- the puzzles ---------------------------------------------------------------

/// Puzzle 3.1. ZeRO-1: the optimizer state is sharded.
///
/// Every rank keeps the full parameters and the full gradients (as in DDP).
/// After backward, finish_backward() reduce-scatters every unit's gradient
/// (ReduceOp::avg) into this rank's gradient shard: the same bytes as the
/// first half of a ring all-reduce. step() updates only this rank's
/// parameter shard (a view into the full parameters), then all-gathers every
/// unit's parameters so that every rank holds the whole updated model: the
/// second half. Per step and unit: one reduce-scatter and one all-gather,
/// no all-reduce of gradients.
class Zero1 : public ShardedOptimizer {
 public:
  /// Shards are views into the full parameters (parameter_shard_views).
  Zero1(Comm& comm, GPT& model, const TrainConfig& config);
  /// Reduce-scatters (mean) every unit's full gradient into its gradient
  /// shard. Call it after every backward.
  void finish_backward() override;
  /// Updates this rank's shards, then all-gathers every unit's parameters.
  void step(double lr) override;
};

/// Puzzle 3.2. ZeRO-2: gradients are sharded too.
///
/// The full gradient of a unit lives only while that unit's backward runs.
/// The constructor releases every unit's full gradient buffer (the unit keeps
/// its parameters) and installs two hooks on the model: before a unit's
/// backward (GPT::on_before_backward) allocate a zeroed full gradient buffer
/// for it (Unit::set_buffers); when its gradients are final
/// (GPT::on_grad_ready), reduce-scatter them (mean) into the unit's gradient
/// shard and release the full buffer at once. A rank then never holds more
/// than its gradient shards plus one unit's full gradient. finish_backward()
/// checks that every unit was reduced since the last step. step() is ZeRO-1's
/// (update the shards, all-gather the parameters).
class Zero2 : public ShardedOptimizer {
 public:
  /// Releases the full gradients and installs the hooks. @p comm and
  /// @p model must outlive this object.
  Zero2(Comm& comm, GPT& model, const TrainConfig& config);
  /// Removes the hooks (GPT::clear_hooks).
  ~Zero2() override;
  /// Throws dtp::Error naming the first unit whose gradient was not reduced
  /// since the last step (did backward run?). Call it after every backward.
  void finish_backward() override;
  /// Updates this rank's shards, then all-gathers every unit's parameters.
  void step(double lr) override;

 private:
  std::vector<bool> reduced_;  ///< per unit: reduced since the last step
};

/// Part of puzzle 3.3. This rank's shard_range of every unit's parameters,
/// in model order, copied out of the full parameters into tensors of its own
/// (the unit's dtype and device, MemoryCategory::params): ZeRO-3's parameter
/// shards. Copies, not views, because Zero3 releases the full parameters
/// and a view would keep its whole buffer alive.
std::vector<Tensor> owned_parameter_shards(GPT& model, int world, int rank);

/// Puzzle 3.3. ZeRO-3 / FSDP: parameters are sharded too.
///
/// Between uses, a unit holds nothing: its parameter shards are
/// owned_parameter_shards(), and the constructor releases the unit's full
/// parameters and gradients. Hooks then materialize a unit only while it computes:
/// - before its forward: all-gather its full parameters into a fresh buffer
///   and install it (Unit::set_buffers(full, Tensor()));
/// - after its forward: release them again (set_buffers(Tensor(), Tensor()));
/// - before its backward: all-gather them again, plus a zeroed full gradient;
/// - when its gradients are final: reduce-scatter them (mean) into the
///   gradient shard and release both.
/// Per step and unit: two all-gathers and one reduce-scatter, 1.5x DDP's
/// bytes. step() only updates the shards: the next forward gathers them.
class Zero3 : public ShardedOptimizer {
 public:
  /// Shards the parameters, releases the full buffers, installs the hooks.
  Zero3(Comm& comm, GPT& model, const TrainConfig& config);
  /// Removes the hooks.
  ~Zero3() override;
  /// Throws dtp::Error naming the first unit whose gradient was not reduced
  /// since the last step.
  void finish_backward() override;
  /// Updates this rank's parameter shards (no communication).
  void step(double lr) override;
  /// Installs @p unit's full parameters (and a zeroed full gradient when
  /// @p with_gradient), all-gathered from every rank's shard. The checkers
  /// call it to read a unit's parameters between steps.
  void gather_unit(Unit& unit, bool with_gradient);

 protected:
  /// Shards and releases like the public constructor, named @p name, and
  /// installs no hooks: Zero3Prefetch installs its own.
  Zero3(std::string name, Comm& comm, GPT& model, const TrainConfig& config);
  /// Gives @p unit its gathered @p full parameters (and a zeroed full
  /// gradient when @p with_gradient).
  void install(Unit& unit, Tensor full, bool with_gradient);
  /// Reduce-scatters @p unit's full gradient (mean) into its gradient shard
  /// and releases the unit's full buffers: the grad-ready work both Zero3
  /// and Zero3Prefetch do.
  void reduce_and_release(Unit& unit);
  std::vector<bool> reduced_;  ///< per unit: reduced since the last step
};

/// Puzzle 3.4. FSDP with prefetch: the next unit's all-gather overlaps the
/// current unit's compute.
///
/// Like Zero3, but before unit i's forward starts, unit i+1's all-gather is
/// already started (Comm::iall_gather) so that it travels while unit i
/// computes; in backward the same with unit i-1. A unit whose gather was
/// prefetched only waits for it before it runs. At most two units' full
/// parameters are alive at once: the one computing and the one arriving.
class Zero3Prefetch : public Zero3 {
 public:
  /// As Zero3, with prefetching hooks instead.
  Zero3Prefetch(Comm& comm, GPT& model, const TrainConfig& config);
  /// Waits for a prefetch still in flight (~Zero3 then removes the hooks).
  ~Zero3Prefetch() override;

 private:
  struct InFlight {
    int unit = -1;    ///< Unit::index() being gathered, -1 when none
    Tensor full;      ///< where it lands
    Request request;  ///< the iall_gather
  };
  InFlight next_;
};

/// Part of puzzle 3.5. Host copies (Device::cpu(), MemoryCategory::optimizer)
/// of this rank's shard of every unit's parameters, in model order: the
/// master copy the offloaded optimizer updates.
std::vector<Tensor> host_parameter_shards(GPT& model, int world, int rank);

/// Puzzle 3.5. ZeRO-1 with the optimizer offloaded to host memory.
///
/// The optimizer state and the update live on the host (Device::cpu()): the
/// parameter shards the shard optimizer updates are host_parameter_shards(),
/// and their gradient shards are on the host too. finish_backward() reduce-scatters on the device
/// into a device gradient shard per unit, then copies it to the host one;
/// step() updates the host shards, copies each updated shard back into the
/// device's full parameters and all-gathers them. On a GPU the device holds
/// no optimizer bytes; on the CPU both sides are host memory, so there the
/// checkers can only check the numbers and where the state lives.
class Zero1Offload : public ShardedOptimizer {
 public:
  /// Host copies of the parameter shards (host_parameter_shards); device
  /// gradient shards.
  Zero1Offload(Comm& comm, GPT& model, const TrainConfig& config);
  /// Reduce-scatters every unit's gradient on the device, then copies the
  /// shard to the host.
  void finish_backward() override;
  /// Updates the host shards, copies them back, all-gathers the parameters.
  void step(double lr) override;

 private:
  std::vector<Tensor> device_gradient_shards_;  ///< the reduce-scatter targets
};

}  // namespace dtp::ch03
