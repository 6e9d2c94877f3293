// `dtp train --strategy ddp`: the chapter's puzzles wired into the trainer.
// Not a puzzle: the plumbing every data-parallel chapter repeats. A rank
// builds Trainer(config, rank, world) so its sampler yields its slice of the
// global batch, and plugs gradient averaging in where it belongs:
//   K = 1: Trainer::step() with on_after_backward (2.1, 2.2, 2.3's finish);
//          2.3 also hooks the model's grad-ready callbacks.
//   K > 1: a step written out here around accumulation_step (2.4); the one
//          synchronization per step is flat (2.2), or naive (2.1) in naive mode.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "02_ddp/ddp.h"
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
  std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
  tracker->reset_peaks();
  const auto start = Clock::now();
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
  record.seconds = seconds_since(start);
  record.tokens = sampler.local_batch() * sampler.seq();
  record.tokens_per_second = record.seconds > 0 ? static_cast<double>(record.tokens) / record.seconds : 0;
  record.peak_bytes = tracker->total_peak();
  record.peak_activation_bytes = tracker->peak(MemoryCategory::activations);
  return record;
}

TrainResult run_ddp(const TrainConfig& config, const DdpOptions& options, const StepCallback& on_step) {
  validate_ddp(config, options);
  const auto start = Clock::now();
  TrainResult result;
  result.peak_by_category.assign(kMemoryCategoryCount, 0);
  launch(World::from_env(options.world), [&](Comm& comm) {
    Trainer trainer(config, comm.rank(), comm.size());
    GPT& model = trainer.model();
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
      buckets = std::make_unique<BucketedAllReduce>(comm, model, options.bucket_bytes);
      synchronize = [&] { timed([&] { buckets->finish(); }); };
    }
    if (options.accumulate == 1) trainer.on_after_backward(synchronize);
    if (comm.rank() == 0) {
      result.parameters = model.parameter_count();
      result.data_name = trainer.sampler().data().name();
    }
    std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
    Tensor mine = Tensor::zeros(Shape{4}, DType::f64);
    Tensor all = Tensor::zeros(Shape{4 * static_cast<std::int64_t>(comm.size())}, DType::f64);
    for (std::int64_t s = 0; s < config.steps; ++s) {
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
      // Gather (loss, calls, bytes, exposed) to rank 0: reporting traffic,
      // measured after the step's own numbers were taken.
      mine.copy_from(Tensor::from_values({record.loss, static_cast<double>(calls(after) - calls(before)),
                                          static_cast<double>(after.collective_bytes - before.collective_bytes),
                                          exposed}));
      comm.gather(mine, all, 0);
      if (comm.rank() != 0) continue;
      const std::vector<double> v = all.to_vector();
      std::vector<RankCommStep> ranks(static_cast<std::size_t>(comm.size()));
      double loss_sum = 0;
      for (int r = 0; r < comm.size(); ++r) {
        RankCommStep& rc = ranks[static_cast<std::size_t>(r)];
        rc.rank = r;
        rc.loss = v[4 * r];
        rc.all_reduces = static_cast<std::int64_t>(v[4 * r + 1]);
        rc.bytes = static_cast<std::int64_t>(v[4 * r + 2]);
        rc.exposed_seconds = v[4 * r + 3];
        loss_sum += rc.loss;
      }
      record.loss = loss_sum / comm.size();  // equal slices: the mean of means is the global mean
      result.add_step(record, *tracker);
      if (on_step) on_step(record);
      if (options.on_comm) options.on_comm(record.step, ranks);
    }
  });
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace

void validate_ddp(const TrainConfig& config, const DdpOptions& options) {
  DTP_CHECK(options.world >= 1, "ddp: the world size must be at least 1, got ", options.world);
  DTP_CHECK(options.accumulate >= 1, "ddp: accumulate (K) must be at least 1, got ", options.accumulate);
  DTP_CHECK(options.bucket_bytes >= 0, "ddp: bucket bytes must be >= 0, got ", options.bucket_bytes);
  DTP_CHECK(config.batch >= options.world,
            "ddp: the global batch (", config.batch, " sequences) is smaller than the world size (",
            options.world, " ranks): every rank needs at least one sequence");
  DTP_CHECK(config.batch % (options.world * options.accumulate) == 0, "ddp: the global batch (",
            config.batch, " sequences) must divide evenly by world size x accumulation = ",
            options.world, " x ", options.accumulate, " = ", options.world * options.accumulate,
            " (equal micro-batches on every rank)");
}

void register_ddp_strategy(const DdpOptions& options) {
  register_strategy("ddp", [options](const TrainConfig& config, const StepCallback& on_step) {
    return run_ddp(config, options, on_step);
  });
}

}  // namespace dtp::ch02
