// `dtp train --strategy tp`: the chapter's model trained on a dp x tp mesh.
// Provided code, not a puzzle (see drivers/README.md). Each rank builds the
// serial model (through a Trainer, which also gives it the sampler of its DP
// slice), copies out its TP slices and releases the serial weights; a step
// is forward, backward, finish_backward (the puzzles), clipping by the norm
// of the whole model and an optimizer update of this rank's slices. After
// each step rank 0 gathers what every rank held and moved.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>

#include "04_tensor_parallel/tensor_parallel.h"
#include "dtp/agreement.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/trace.h"

namespace dtp::ch04 {

void validate_tensor_parallel(const TrainConfig& config, const TensorParallelRunOptions& options) {
  DTP_CHECK(options.tp >= 1, "tp: --tp (ranks per tensor-parallel group) must be at least 1, got ", options.tp);
  DTP_CHECK(options.dp >= 1, "tp: --dp (data-parallel groups) must be at least 1, got ", options.dp);
  const GPTConfig& m = config.model;
  DTP_CHECK(m.experts == 0, "tp: --moe-experts is not supported with --strategy tp (its blocks shard the dense "
            "MLP; a mixture of experts is split by expert instead, chapter 06's expert parallelism)");
  DTP_CHECK(m.heads % options.tp == 0, "tp: --heads ", m.heads, " do not split over --tp ", options.tp,
            " (each rank computes whole heads: pick --tp dividing ", m.heads, ")");
  const std::int64_t hidden = std::int64_t{m.mlp_ratio} * m.d_model;
  DTP_CHECK(hidden % options.tp == 0, "tp: the MLP width ", hidden, " does not split over --tp ", options.tp);
  // The vocabulary is known once the data is loaded; bytes of a text file: 256.
  const std::int64_t vocab = config.data_path.empty() ? m.vocab_size : 256;
  DTP_CHECK(vocab % options.tp == 0, "tp: the vocabulary (", vocab, " token ids) does not split over --tp ",
            options.tp, " (vocabulary-parallel embedding and loss need equal slices)");
  DTP_CHECK(config.batch % options.dp == 0 && config.batch >= options.dp, "tp: the global batch (--batch ",
            config.batch, ") must split into --dp ", options.dp, " equal non-empty slices");
  if (options.sequence_parallel) {
    const std::int64_t tokens = config.batch / options.dp * config.seq;
    DTP_CHECK(tokens % options.tp == 0, "tp: --sequence-parallel splits each rank's ", tokens,
              " tokens (batch / dp x seq) over --tp ", options.tp, ", which does not divide them");
  }
}

TensorParallelTrainer::TensorParallelTrainer(const TrainConfig& config, Mesh& mesh,
                                             const TensorParallelOptions& options)
    : mesh_(mesh) {
  // The serial model of this DP rank's trainer is the source of the slices;
  // its weights are released as soon as they are copied.
  serial_ = std::make_unique<Trainer>(config, mesh.dp.rank(), mesh.dp.size());
  load_parameters(serial_->model(), config);  // --load, before the slices are cut
  config_ = serial_->config();
  model_ = std::make_unique<TensorParallelGPT>(mesh.tp, serial_->model(), options);
  for (Unit* unit : serial_->model().units()) unit->set_buffers(Tensor(), Tensor());
  std::vector<ParamBuffer> buffers;
  for (Unit* unit : model_->units()) buffers.push_back({unit->name(), unit->params(), unit->grads()});
  serial_->set_optimizer(make_optimizer(config_, std::move(buffers)));
}

TensorParallelTrainer::~TensorParallelTrainer() = default;

const BatchSampler& TensorParallelTrainer::sampler() const { return serial_->sampler(); }

StepRecord TensorParallelTrainer::step() {
  const StepMeter meter;
  StepRecord record;
  record.step = serial_->steps_done() + 1;
  Batch batch = serial_->sampler().batch(serial_->steps_done(), config_.model.device);
  model_->zero_grad();
  const double loss = model_->forward(batch.inputs, batch.targets);
  DTP_CHECK(std::isfinite(loss), "train: the loss is ", loss, " at step ", record.step,
            "; try a lower --lr or a tighter --clip");
  model_->backward();
  model_->finish_backward(mesh_.dp);
  // Clip as clip_grad_norm does, by the norm of the whole (unsharded) model.
  record.grad_norm = model_->global_grad_norm();
  if (config_.grad_clip > 0 && record.grad_norm > config_.grad_clip && std::isfinite(record.grad_norm)) {
    const double factor = config_.grad_clip / (record.grad_norm + 1e-6);
    for (Unit* unit : model_->units()) ops::scale(unit->grads(), factor);
  }
  record.lr = config_.schedule().at(serial_->steps_done());
  {
    trace::Scope span("optimizer step", "compute");
    serial_->optimizer().step(record.lr);
  }
  // Every TP rank computed the same loss for its DP slice: the mean over DP.
  Tensor mean_loss = Tensor::from_values({loss});
  if (mesh_.dp.size() > 1) mesh_.dp.all_reduce(mean_loss, ReduceOp::avg);
  record.loss = mean_loss.item(0);
  meter.finish(record, batch.inputs.numel());
  serial_->count_step();
  return record;
}

namespace {

using Clock = std::chrono::steady_clock;

// The strategy's own settings: what every rank must share beside the
// trainer's, and what a resumed run must share with the saved one.
std::vector<RunSetting> tp_own_settings(const TensorParallelRunOptions& options) {
  return {{"--tp", std::to_string(options.tp)},
          {"--dp", std::to_string(options.dp)},
          {"--sequence-parallel", options.sequence_parallel ? "on" : "off"}};
}

TrainResult run_tp(const TrainConfig& config, const TensorParallelRunOptions& options, const StepCallback& on_step) {
  validate_tensor_parallel(config, options);
  const auto start = Clock::now();
  TrainResult result;
  result.peak_by_category.assign(kMemoryCategoryCount, 0);
  launch(World::from_env(options.tp * options.dp), [&](Comm& world) {
    {
      // Every rank builds the same serial model first: check that they agree
      // on it and on the settings before anything is sliced.
      Trainer probe(config);
      check_ranks_agree(world, run_settings(config, tp_own_settings(options)), probe.model());
    }
    Mesh mesh = make_mesh(world, options.tp);
    TensorParallelTrainer trainer(config, mesh, TensorParallelOptions{options.sequence_parallel});
    if (!config.resume_path.empty()) trainer.resume(config.resume_path, tp_own_settings(options));
    const std::int64_t last = last_step(trainer.trainer());
    if (world.rank() == 0) {
      result.parameters = trainer.config().model.parameter_count();
      result.data_name = trainer.sampler().data().name();
    }
    std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
    enum { kParams, kActivationPeak, kBytesMoved };  // what rank 0 gathers beside loss, seconds and tokens
    // A TP group shares its slice of the batch: one rank of it counts its tokens,
    // and the step already averaged the loss over the DP groups.
    const GroupStepRule rule{[&](int rank) { return rank % options.tp == 0; }, false};
    while (trainer.trainer().steps_done() < last) {
      const std::int64_t before = mesh.tp.stats().collective_bytes + mesh.dp.stats().collective_bytes;
      StepRecord record = trainer.step();
      const std::int64_t moved = mesh.tp.stats().collective_bytes + mesh.dp.stats().collective_bytes - before;
      const std::vector<RankStepRow> rows = report_group_step(
          world, record,
          {static_cast<double>(tracker->live(MemoryCategory::params)),
           static_cast<double>(record.peak_activation_bytes), static_cast<double>(moved)},
          rule);
      if (world.rank() != 0) continue;
      std::vector<RankTensorParallelStep> ranks;
      for (int r = 0; r < world.size(); ++r) {
        const std::vector<double>& extra = rows[static_cast<std::size_t>(r)].extra;
        const auto at = [&](int what) { return static_cast<std::int64_t>(extra[static_cast<std::size_t>(what)]); };
        ranks.push_back({r, r % options.tp, r / options.tp, at(kParams), at(kActivationPeak), at(kBytesMoved)});
      }
      result.add_step(record, *tracker);
      if (on_step) on_step(record);
      if (options.on_ranks) options.on_ranks(record.step, ranks);
    }
    if (!config.save_path.empty()) trainer.save(config.save_path, tp_own_settings(options));  // collective
  });
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace

void register_tensor_parallel_strategy(const TensorParallelRunOptions& options) {
  register_strategy("tp", [options](const TrainConfig& config, const StepCallback& on_step) {
    return run_tp(config, options, on_step);
  });
}

}  // namespace dtp::ch04
