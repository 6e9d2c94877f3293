// `dtp train --strategy sp`: the chapter's attention puzzles trained inside
// the GPT. Provided code, not a puzzle (see drivers/README.md). Every rank
// holds the whole model and the whole batch, and runs it on its positions of
// every sequence: the embedding adds the positions' own rows, everything but
// attention acts on one position at a time, and each block's attention
// reaches the other ranks' positions through the puzzle class installed as
// its AttentionCore. The gradients are averaged over the group as in DDP.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "06_sequence_expert/sequence_expert.h"
#include "dtp/agreement.h"
#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/trace.h"

namespace dtp::ch06 {

const char* sequence_parallel_kind_name(SequenceParallelKind kind) {
  switch (kind) {
    case SequenceParallelKind::ring: return "ring";
    case SequenceParallelKind::zigzag: return "zigzag";
    case SequenceParallelKind::hybrid: return "hybrid";
    default: return "ulysses";
  }
}

SequenceParallelKind parse_sequence_parallel_kind(const std::string& name) {
  for (SequenceParallelKind kind : {SequenceParallelKind::ulysses, SequenceParallelKind::ring,
                                    SequenceParallelKind::zigzag, SequenceParallelKind::hybrid})
    if (name == sequence_parallel_kind_name(kind)) return kind;
  DTP_CHECK(false, "unknown sequence-parallel kind '", name, "'; accepted: ulysses, ring, zigzag, hybrid");
  return SequenceParallelKind::ulysses;
}

void validate_sequence_parallel(const TrainConfig& config, const SequenceParallelRunOptions& options) {
  const int n = options.sp;
  DTP_CHECK(n >= 1, "sp: --sp (ranks per sequence-parallel group) must be at least 1, got ", n);
  const GPTConfig& m = config.model;
  DTP_CHECK(m.experts == 0, "sp: --moe-experts is not supported with --strategy sp (each rank would route "
            "its own positions' tokens with its own capacity: train a mixture of experts with --strategy ep)");
  const bool zigzag = options.kind == SequenceParallelKind::zigzag;
  const std::int64_t parts = zigzag ? 2 * n : n;
  DTP_CHECK(config.seq % parts == 0, "sp: --seq ", config.seq, " does not split into ",
            zigzag ? "2 x --sp = " : "--sp ", parts, zigzag ? " zigzag chunks" : " equal shards",
            " (pick a sequence length that divides by ", parts, ")");
  if (options.kind == SequenceParallelKind::ulysses)
    DTP_CHECK(m.heads % n == 0, "sp: --heads ", m.heads, " do not split over --sp ", n,
              " (Ulysses gives each rank whole heads; pick --sp dividing ", m.heads,
              ", or --sp-kind ring, which any head count allows)");
  if (options.kind == SequenceParallelKind::hybrid) {
    const int u = options.ulysses;
    DTP_CHECK(u >= 1 && n % u == 0, "sp: --sp-ulysses ", u, " does not divide --sp ", n,
              " (the hybrid's Ulysses groups are --sp-ulysses consecutive ranks)");
    DTP_CHECK(m.heads % u == 0, "sp: --heads ", m.heads, " do not split over --sp-ulysses ", u,
              " (each rank of a Ulysses group computes whole heads)");
  }
}

namespace {

// A puzzle class (UlyssesAttention, RingAttention, HybridAttention) as the
// block's attention core: they already have the core's forward and backward.
template <class Attention>
class PuzzleCore : public AttentionCore {
 public:
  template <class... Args>
  explicit PuzzleCore(Args&&... args) : attention_(std::forward<Args>(args)...) {}
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v) override { return attention_.forward(q, k, v); }
  void backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) override {
    attention_.backward(dout, dq, dk, dv);
  }
  Attention& attention() { return attention_; }

 private:
  Attention attention_;
};

std::int64_t moved(const Comm& comm) {
  const CommStats s = comm.stats();
  return s.collective_bytes + s.bytes_sent;
}

std::unique_ptr<AttentionCore> make_core(Comm& sp, const GPTConfig& model, const SequenceParallelRunOptions& o) {
  switch (o.kind) {
    case SequenceParallelKind::ring:
      return std::make_unique<PuzzleCore<RingAttention>>(sp, SequenceLayout::contiguous);
    case SequenceParallelKind::zigzag:
      return std::make_unique<PuzzleCore<RingAttention>>(sp, SequenceLayout::zigzag);
    case SequenceParallelKind::hybrid:
      return std::make_unique<PuzzleCore<HybridAttention>>(sp, o.ulysses, model.heads);
    default:
      return std::make_unique<PuzzleCore<UlyssesAttention>>(sp, model.heads);
  }
}

}  // namespace

SequenceParallelTrainer::SequenceParallelTrainer(const TrainConfig& config, Comm& sp,
                                                 const SequenceParallelRunOptions& options)
    : sp_(sp) {
  validate_sequence_parallel(config, options);
  DTP_CHECK(sp.size() == options.sp, "sp: the group has ", sp.size(), " ranks but --sp is ", options.sp);
  // Every rank trains on the whole batch: one sampler of the whole world.
  trainer_ = std::make_unique<Trainer>(config);
  const SequenceLayout layout =
      options.kind == SequenceParallelKind::zigzag ? SequenceLayout::zigzag : SequenceLayout::contiguous;
  positions_ = positions_of(config.seq, sp.size(), sp.rank(), layout);
  GPT& model = trainer_->model();
  for (int layer = 0; layer < model.num_blocks(); ++layer) {
    cores_.push_back(make_core(sp, model.config(), options));
    model.block(layer).attn.core = cores_.back().get();
  }
}

SequenceParallelTrainer::~SequenceParallelTrainer() = default;

