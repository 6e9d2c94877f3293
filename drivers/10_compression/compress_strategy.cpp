// `dtp train --strategy compress`: chapter 10's compressors averaging a
// data-parallel run's gradients (compress_strategy.h says which does what).
#include "drivers/10_compression/compress_strategy.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "drivers/10_compression/zero_plus_plus.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/optim.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch10 {
namespace {

// One quantized all-reduce of a unit's gradients: reduce-scatter in @p bits,
// then all-gather of the averaged shard in 8 bits (qgZ, then qwZ's gather).
void quantized_all_reduce(Comm& comm, Tensor& grads, int bits, std::int64_t block) {
  const ChunkRange mine = chunk_range(grads.numel(), comm.size(), comm.rank());
  Tensor shard = Tensor::empty({mine.length}, grads.dtype(), grads.device(), MemoryCategory::comm);
  quantized_reduce_scatter(comm, grads, shard, bits, block);
  quantized_all_gather(comm, shard, grads, block);
}

class CompressRank : public drivers::RankRun {
 public:
  CompressRank(const TrainConfig& config, const CompressOptions& options, Comm& comm)
      : options_(options), comm_(comm), trainer_(config, comm.rank(), comm.size()) {
    GPT& model = trainer_.model();
    load_parameters(model, config);
    if (options.compressor == "1bit-adam") {
      OneBitAdamConfig adam;
      adam.lr = config.lr;
      adam.beta1 = 0.9;
      adam.beta2 = 0.999;
      adam.warmup_steps = options.onebit_warmup;
      trainer_.set_optimizer(std::make_unique<OneBitAdamOptimizer>(comm, model, adam));
      return;
    }
    if (options.compressor == "zero++") {
      auto zero = std::make_unique<ZeroPlusPlus>(
          comm, model, trainer_.config(),
          parse_zeropp(options.zeropp, options.node_ranks, options.block));
      zero_ = zero.get();
      trainer_.on_after_backward([zero = zero_] { zero->finish_backward(); });
      trainer_.set_optimizer(std::move(zero));
      return;
    }
    if (options.compressor == "sign") {
      for (Unit* unit : model.units())
        signs_.emplace_back(comm, unit->numel(), unit->grads().dtype());
    } else if (options.powersgd_rank > 0) {
      powersgd_ = std::make_unique<PowerSgd>(comm, model, options.powersgd_rank, config.seed);
    }
    trainer_.on_after_backward([this] { average_gradients(); });
  }

  Trainer& trainer() override { return trainer_; }

  StepRecord step() override {
    before_ = comm_.stats();
    if (zero_) node_before_ = zero_->node().stats();
    return trainer_.step();  // resets the tracker's peaks first
  }

  // ZeRO++'s ranks hold shards: rank 0 gathers them into one file.
  void save(Comm& world, const std::string& path,
            const std::vector<RunSetting>& settings) override {
    if (!zero_) return drivers::RankRun::save(world, path, settings);
    std::vector<NamedTensor> gathered = zero_->gather_checkpoint();
    if (world.rank() == 0) trainer_.save_gathered(path, settings, std::move(gathered));
  }

  void resume(const std::string&, const std::vector<RunSetting>&) override {
    throw Error(
        "--strategy compress cannot --resume: the error-feedback residuals and 1-bit Adam's state "
        "are not in the checkpoint, so the run would not continue bit for bit");
  }

  std::vector<double> report_values() override {
    const CommStats after = comm_.stats();
    double gradient_bytes = 0;
    // From the element counts: ZeRO++ releases the units' gradient buffers.
    const double element = static_cast<double>(dtype_size(trainer_.config().model.dtype));
    for (Unit* unit : trainer_.model().units())
      gradient_bytes += static_cast<double>(unit->numel()) * element;
    const double moved = static_cast<double>(after.collective_bytes - before_.collective_bytes);
    if (!zero_) return {moved, moved / gradient_bytes};
    // The node's collectives count on the node's communicator (its own stats).
    const double node = &zero_->node() == &comm_
                            ? 0.0
                            : static_cast<double>(zero_->node().stats().collective_bytes -
                                                  node_before_.collective_bytes);
    const MemoryTracker& tracker = *current_memory_tracker();
    const double params = static_cast<double>(
        tracker.peak(MemoryCategory::params, trainer_.config().model.device.kind));
    return {moved, moved / gradient_bytes, node, params};
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    using drivers::ColumnUnit;
    report.ranks.columns = {{"loss", ColumnUnit::number},
                            {"collective buffers", ColumnUnit::mebibytes},
                            {"/ gradients", ColumnUnit::number}};
    if (zero_) {
      report.ranks.columns.push_back({"node buffers", ColumnUnit::mebibytes});
      report.ranks.columns.push_back({"params peak", ColumnUnit::mebibytes});
    }
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::vector<double> values = rows[r].extra;
      values.insert(values.begin(), rows[r].loss);
      report.ranks.rows.push_back({std::to_string(r), values});
    }
  }

