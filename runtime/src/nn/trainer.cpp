// The Trainer: a run's settings, its model, optimizer and sampler, one step at a time.
#include "dtp/trainer.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "dtp/checkpoint.h"
#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/trace.h"

namespace dtp {

void TrainConfig::validate() const {
  DTP_CHECK(steps >= 1, "train: steps must be at least 1, got ", steps);
  DTP_CHECK(batch >= 1, "train: batch must be at least 1, got ", batch);
  DTP_CHECK(seq >= 1, "train: seq must be at least 1, got ", seq);
  DTP_CHECK(optimizer == "adamw" || optimizer == "sgd", "train: unknown optimizer '", optimizer,
            "'; accepted: adamw, sgd");
  DTP_CHECK(lr > 0 && std::isfinite(lr), "train: lr must be positive, got ", lr);
  DTP_CHECK(min_lr_ratio >= 0 && min_lr_ratio <= 1, "train: min_lr_ratio must be in [0, 1], got ",
            min_lr_ratio);
  DTP_CHECK(warmup >= 0, "train: warmup must be >= 0, got ", warmup);
  DTP_CHECK(weight_decay >= 0 && std::isfinite(weight_decay),
            "train: weight_decay must be finite and >= 0, got ", weight_decay);
  DTP_CHECK(momentum >= 0 && momentum < 1, "train: momentum must be in [0, 1), got ", momentum);
  DTP_CHECK(std::isfinite(grad_clip), "train: grad_clip must be finite, got ", grad_clip);
  DTP_CHECK(stop_after >= 0 && stop_after <= steps,
            "train: stop_after must be from 0 (run all steps) to steps (", steps, "), got ",
            stop_after);
  // Tokens per step must be countable (batch x seq in an int64).
  std::int64_t tokens = 0;
  DTP_CHECK(!__builtin_mul_overflow(batch, seq, &tokens), "train: batch x seq = ", batch, " x ",
            seq, " tokens per step overflows a 64-bit count");
}

LRSchedule TrainConfig::schedule() const {
  return LRSchedule{lr, lr * min_lr_ratio, warmup, steps};
}

GPTConfig TrainConfig::resolved_model() const {
  GPTConfig resolved = model;
  if (!data_path.empty()) resolved.vocab_size = 256;  // TokenDataset::from_text_file: byte tokens
  resolved.context = static_cast<int>(std::max<std::int64_t>(model.context, seq));
  resolved.seed = seed;
  return resolved;
}

TokenDataset load_dataset(const TrainConfig& config) {
  if (!config.data_path.empty()) return TokenDataset::from_text_file(config.data_path);
  SyntheticConfig synthetic = config.synthetic;
  synthetic.vocab_size = config.model.vocab_size;
  synthetic.seed = config.seed;
  return TokenDataset::synthetic(synthetic);
}

// --- Trainer --------------------------------------------------------------------------------

Trainer::Trainer(const TrainConfig& config, int rank, int world) : config_(config) {
  config_.validate();
  TokenDataset data = load_dataset(config_);
  config_.model = config_.resolved_model();
  DTP_CHECK(config_.model.vocab_size == data.vocab_size(), "train: the model's vocabulary (",
            config_.model.vocab_size, ") differs from the data's (", data.vocab_size(), ")");
  sampler_ = std::make_unique<BatchSampler>(std::move(data), config_.batch, config_.seq, rank,
                                            world, Rng::derive(config_.seed, 7));
  model_ = std::make_unique<GPT>(config_.model);
}

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& config,
                                          std::vector<ParamBuffer> buffers) {
  if (config.optimizer == "sgd")
    return std::make_unique<SGD>(std::move(buffers),
                                 SGDConfig{config.momentum, config.weight_decay, false});
  DTP_CHECK(config.optimizer == "adamw", "make_optimizer: unknown optimizer '", config.optimizer,
            "'; accepted: adamw, sgd");
  return std::make_unique<AdamW>(
      std::move(buffers), AdamWConfig{config.beta1, config.beta2, 1e-8, config.weight_decay});
}

Optimizer& Trainer::optimizer() {
  // Built on first use: a strategy that shards the optimizer sets its own
  // first, and the full-size state is never allocated.
  if (!optimizer_) optimizer_ = make_optimizer(config_, param_buffers(*model_));
  return *optimizer_;
}

void Trainer::set_optimizer(std::unique_ptr<Optimizer> optimizer) {
  DTP_CHECK(optimizer != nullptr, "Trainer::set_optimizer needs an optimizer, got a null pointer");
  optimizer_ = std::move(optimizer);
}

namespace {
// Page faults of the whole process so far: what a fresh buffer costs when its
// pages come from the kernel (dtp/host_cache.h).
std::int64_t process_page_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_minflt) + static_cast<std::int64_t>(usage.ru_majflt);
}
}  // namespace

StepMeter::StepMeter() : tracker_(current_memory_tracker()) {
  tracker_->reset_peaks();
  faults_at_start_ = process_page_faults();
  start_ = std::chrono::steady_clock::now();
}

void StepMeter::finish(StepRecord& record, std::int64_t tokens) const {
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  record.tokens = tokens;
  record.tokens_per_second = record.seconds > 0 ? static_cast<double>(tokens) / record.seconds : 0;
  record.peak_bytes = tracker_->total_peak();
  record.peak_activation_bytes = tracker_->peak(MemoryCategory::activations);
  record.page_faults = process_page_faults() - faults_at_start_;
}

StepRecord Trainer::step() {
  const StepMeter meter;
  StepRecord record;
  record.step = steps_done_ + 1;
  Batch batch = sampler_->batch(steps_done_, config_.model.device);
  model_->zero_grad();
  for (auto& hook : zero_grad_) hook();
  record.loss = model_->forward(batch.inputs, batch.targets);
  DTP_CHECK(std::isfinite(record.loss), "train: the loss is ", record.loss, " at step ",
            record.step, "; try a lower --lr or a tighter --clip");
  model_->backward();
  for (auto& hook : after_backward_) hook();
  record.grad_norm = optimizer().clip_gradients(config_.grad_clip);
  record.lr = config_.schedule().at(steps_done_);
  {
    trace::Scope span("optimizer step", "compute");
    optimizer().step(record.lr);
  }
  meter.finish(record, batch.inputs.numel());
  ++steps_done_;
  return record;
}

}  // namespace dtp
