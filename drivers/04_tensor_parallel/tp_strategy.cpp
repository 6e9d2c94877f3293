// `dtp train --strategy tp`: the chapter's model trained on a dp x tp mesh
// (drivers/04_tensor_parallel/tp_strategy.h says how).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include <cstdio>

#include "drivers/04_tensor_parallel/tp_strategy.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/trace.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch04 {

void validate_tensor_parallel(const TrainConfig& config, const TensorParallelRunOptions& options) {
  DTP_CHECK(options.tp >= 1, "tp: --tp (ranks per tensor-parallel group) must be at least 1, got ",
            options.tp);
  DTP_CHECK(options.dp >= 1, "tp: --dp (data-parallel groups) must be at least 1, got ",
            options.dp);
  const GPTConfig& m = config.model;
  DTP_CHECK(
      m.experts == 0,
      "tp: --moe-experts is not supported with --strategy tp (its blocks shard the dense "
      "MLP; a mixture of experts is split by expert instead, chapter 06's expert parallelism)");
  DTP_CHECK(m.heads % options.tp == 0, "tp: --heads ", m.heads, " do not split over --tp ",
            options.tp, " (each rank computes whole heads: pick --tp dividing ", m.heads, ")");
  const std::int64_t hidden = std::int64_t{m.mlp_ratio} * m.d_model;
  DTP_CHECK(hidden % options.tp == 0, "tp: the MLP width ", hidden, " does not split over --tp ",
            options.tp);
  // The vocabulary is known once the data is loaded; bytes of a text file: 256.
  const std::int64_t vocab = config.data_path.empty() ? m.vocab_size : 256;
  DTP_CHECK(vocab % options.tp == 0, "tp: the vocabulary (", vocab,
            " token ids) does not split over --tp ", options.tp,
            " (vocabulary-parallel embedding and loss need equal slices)");
  DTP_CHECK(config.batch % options.dp == 0 && config.batch >= options.dp,
            "tp: the global batch (--batch ", config.batch, ") must split into --dp ", options.dp,
            " equal non-empty slices");
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
  serial_->set_optimizer(make_optimizer(config_, param_buffers(model_->units())));
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
  if (config_.grad_clip > 0 && record.grad_norm > config_.grad_clip &&
      std::isfinite(record.grad_norm)) {
    const double factor = config_.grad_clip / (record.grad_norm + 1e-6);
    for (Unit* unit : model_->units()) ops::scale(unit->grads(), factor);
  }
  record.lr = config_.schedule().at(serial_->steps_done());
  {
    trace::Scope span("optimizer step", "compute");
    serial_->optimizer().step(record.lr);
  }
  // Every TP rank computed the same loss for its DP slice: the mean over DP.
  record.loss = mesh_.dp.size() > 1 ? all_reduce_value(mesh_.dp, loss, ReduceOp::avg) : loss;
  meter.finish(record, batch.inputs.numel());
  serial_->count_step();
  return record;
}

namespace {

// One rank of the mesh: its TP group, its DP group and its slices.
class TensorParallelRank : public drivers::RankRun {
 public:
  TensorParallelRank(const TrainConfig& config, const TensorParallelRunOptions& options,
                     Comm& world)
      : options_(options),
        mesh_(make_mesh(world, options.tp)),
        trainer_(config, mesh_, TensorParallelOptions{options.sequence_parallel}) {}

  Trainer& trainer() override { return trainer_.trainer(); }
  void resume(const std::string& path, const std::vector<RunSetting>& settings) override {
    trainer_.resume(path, settings);
  }
  void save(Comm& world, const std::string& path,
            const std::vector<RunSetting>& settings) override {
    (void)world;
    trainer_.save(path, settings);  // collective
  }
  std::int64_t parameter_count() override { return trainer_.config().model.parameter_count(); }

  StepRecord step() override {
    bytes_before_ = moved();
    return trainer_.step();
  }

  // A TP group shares its slice of the batch: one rank of it counts its
  // tokens, and the step already averaged the loss over the DP groups.
  GroupStepRule group_rule() const override {
    const int tp = options_.tp;
    return {[tp](int rank) { return rank % tp == 0; }, false};
  }

  std::vector<double> report_values() override {
    return {static_cast<double>(current_memory_tracker()->live(MemoryCategory::params)),
            static_cast<double>(current_memory_tracker()->peak(MemoryCategory::activations)),
            static_cast<double>(moved() - bytes_before_)};
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    using drivers::ColumnUnit;
    report.ranks.columns = {{"params", ColumnUnit::mebibytes},
                            {"activation peak", ColumnUnit::mebibytes},
                            {"moved", ColumnUnit::mebibytes}};
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const int rank = static_cast<int>(r);
      report.ranks.rows.push_back({std::to_string(rank) + " (tp " +
                                       std::to_string(rank % options_.tp) + ", dp " +
                                       std::to_string(rank / options_.tp) + ")",
                                   rows[r].extra});
    }
  }