 private:
  void average_gradients() {
    GPT& model = trainer_.model();
    if (powersgd_) return powersgd_->all_reduce_gradients();
    const std::vector<Unit*> units = model.units();
    for (std::size_t u = 0; u < units.size(); ++u) {
      Tensor grads = units[u]->grads();
      if (!signs_.empty())
        signs_[u].all_reduce(grads);
      else
        quantized_all_reduce(comm_, grads, options_.compressor == "int4" ? 4 : 8, options_.block);
    }
  }

  CompressOptions options_;
  Comm& comm_;
  Trainer trainer_;
  std::vector<SignAllReduce> signs_;
  std::unique_ptr<PowerSgd> powersgd_;
  ZeroPlusPlus* zero_ = nullptr;  // owned by the trainer; zero++ only
  CommStats before_, node_before_;
};

}  // namespace

OneBitAdamOptimizer::OneBitAdamOptimizer(Comm& comm, GPT& model, const OneBitAdamConfig& config)
    : Optimizer(param_buffers(model)), adam_(comm, model, config) {}

void OneBitAdamOptimizer::step(double lr) {
  (void)lr;  // 1-bit Adam's step size is its own
  adam_.step();
  ++steps_;
}

double OneBitAdamOptimizer::clip_gradients(double max_norm) {
  (void)max_norm;
  return 0;
}

void CompressStrategy::add_flags(drivers::FlagGroup& flags) {
  drivers::add_world_flag(flags, &options.world, "data-parallel ranks");
  flags.custom(
      "--compress", "sign|int8|int4|powersgd:R|1bit-adam",
      "how gradients travel: 1-bit signs with error feedback (10.2, default), 8- or "
      "4-bit block quantization (10.5), rank-R PowerSGD (10.4), 1-bit Adam (10.3), or "
      "ZeRO-3 with ZeRO++'s quantized and hierarchical collectives (10.5, --zeropp)",
      [this](const std::string& v) {
        options.powersgd_rank = 0;
        if (v == "sign" || v == "int8" || v == "int4" || v == "1bit-adam" || v == "zero++") {
          options.compressor = v;
          return;
        }
        if (v.rfind("powersgd:", 0) == 0) {
          const std::string r = v.substr(9);
          char* end = nullptr;
          const long rank = r.empty() ? 0 : std::strtol(r.c_str(), &end, 10);
          if (!r.empty() && *end == '\0' && rank >= 1 && rank <= 1024) {
            options.compressor = v;
            options.powersgd_rank = static_cast<int>(rank);
            return;
          }
        }
        throw drivers::UsageError(
            "--compress accepts sign, int8, int4, powersgd:R (R from 1 to 1024), "
            "1bit-adam or zero++, got '" +
            v + "'");
      });
  flags.integer("--onebit-warmup", &options.onebit_warmup, 0, 1 << 20, "N",
                "1-bit Adam's steps of exact Adam before the variance freezes (without bias "
                "correction v reaches 1 - 0.999^N of its scale: too few steps make the "
                "compressed steps large)");
  flags.integer("--block", &options.block, 1, 1 << 24, "N",
                "values per quantization block for int8, int4 and zero++");
  flags.custom("--zeropp", "PARTS",
               "with --compress zero++: which of ZeRO++'s parts run, comma-separated: qwz (8-bit "
               "weight all-gather), hpz (a secondary weight shard per node, gathered inside it in "
               "the backward), qgz (4-bit gradient reduce-scatter through all-to-all) or qgz8; "
               "'none' is plain ZeRO-3 (default qwz,hpz,qgz)",
               [this](const std::string& v) {
                 try {
                   (void)parse_zeropp(v, 1, 1);
                 } catch (const Error& e) {
                   throw drivers::UsageError(e.what());
                 }
                 options.zeropp = v;
               });
  flags.integer("--node-ranks", &options.node_ranks, 1, 1 << 20, "G",
                "with --zeropp hpz: ranks per node, the group that holds the secondary shards "
                "(consecutive ranks; must divide --world)");
  flags.paragraph(
      "After each kept step, a row per rank: its loss, the MiB of its collectives' buffers (as "
      "Comm::stats() counts them: an all-reduce's buffer is the gradient, an all-gather's the "
      "gathered whole) and that over the model's gradient bytes. An uncompressed run shows 1; on "
      "the wire an all-gather moves about half as much per buffer byte as an all-reduce. Under "
      "zero++ also the MiB of its collectives inside its hpZ node and its parameter peak.");
}

