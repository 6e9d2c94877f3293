// `dtp train --strategy ddp`: the chapter's puzzles wired into the trainer
// (drivers/02_ddp/ddp_strategy.h says how).
#include "drivers/02_ddp/ddp_strategy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "dtp/error.h"
#include "dtp/trace.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch02 {
namespace {

using Clock = std::chrono::steady_clock;

// One optimizer step of K micro-batches, the same bookkeeping as Trainer::step().
StepRecord accumulated_step(Trainer& trainer, std::int64_t k,
                            const std::function<void()>& synchronize) {
  const StepMeter meter;
  const std::int64_t step = trainer.steps_done();
  const TrainConfig& config = trainer.config();
  const BatchSampler& sampler = trainer.sampler();
  const std::int64_t micro = sampler.local_batch() / k;
  std::vector<Batch> micro_batches;
  for (std::int64_t i = 0; i < k; ++i)
    micro_batches.push_back(
        sampler.samples(step, sampler.first_sample() + i * micro, micro, config.model.device));
  StepRecord record;
  record.step = step + 1;
  trainer.model().zero_grad();
  record.loss = accumulation_step(trainer.model(), micro_batches, synchronize);
  DTP_CHECK(std::isfinite(record.loss), "train: the loss is ", record.loss, " at step ",
            record.step, "; try a lower --lr or a tighter --clip");
  record.grad_norm = trainer.optimizer().clip_gradients(config.grad_clip);
  record.lr = config.schedule().at(step);
  {
    trace::Scope span("optimizer step", "compute");
    trainer.optimizer().step(record.lr);
  }
  meter.finish(record, sampler.local_batch() * sampler.seq());
  trainer.count_step();
  return record;
}

std::int64_t all_reduce_calls(const CommStats& stats) {
  auto it = stats.collective_calls.find("all_reduce");
  return it == stats.collective_calls.end() ? 0 : it->second;
}

// One data-parallel rank: a replica, its slice of the batch, and the
// gradient averaging the mode asks for.
class DdpRank : public drivers::RankRun {
 public:
  DdpRank(const TrainConfig& config, const DdpOptions& options, Comm& comm)
      : options_(options), comm_(comm), trainer_(config, comm.rank(), comm.size()) {
    GPT& model = trainer_.model();
    load_parameters(model, config);  // --load: every rank the same file
    auto timed = [this](const std::function<void()>& fn) {
      const auto t0 = Clock::now();
      fn();
      exposed_ += std::chrono::duration<double>(Clock::now() - t0).count();
    };
    if (options.mode == DdpMode::naive) {
      synchronize_ = [this, timed] {
        timed([this] { naive_all_reduce_gradients(comm_, trainer_.model()); });
      };
    } else if (options.mode == DdpMode::flat || options.accumulate > 1) {
      synchronize_ = [this, timed] {
        timed([this] { flat_all_reduce_gradients(comm_, trainer_.model()); });
      };
    } else {
      buckets_ =
          std::make_unique<BucketedAllReduce>(comm, model, resolve_bucket_bytes(options, model));
      synchronize_ = [this, timed] { timed([this] { buckets_->finish(); }); };
    }
    if (options.accumulate == 1) trainer_.on_after_backward(synchronize_);
  }

  Trainer& trainer() override { return trainer_; }

  StepRecord step() override {
    before_ = comm_.stats();
    exposed_ = 0;
    return options_.accumulate == 1 ? trainer_.step()
                                    : accumulated_step(trainer_, options_.accumulate, synchronize_);
  }

  std::vector<double> report_values() override {
    const CommStats after = comm_.stats();
    return {static_cast<double>(all_reduce_calls(after) - all_reduce_calls(before_)),
            static_cast<double>(after.collective_bytes - before_.collective_bytes), exposed_};
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    using drivers::ColumnUnit;
    report.ranks.columns = {{"loss", ColumnUnit::number},
                            {"all-reduces", ColumnUnit::count},
                            {"all-reduced", ColumnUnit::mebibytes},
                            {"exposed", ColumnUnit::milliseconds}};
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const std::vector<double>& e = rows[r].extra;
      report.ranks.rows.push_back({std::to_string(r), {rows[r].loss, e[0], e[1], e[2]}});
    }
  }

 private:
  DdpOptions options_;
  Comm& comm_;
  Trainer trainer_;
  std::unique_ptr<BucketedAllReduce>
      buckets_;  // bucketed mode only; after the trainer, whose model it hooks
  std::function<void()> synchronize_;
  CommStats before_;
  double exposed_ = 0;  // seconds this rank's thread waited on communication this step
};

}  // namespace

const char* ddp_mode_name(DdpMode mode) {
  switch (mode) {
    case DdpMode::naive:
      return "naive";
    case DdpMode::flat:
      return "flat";
    default:
      return "bucketed";
  }
}

std::int64_t default_bucket_bytes(const GPT& model) {
  std::int64_t gradient_bytes = 0;
  for (const Unit* unit : model.units())
    gradient_bytes += static_cast<std::int64_t>(unit->params().nbytes());
  // A bucket closes once it holds at least this much, so the model's
  // gradients make about kDefaultBucketCount buckets: enough that the first
  // all-reduce starts while backward still runs, few enough to stay large.
  return std::max<std::int64_t>(1, gradient_bytes / kDefaultBucketCount);
}