 private:
  std::int64_t moved() const {
    return mesh_.tp.stats().collective_bytes + mesh_.dp.stats().collective_bytes;
  }
  TensorParallelRunOptions options_;
  Mesh mesh_;  // before the trainer, which holds it
  TensorParallelTrainer trainer_;
  std::int64_t bytes_before_ = 0;
};

}  // namespace

void TensorParallelStrategy::add_flags(drivers::FlagGroup& flags) {
  flags.integer(
      "--tp", &options.tp, 1, 1024, "T",
      "ranks per tensor-parallel group; heads, vocabulary and MLP width must divide by T");
  flags.integer(
      "--dp", &options.dp, 1, 1024, "D",
      "data-parallel groups; the world is D x T ranks (under mpiexec: as many processes)");
  flags.toggle("--sequence-parallel", &options.sequence_parallel,
               "also split the LayerNorm and residual activations by tokens (Megatron sequence "
               "parallelism, 4.7)");
  flags.paragraph(
      "After each kept step, a row per rank: its parameter bytes, its peak activation bytes and "
      "the "
      "bytes its collectives moved.");
}

std::string TensorParallelStrategy::world_text() const {
  return "--dp " + std::to_string(options.dp) + " x --tp " + std::to_string(options.tp) + " = " +
         std::to_string(world_size()) + " ranks";
}

std::vector<RunSetting> TensorParallelStrategy::settings(const TrainConfig& config) const {
  (void)config;
  return {{"--tp", std::to_string(options.tp)},
          {"--dp", std::to_string(options.dp)},
          {"--sequence-parallel", options.sequence_parallel ? "on" : "off"}};
}

std::string TensorParallelStrategy::header(const TrainConfig& config,
                                           const std::string& backend) const {
  char line[320];
  std::snprintf(
      line, sizeof line,
      "tp: %d x %d = %d ranks (%s backend): tensor-parallel groups of %d consecutive ranks, %d "
      "data-parallel group(s)%s; %lld sequences per data-parallel rank",
      options.dp, options.tp, options.dp * options.tp, backend.c_str(), options.tp, options.dp,
      options.sequence_parallel ? ", sequence parallel" : "",
      static_cast<long long>(config.batch / options.dp));
  return line;
}

std::unique_ptr<drivers::RankRun> TensorParallelStrategy::start(const TrainConfig& config,
                                                                Comm& world) const {
  return std::make_unique<TensorParallelRank>(config, options, world);
}

std::vector<drivers::PuzzleCall> TensorParallelStrategy::puzzle_calls(
    const TrainConfig& config) const {
  (void)config;
  const bool sp = options.sequence_parallel;
  const GPTConfig m = drivers::tiny_probe_config();
  const std::int64_t B = 1, T = 4, C = m.d_model;
  // The activations a layer takes: [B, T, C], or under sequence parallelism
  // this rank's token shard [B*T/t, C] (t = 1 here).
  const auto x = [=] {
    return sp ? Tensor::zeros(Shape{B * T, C}) : Tensor::zeros(Shape{B, T, C});
  };
  return {
      {"4.1",
       [=](Comm& tp) {
         ColumnParallelLinear layer(tp, C, C, true, sp);
         LinearSaved saved;
         layer.backward(layer.forward(x(), saved), saved);
       }},
      {"4.2",
       [=](Comm& tp) {
         RowParallelLinear layer(tp, C, C, sp);
         LinearSaved saved;
         layer.backward(layer.forward(x(), saved), saved);
       }},
      {"4.3",
       [=](Comm& tp) {
         TensorParallelMlp mlp(tp, m, sp);
         TensorParallelMlpSaved saved;
         mlp.backward(mlp.forward(x(), saved), saved);
       }},
      {"4.4",
       [=](Comm& tp) {
         TensorParallelAttention attention(tp, m, sp);
         AttentionSaved saved;
         attention.backward(attention.forward(x(), saved, B), saved);
       }},
      {"4.5",
       [=](Comm& tp) {
         VocabParallelEmbedding embedding(tp, m, sp);
         VocabParallelEmbeddingSaved saved;
         embedding.backward(embedding.forward(Tensor::zeros(Shape{B, T}, DType::i32), saved),
                            saved);
       }},
      {"4.6",
       [=](Comm& tp) {
         VocabParallelCrossEntropy loss(tp, m.vocab_size);
         VocabParallelCrossEntropySaved saved;
         loss.forward(Tensor::zeros(Shape{B, T, m.vocab_size}),
                      Tensor::zeros(Shape{B, T}, DType::i32), saved);
         loss.backward(saved);
       }},
      {"4.7",
       [=](Comm& tp) {
         const Block serial(m, 0);
         TensorParallelBlock block(tp, serial, TensorParallelOptions{sp});
         TensorParallelBlockSaved saved;
         block.backward(block.forward(x(), saved, B), saved);
         block.reduce_replicated_gradients();
       }},
  };
}

}  // namespace dtp::ch04

namespace dtp::strategies {
drivers::Strategy& tp() {
  static ch04::TensorParallelStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