void CompressStrategy::resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
                               int processes) {
  drivers::default_world_to_processes(options.world, given, processes);
  bool clip_given = false, node_ranks_given = false;
  for (const drivers::GivenFlag& flag : given) {
    clip_given = clip_given || flag.name == "--clip";
    node_ranks_given = node_ranks_given || flag.name == "--node-ranks";
    if ((flag.name == "--zeropp" || flag.name == "--node-ranks") && options.compressor != "zero++")
      throw drivers::UsageError(flag.name + " applies to --compress zero++, not --compress " +
                                options.compressor);
  }
  // hpZ's default node: pairs of ranks where the world splits into pairs.
  if (!node_ranks_given) options.node_ranks = options.world % 2 == 0 ? 2 : 1;
  if (options.compressor == "1bit-adam") {
    if (clip_given && config.grad_clip > 0)
      throw drivers::UsageError(
          "--compress 1bit-adam does not clip (its compressed phase never sees the averaged "
          "gradient): leave out --clip or give --clip 0");
    config.grad_clip = 0;
  }
}

void CompressStrategy::validate(const TrainConfig& config) const {
  DTP_CHECK(options.world >= 1, "compress: --world must be at least 1, got ", options.world);
  DTP_CHECK(config.batch % options.world == 0, "compress: the global batch (--batch ", config.batch,
            ") must divide evenly by --world ", options.world);
  if (options.compressor == "zero++")
    validate_zeropp(parse_zeropp(options.zeropp, options.node_ranks, options.block), options.world);
  DTP_CHECK(config.resume_path.empty(),
            "--strategy compress cannot --resume: the error-feedback residuals and 1-bit Adam's "
            "state are not in the checkpoint");
}

std::vector<RunSetting> CompressStrategy::settings(const TrainConfig& config) const {
  (void)config;
  return {{"--world", std::to_string(options.world)},
          {"--compress", options.compressor},
          {"--onebit-warmup", std::to_string(options.onebit_warmup)},
          {"--block", std::to_string(options.block)},
          {"--zeropp", options.zeropp},
          {"--node-ranks", std::to_string(options.node_ranks)}};
}

std::string CompressStrategy::save_note() const {
  return options.compressor == "zero++" ? "rank 0 gathers every rank's shards into one file" : "";
}

std::string CompressStrategy::header(const TrainConfig& config, const std::string& backend) const {
  std::string how =
      options.compressor == "sign"   ? "1-bit signs with error feedback (10.2)"
      : options.compressor == "int8" ? "8-bit quantized reduce-scatter and all-gather (10.5)"
      : options.compressor == "int4" ? "4-bit quantized reduce-scatter, 8-bit all-gather (10.5)"
      : options.compressor == "zero++"
          ? "ZeRO-3 shards with ZeRO++'s parts " +
                parse_zeropp(options.zeropp, options.node_ranks, options.block).text() + " (10.5)"
      : options.powersgd_rank > 0
          ? "PowerSGD rank " + std::to_string(options.powersgd_rank) + " with error feedback (10.4)"
          : "1-bit Adam, " + std::to_string(options.onebit_warmup) + " exact steps first (10.3)";
  std::string line = "compress: " + std::to_string(options.world) + " ranks (" + backend +
                     " backend), gradients as " + how;
  if (options.compressor == "1bit-adam") {
    char text[200];
    std::snprintf(text, sizeof text,
                  "\ncompress: 1-bit Adam is the optimizer: lr %.2e constant (no warm-up, no "
                  "schedule), betas 0.9 and 0.999, no clipping; the optimizer line below does not "
                  "apply",
                  config.lr);
    line += text;
  }
  return line;
}

std::unique_ptr<drivers::RankRun> CompressStrategy::start(const TrainConfig& config,
                                                          Comm& world) const {
  return std::make_unique<CompressRank>(config, options, world);
}

}  // namespace dtp::ch10

namespace dtp::strategies {
drivers::Strategy& compress() {
  static ch10::CompressStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