GPT& SequenceParallelTrainer::model() { return trainer_->model(); }

const TrainConfig& SequenceParallelTrainer::config() const { return trainer_->config(); }

std::int64_t SequenceParallelTrainer::bytes_moved() const {
  std::int64_t bytes = moved(sp_);
  for (const auto& core : cores_)
    if (auto* hybrid = dynamic_cast<PuzzleCore<HybridAttention>*>(core.get()))
      bytes += moved(hybrid->attention().inner()) + moved(hybrid->attention().outer());
  return bytes;
}

double SequenceParallelTrainer::forward_backward() {
  const TrainConfig& c = config();
  Batch batch = trainer_->sampler().batch(trainer_->steps_done(), c.model.device);
  GPT& model = trainer_->model();
  model.zero_grad();
  const Tensor tokens = take_positions(batch.inputs, positions_);
  const Tensor targets = take_positions(batch.targets, positions_);
  const double loss = model.forward(tokens, targets, positions_);
  model.backward();
  // Rank r's gradient is that of its positions' mean loss; every rank holds
  // as many positions, so the mean over ranks is the mean over positions.
  {
    trace::Scope span("gradient all-reduce", "comm");
    for (Unit* unit : model.units()) sp_.all_reduce(unit->grads(), ReduceOp::avg);
  }
  Tensor mean = Tensor::from_values({loss});
  sp_.all_reduce(mean, ReduceOp::avg);
  return mean.item(0);
}

StepRecord SequenceParallelTrainer::step() {
  const StepMeter meter;
  const TrainConfig& c = config();
  StepRecord record;
  record.step = trainer_->steps_done() + 1;
  record.loss = forward_backward();
  DTP_CHECK(std::isfinite(record.loss), "train: the loss is ", record.loss, " at step ", record.step,
            "; try a lower --lr or a tighter --clip");
  // The gradients are replicated now: clipping and the update run alike everywhere.
  record.grad_norm = trainer_->optimizer().clip_gradients(c.grad_clip);
  record.lr = c.schedule().at(trainer_->steps_done());
  {
    trace::Scope span("optimizer step", "compute");
    trainer_->optimizer().step(record.lr);
  }
  meter.finish(record, c.batch * c.seq);
  trainer_->count_step();
  return record;
}

namespace {

using Clock = std::chrono::steady_clock;

// The strategy's own settings: what every rank must share beside the
// trainer's, and what a resumed run must share with the saved one.
std::vector<RunSetting> sp_own_settings(const SequenceParallelRunOptions& options) {
  return {{"--sp", std::to_string(options.sp)},
          {"--sp-kind", sequence_parallel_kind_name(options.kind)},
          {"--sp-ulysses", std::to_string(options.ulysses)}};
}

TrainResult run_sp(const TrainConfig& config, const SequenceParallelRunOptions& options, const StepCallback& on_step) {
  validate_sequence_parallel(config, options);
  const auto start = Clock::now();
  TrainResult result;
  result.peak_by_category.assign(kMemoryCategoryCount, 0);
  launch(World::from_env(options.sp), [&](Comm& sp) {
    {
      // Before the trainer: the hybrid's cores split the group, which ranks
      // with different settings would enter differently.
      Trainer probe(config);
      check_ranks_agree(sp, run_settings(config, sp_own_settings(options)), probe.model());
    }
    SequenceParallelTrainer trainer(config, sp, options);
    // Every rank holds the whole model and optimizer state: rank 0's are the
    // run's checkpoint, as under DDP.
    const std::int64_t last = start_from_checkpoints(trainer.trainer(), sp_own_settings(options));
    if (sp.rank() == 0) {
      result.parameters = trainer.model().parameter_count();
      result.data_name = trainer.sampler().data().name();
    }
    std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
    enum { kActivationPeak, kBytesMoved, kBlocks };  // what rank 0 gathers beside loss, seconds and tokens
    while (trainer.trainer().steps_done() < last) {
      const std::int64_t before = trainer.bytes_moved();
      reset_block_computations();
      StepRecord record = trainer.step();
      // Every rank held the same batch (its tokens count once) and computed the same loss.
      const std::vector<RankStepRow> rows = report_group_step(
          sp, record,
          {static_cast<double>(record.peak_activation_bytes), static_cast<double>(trainer.bytes_moved() - before),
           static_cast<double>(block_computations())},
          GroupStepRule{[](int rank) { return rank == 0; }, false});
      if (sp.rank() != 0) continue;
      std::vector<RankSequenceParallelStep> ranks;
      const SequenceLayout layout =
          options.kind == SequenceParallelKind::zigzag ? SequenceLayout::zigzag : SequenceLayout::contiguous;
      for (int r = 0; r < sp.size(); ++r) {
        const std::vector<double>& extra = rows[static_cast<std::size_t>(r)].extra;
        const auto at = [&](int what) { return static_cast<std::int64_t>(extra[static_cast<std::size_t>(what)]); };
        ranks.push_back({r, positions_of(config.seq, sp.size(), r, layout), at(kActivationPeak), at(kBytesMoved),
                         at(kBlocks)});
      }
      result.add_step(record, *tracker);
      if (on_step) on_step(record);
      if (options.on_ranks) options.on_ranks(record.step, ranks);
    }
    if (sp.rank() == 0 && !config.save_path.empty())
      trainer.trainer().save(config.save_path, sp_own_settings(options));
  });
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace

void register_sequence_parallel_strategy(const SequenceParallelRunOptions& options) {
  register_strategy("sp", [options](const TrainConfig& config, const StepCallback& on_step) {
    return run_sp(config, options, on_step);
  });
}

}  // namespace dtp::ch06
