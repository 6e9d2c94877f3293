// `dtp train --strategy ddp`: the chapter's puzzles wired into the trainer.
// Provided code, not a puzzle (see drivers/README.md): the plumbing every
// data-parallel chapter repeats. A rank builds Trainer(config, rank, world)
// so its sampler yields its slice of the global batch, and plugs gradient
// averaging in where it belongs:
//   K = 1: Trainer::step() with on_after_backward (2.1, 2.2, 2.3's finish);
//          2.3 also hooks the model's grad-ready callbacks.
//   K > 1: a step written out here around accumulation_step (2.4); the one
//          synchronization per step is flat (2.2), or naive (2.1) in naive mode.
// Checkpoints: the replicas are equal, so every rank starts from the same
// --load or --resume file and rank 0 alone writes --save.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "02_ddp/ddp.h"
#include "dtp/agreement.h"
#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/trace.h"

namespace dtp::ch02 {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One optimizer step of K micro-batches, the same bookkeeping as Trainer::step().
StepRecord accumulated_step(Trainer& trainer, std::int64_t step, std::int64_t k,
                            const std::function<void()>& synchronize) {
  const StepMeter meter;
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

// The strategy's own settings: what every rank must share beside the
// trainer's, and what a resumed run must share with the saved one (they
// decide the order gradients are summed in, so the bits).
std::vector<RunSetting> ddp_own_settings(const DdpOptions& options, int world) {
  const char* modes[] = {"naive", "flat", "bucketed"};
  return {{"--world", std::to_string(world)},
          {"--ddp-mode", modes[static_cast<int>(options.mode)]},
          {"--bucket-mb", options.bucket_bytes == kAutoBucketBytes
                              ? "auto" : std::to_string(options.bucket_bytes) + " bytes"},
          {"--accumulate", std::to_string(options.accumulate)}};
}

// What rank 0 gathers from every rank after each step, beside its loss,
// seconds and tokens (reporting traffic, taken after the step was measured).
enum Gathered { kAllReduces, kBytes, kExposed };

TrainResult run_ddp(const TrainConfig& config, const DdpOptions& options, const StepCallback& on_step) {
  validate_ddp(config, options);
  const auto start = Clock::now();
  TrainResult result;
  result.peak_by_category.assign(kMemoryCategoryCount, 0);
  launch(World::from_env(options.world), [&](Comm& comm) {
    Trainer trainer(config, comm.rank(), comm.size());
    GPT& model = trainer.model();
    const std::vector<RunSetting> own = ddp_own_settings(options, comm.size());
    const std::int64_t last = start_from_checkpoints(trainer, own);
    check_ranks_agree(comm, run_settings(config, own), model);
    double exposed = 0;  // seconds this rank's thread waited on communication this step
    auto timed = [&exposed](const std::function<void()>& fn) {
      const auto t0 = Clock::now();
      fn();
      exposed += seconds_since(t0);
    };
    std::function<void()> synchronize;
    std::unique_ptr<BucketedAllReduce> buckets;
    if (options.mode == DdpMode::naive) {
      synchronize = [&] { timed([&] { naive_all_reduce_gradients(comm, model); }); };
    } else if (options.mode == DdpMode::flat || options.accumulate > 1) {
      synchronize = [&] { timed([&] { flat_all_reduce_gradients(comm, model); }); };
    } else {
      buckets = std::make_unique<BucketedAllReduce>(comm, model, resolve_bucket_bytes(options, model));
      synchronize = [&] { timed([&] { buckets->finish(); }); };
    }
    if (options.accumulate == 1) trainer.on_after_backward(synchronize);
    if (comm.rank() == 0) {
      result.parameters = model.parameter_count();
      result.data_name = trainer.sampler().data().name();
    }
    std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
    for (std::int64_t s = trainer.steps_done(); s < last; ++s) {
      const CommStats before = comm.stats();
      exposed = 0;
      StepRecord record = options.accumulate == 1
                              ? trainer.step()
                              : accumulated_step(trainer, s, options.accumulate, synchronize);
      const CommStats after = comm.stats();
      const auto calls = [](const CommStats& st) {
        auto it = st.collective_calls.find("all_reduce");
        return it == st.collective_calls.end() ? std::int64_t{0} : it->second;
      };
      const std::vector<double> values = {static_cast<double>(calls(after) - calls(before)),
                                          static_cast<double>(after.collective_bytes - before.collective_bytes),
                                          exposed};
      const std::vector<RankStepRow> rows = report_group_step(comm, record, values);
      if (comm.rank() != 0) continue;
      std::vector<RankCommStep> ranks;
      for (int r = 0; r < comm.size(); ++r) {
        const RankStepRow& row = rows[static_cast<std::size_t>(r)];
        ranks.push_back({r, row.loss, static_cast<std::int64_t>(row.extra[kAllReduces]),
                         static_cast<std::int64_t>(row.extra[kBytes]), row.extra[kExposed]});
      }
      result.add_step(record, *tracker);
      if (on_step) on_step(record);
      if (options.on_comm) options.on_comm(record.step, ranks);
    }
    if (comm.rank() == 0 && !config.save_path.empty()) trainer.save(config.save_path, own);
  });
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace

std::int64_t default_bucket_bytes(const GPT& model) {
  std::int64_t gradient_bytes = 0;
  for (const Unit* unit : model.units()) gradient_bytes += static_cast<std::int64_t>(unit->params().nbytes());
  // A bucket closes once it holds at least this much, so the model's
  // gradients make about kDefaultBucketCount buckets: enough that the first
  // all-reduce starts while backward still runs, few enough to stay large.
  return std::max<std::int64_t>(1, gradient_bytes / kDefaultBucketCount);
}

std::int64_t resolve_bucket_bytes(const DdpOptions& options, const GPT& model) {
  return options.bucket_bytes == kAutoBucketBytes ? default_bucket_bytes(model) : options.bucket_bytes;
}

void validate_ddp(const TrainConfig& config, const DdpOptions& options) {
  DTP_CHECK(options.world >= 1, "ddp: --world (ranks) must be at least 1, got ", options.world);
  DTP_CHECK(options.accumulate >= 1, "ddp: --accumulate (K) must be at least 1, got ", options.accumulate);
  DTP_CHECK(options.bucket_bytes >= 0 || options.bucket_bytes == kAutoBucketBytes,
            "ddp: bucket bytes must be >= 0 (or kAutoBucketBytes), got ", options.bucket_bytes);
  DTP_CHECK(config.batch >= options.world, "ddp: the global batch (--batch ", config.batch,
            ") is smaller than the world size (--world ", options.world,
            "): every rank needs at least one sequence");
  // world x K can overflow for a huge K; batch >= world x K is needed anyway
  // (every micro-batch holds at least one sequence), and checking it by
  // division first keeps the product in range.
  DTP_CHECK(options.accumulate <= config.batch / options.world,
            "ddp: the global batch (--batch ", config.batch, ") must hold at least --world x --accumulate = ",
            options.world, " x ", options.accumulate, " sequences (one per micro-batch and rank)");
  DTP_CHECK(config.batch % (options.world * options.accumulate) == 0, "ddp: the global batch (--batch ",
            config.batch, ") must divide evenly by --world x --accumulate = ", options.world, " x ",
            options.accumulate, " = ", options.world * options.accumulate,
            " (equal micro-batches on every rank)");
}

void register_ddp_strategy(const DdpOptions& options) {
  register_strategy("ddp", [options](const TrainConfig& config, const StepCallback& on_step) {
    return run_ddp(config, options, on_step);
  });
}

}  // namespace dtp::ch02
