/// @file compress_strategy.h
/// @brief `dtp train --strategy compress` (provided, not a puzzle): data
/// parallelism whose gradients travel compressed, through chapter 10's
/// puzzles.
///
/// Each rank is a replica training on its slice of the batch (as `ddp`);
/// after backward its gradients are averaged by the chosen compressor:
///
/// | --compress | how the gradients travel | puzzle |
/// |---|---|---|
/// | sign | signs, 1 bit each, plus a scale; error feedback | 10.2 |
/// | int8, int4 | quantized reduce-scatter (8 or 4 bits), quantized all-gather (8 bits) | 10.5 |
/// | powersgd:R | rank-R factors of each weight's gradient; error feedback | 10.4 |
/// | 1bit-adam | the optimizer: exact Adam for --onebit-warmup steps, then compressed momentum
/// | 10.3 |
/// | zero++ | ZeRO-3 whose gathers and reduce-scatters are ZeRO++'s (--zeropp parts,
/// zero_plus_plus.h) | 10.5 |
///
/// It runs on the CPU and on GPUs (--device cuda, any backend): the
/// gradients stay on the rank's device, and the compressors compute on host
/// copies and send their codes from comm.device(), so the bytes per step
/// are the same on every device. What the residuals carry is not in a
/// checkpoint, so a compressed run cannot --resume bit for bit: the
/// strategy refuses it.
#pragma once

#include <cstdint>
#include <string>

#include "10_compression/compression.h"
#include "drivers/strategy.h"
#include "dtp/optim.h"

namespace dtp::ch10 {

/// How `--strategy compress` averages gradients.
struct CompressOptions {
  int world = 2;                       ///< data-parallel ranks
  std::string compressor = "sign";     ///< sign, int8, int4, powersgd:R, 1bit-adam or zero++
  int powersgd_rank = 0;               ///< R of powersgd:R
  int onebit_warmup = 100;             ///< 1-bit Adam's exact steps
  std::int64_t block = 256;            ///< values per quantization block (int8, int4, zero++)
  std::string zeropp = "qwz,hpz,qgz";  ///< zero++'s parts (parse_zeropp)
  int node_ranks = 2;                  ///< zero++'s hpZ node: ranks per node
};

/// 1-bit Adam (10.3) as a Trainer's optimizer: step() runs OneBitAdam::step()
/// on the local gradients (it does its own communication). It does not clip
/// (its compressed phase never sees the averaged gradient) and keeps its
/// own learning rate (OneBitAdamConfig::lr), whatever step() is given.
class OneBitAdamOptimizer : public Optimizer {
 public:
  OneBitAdamOptimizer(Comm& comm, GPT& model, const OneBitAdamConfig& config);
  void step(double lr) override;
  std::string name() const override { return "1bit-adam"; }
  double clip_gradients(double max_norm) override;
  /// The 1-bit Adam it runs (its momentum and variance, for reports and checkers).
  const OneBitAdam& adam() const { return adam_; }

 private:
  OneBitAdam adam_;
};

/// The "compress" strategy (chapter 10). Its per-rank report: the loss, the
/// bytes of the rank's collective buffers and their ratio to the model's
/// gradient bytes (an uncompressed all-reduce's buffers); under zero++ also
/// the bytes of its collectives inside its hpZ node and its parameter peak.
class CompressStrategy : public drivers::Strategy {
 public:
  CompressOptions
      options;  ///< what --world, --compress, --onebit-warmup, --block, --zeropp, --node-ranks set

  std::string name() const override { return "compress"; }
  std::string title() const override { return "Compressed data parallel"; }
  std::string chapter() const override { return "10"; }
  void add_flags(drivers::FlagGroup& flags) override;
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override;
  void validate(const TrainConfig& config) const override;
  int world_size() const override { return options.world; }
  std::vector<RunSetting> settings(const TrainConfig& config) const override;
  std::string header(const TrainConfig& config, const std::string& backend) const override;
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override;
  std::string save_note() const override;
};

}  // namespace dtp::ch10
