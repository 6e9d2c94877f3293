// `dtp train --strategy compress`: chapter 10's compressors averaging a
// data-parallel run's gradients (compress_strategy.h says which does what).
#include "drivers/10_compression/compress_strategy.h"

#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

#include "dtp/error.h"
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
    return trainer_.step();
  }

  void resume(const std::string&, const std::vector<RunSetting>&) override {
    throw Error(
        "--strategy compress cannot --resume: the error-feedback residuals and 1-bit Adam's state "
        "are not in the checkpoint, so the run would not continue bit for bit");
  }

  std::vector<double> report_values() override {
    const CommStats after = comm_.stats();
    double gradient_bytes = 0;
    for (Unit* unit : trainer_.model().units())
      gradient_bytes += static_cast<double>(unit->grads().nbytes());
    const double moved = static_cast<double>(after.collective_bytes - before_.collective_bytes);
    return {moved, moved / gradient_bytes};
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    using drivers::ColumnUnit;
    report.ranks.columns = {{"loss", ColumnUnit::number},
                            {"collective buffers", ColumnUnit::mebibytes},
                            {"/ gradients", ColumnUnit::number}};
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const std::vector<double>& e = rows[r].extra;
      report.ranks.rows.push_back({std::to_string(r), {rows[r].loss, e[0], e[1]}});
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
  CommStats before_;
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
  flags.custom("--compress", "sign|int8|int4|powersgd:R|1bit-adam",
               "how gradients travel: 1-bit signs with error feedback (10.2, default), 8- or "
               "4-bit block quantization (10.5), rank-R PowerSGD (10.4) or 1-bit Adam (10.3)",
               [this](const std::string& v) {
                 options.powersgd_rank = 0;
                 if (v == "sign" || v == "int8" || v == "int4" || v == "1bit-adam") {
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
                     "--compress accepts sign, int8, int4, powersgd:R (R from 1 to 1024) or "
                     "1bit-adam, got '" +
                     v + "'");
               });
  flags.integer("--onebit-warmup", &options.onebit_warmup, 0, 1 << 20, "N",
                "1-bit Adam's steps of exact Adam before the variance freezes (without bias "
                "correction v reaches 1 - 0.999^N of its scale: too few steps make the "
                "compressed steps large)");
  flags.integer("--block", &options.block, 1, 1 << 24, "N",
                "values per quantization block for int8 and int4");
  flags.paragraph(
      "After each kept step, a row per rank: its loss, the MiB of its collectives' buffers (as "
      "Comm::stats() counts them: an all-reduce's buffer is the gradient, an all-gather's the "
      "gathered whole) and that over the model's gradient bytes. An uncompressed run shows 1; on "
      "the wire an all-gather moves about half as much per buffer byte as an all-reduce.");
}

void CompressStrategy::resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
                               int processes) {
  drivers::default_world_to_processes(options.world, given, processes);
  bool clip_given = false;
  for (const drivers::GivenFlag& flag : given) clip_given = clip_given || flag.name == "--clip";
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
  DTP_CHECK(config.resume_path.empty(),
            "--strategy compress cannot --resume: the error-feedback residuals and 1-bit Adam's "
            "state are not in the checkpoint");
}

std::vector<RunSetting> CompressStrategy::settings(const TrainConfig& config) const {
  (void)config;
  return {{"--world", std::to_string(options.world)},
          {"--compress", options.compressor},
          {"--onebit-warmup", std::to_string(options.onebit_warmup)},
          {"--block", std::to_string(options.block)}};
}

std::string CompressStrategy::header(const TrainConfig& config, const std::string& backend) const {
  (void)config;
  std::string how =
      options.compressor == "sign"   ? "1-bit signs with error feedback (10.2)"
      : options.compressor == "int8" ? "8-bit quantized reduce-scatter and all-gather (10.5)"
      : options.compressor == "int4" ? "4-bit quantized reduce-scatter, 8-bit all-gather (10.5)"
      : options.powersgd_rank > 0
          ? "PowerSGD rank " + std::to_string(options.powersgd_rank) + " with error feedback (10.4)"
          : "1-bit Adam, " + std::to_string(options.onebit_warmup) + " exact steps first (10.3)";
  return "compress: " + std::to_string(options.world) + " ranks (" + backend +
         " backend), gradients as " + how;
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