std::int64_t resolve_bucket_bytes(const DdpOptions& options, const GPT& model) {
  return options.bucket_bytes == kAutoBucketBytes ? default_bucket_bytes(model)
                                                  : options.bucket_bytes;
}

void validate_ddp(const TrainConfig& config, const DdpOptions& options) {
  DTP_CHECK(options.world >= 1, "ddp: --world (ranks) must be at least 1, got ", options.world);
  DTP_CHECK(options.accumulate >= 1, "ddp: --accumulate (K) must be at least 1, got ",
            options.accumulate);
  DTP_CHECK(options.bucket_bytes >= 0 || options.bucket_bytes == kAutoBucketBytes,
            "ddp: bucket bytes must be >= 0 (or kAutoBucketBytes), got ", options.bucket_bytes);
  DTP_CHECK(config.batch >= options.world, "ddp: the global batch (--batch ", config.batch,
            ") is smaller than the world size (--world ", options.world,
            "): every rank needs at least one sequence");
  // world x K can overflow for a huge K; batch >= world x K is needed anyway
  // (every micro-batch holds at least one sequence), and checking it by
  // division first keeps the product in range.
  DTP_CHECK(options.accumulate <= config.batch / options.world, "ddp: the global batch (--batch ",
            config.batch, ") must hold at least --world x --accumulate = ", options.world, " x ",
            options.accumulate, " sequences (one per micro-batch and rank)");
  DTP_CHECK(config.batch % (options.world * options.accumulate) == 0,
            "ddp: the global batch (--batch ", config.batch,
            ") must divide evenly by --world x --accumulate = ", options.world, " x ",
            options.accumulate, " = ", options.world * options.accumulate,
            " (equal micro-batches on every rank)");
}

void DdpStrategy::add_flags(drivers::FlagGroup& flags) {
  drivers::add_world_flag(flags, &options.world, "data-parallel ranks");
  flags.custom(
      "--ddp-mode", "MODE", "naive (2.1), flat (2.2) or bucketed (2.3, default)",
      [this](const std::string& v) {
        for (DdpMode mode : {DdpMode::naive, DdpMode::flat, DdpMode::bucketed})
          if (v == ddp_mode_name(mode)) {
            options.mode = mode;
            return;
          }
        throw drivers::UsageError("--ddp-mode accepts naive, flat or bucketed, got '" + v + "'");
      });
  flags.real(
      "--bucket-mb",
      [this](double mib) {
        // Bounded, so the product is far inside an int64 and llround is defined.
        options.bucket_bytes = std::llround(mib * 1024 * 1024);
      },
      0, 1 << 20, "X", "bucket size in MiB for bucketed mode (0: one bucket per parameter)",
      "a quarter of the model's gradients, so about 4 buckets");
  flags.integer("--accumulate", &options.accumulate, 1, 1 << 20, "K",
                "micro-batches per optimizer step; the global batch must divide by world x K");
  flags.paragraph(
      "After each kept step, a row per rank: its loss, its all-reduces and their MiB, and the time "
      "its thread waited on communication (exposed, not overlapped with backward).");
}

void DdpStrategy::resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
                          int processes) {
  (void)config;
  drivers::default_world_to_processes(options.world, given, processes);
}

std::vector<RunSetting> DdpStrategy::settings(const TrainConfig& config) const {
  (void)config;
  // They decide the order gradients are summed in, so the bits.
  return {{"--world", std::to_string(options.world)},
          {"--ddp-mode", ddp_mode_name(options.mode)},
          {"--bucket-mb", options.bucket_bytes == kAutoBucketBytes
                              ? "auto"
                              : std::to_string(options.bucket_bytes) + " bytes"},
          {"--accumulate", std::to_string(options.accumulate)}};
}

std::string DdpStrategy::header(const TrainConfig& config, const std::string& backend) const {
  std::string bucket;
  if (options.mode == DdpMode::bucketed && options.accumulate == 1) {
    char text[64];
    if (options.bucket_bytes == kAutoBucketBytes)
      std::snprintf(text, sizeof text, ", buckets of ~1/%lld of the gradients",
                    static_cast<long long>(kDefaultBucketCount));
    else
      std::snprintf(text, sizeof text, ", bucket %.3f MiB",
                    static_cast<double>(options.bucket_bytes) / 1048576.0);
    bucket = text;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "ddp: %d ranks (%s backend), %s%s, accumulate %lld: %lld sequences per rank per "
                "micro-step",
                options.world, backend.c_str(), ddp_mode_name(options.mode), bucket.c_str(),
                static_cast<long long>(options.accumulate),
                static_cast<long long>(config.batch / (options.world * options.accumulate)));
  return line;
}

std::unique_ptr<drivers::RankRun> DdpStrategy::start(const TrainConfig& config, Comm& world) const {
  return std::make_unique<DdpRank>(config, options, world);
}

}  // namespace dtp::ch02

namespace dtp::strategies {
drivers::Strategy& ddp() {
  static ch02::DdpStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
