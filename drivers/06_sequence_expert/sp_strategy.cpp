// `dtp train --strategy sp`: the chapter's attention puzzles trained inside
// the GPT (drivers/06_sequence_expert/sp_strategy.h says how).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include <cstdio>

#include "drivers/06_sequence_expert/sp_strategy.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/trace.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch06 {

const char* sequence_parallel_kind_name(SequenceParallelKind kind) {
  switch (kind) {
    case SequenceParallelKind::ring:
      return "ring";
    case SequenceParallelKind::zigzag:
      return "zigzag";
    case SequenceParallelKind::hybrid:
      return "hybrid";
    default:
      return "ulysses";
  }
}

SequenceParallelKind parse_sequence_parallel_kind(const std::string& name) {
  for (SequenceParallelKind kind : {SequenceParallelKind::ulysses, SequenceParallelKind::ring,
                                    SequenceParallelKind::zigzag, SequenceParallelKind::hybrid})
    if (name == sequence_parallel_kind_name(kind)) return kind;
  DTP_CHECK(false, "unknown sequence-parallel kind '", name,
            "'; accepted: ulysses, ring, zigzag, hybrid");
  return SequenceParallelKind::ulysses;
}

void validate_sequence_parallel(const TrainConfig& config,
                                const SequenceParallelRunOptions& options) {
  const int n = options.sp;
  DTP_CHECK(n >= 1, "sp: --sp (ranks per sequence-parallel group) must be at least 1, got ", n);
  const GPTConfig& m = config.model;
  DTP_CHECK(m.experts == 0,
            "sp: --moe-experts is not supported with --strategy sp (each rank would route "
            "its own positions' tokens with its own capacity: train a mixture of experts with "
            "--strategy ep)");
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
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v) override {
    return attention_.forward(q, k, v);
  }
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

std::unique_ptr<AttentionCore> make_core(Comm& sp, const GPTConfig& model,
                                         const SequenceParallelRunOptions& o) {
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
  DTP_CHECK(sp.size() == options.sp, "sp: the group has ", sp.size(), " ranks but --sp is ",
            options.sp);
  // Every rank trains on the whole batch: one sampler of the whole world.
  trainer_ = std::make_unique<Trainer>(config);
  const SequenceLayout layout = options.kind == SequenceParallelKind::zigzag
                                    ? SequenceLayout::zigzag
                                    : SequenceLayout::contiguous;
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
  return all_reduce_value(sp_, loss, ReduceOp::avg);
}

StepRecord SequenceParallelTrainer::step() {
  const StepMeter meter;
  const TrainConfig& c = config();
  StepRecord record;
  record.step = trainer_->steps_done() + 1;
  record.loss = forward_backward();
  DTP_CHECK(std::isfinite(record.loss), "train: the loss is ", record.loss, " at step ",
            record.step, "; try a lower --lr or a tighter --clip");
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

SequenceLayout layout_of(SequenceParallelKind kind) {
  return kind == SequenceParallelKind::zigzag ? SequenceLayout::zigzag : SequenceLayout::contiguous;
}

// One rank of the group: the whole model and batch, its positions.
class SequenceParallelRank : public drivers::RankRun {
 public:
  SequenceParallelRank(const TrainConfig& config, const SequenceParallelRunOptions& options,
                       Comm& sp)
      : options_(options), trainer_(config, sp, options) {
    // Every rank holds the whole model and optimizer state: rank 0's are the
    // run's checkpoint, as under DDP.
    load_parameters(trainer_.model(), config);
  }

  Trainer& trainer() override { return trainer_.trainer(); }

  StepRecord step() override {
    bytes_before_ = trainer_.bytes_moved();
    reset_block_computations();
    return trainer_.step();
  }

  // Every rank held the same batch (its tokens count once) and computed the same loss.
  GroupStepRule group_rule() const override {
    return {[](int rank) { return rank == 0; }, false};
  }

  std::vector<double> report_values() override {
    return {static_cast<double>(current_memory_tracker()->peak(MemoryCategory::activations)),
            static_cast<double>(trainer_.bytes_moved() - bytes_before_),
            static_cast<double>(block_computations())};
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    using drivers::ColumnUnit;
    const bool ring = options_.kind != SequenceParallelKind::ulysses;
    report.ranks.columns = {{"activation peak", ColumnUnit::mebibytes},
                            {"moved", ColumnUnit::mebibytes}};
    if (ring) report.ranks.columns.push_back({"attention blocks", ColumnUnit::count});
    const std::int64_t seq = trainer_.config().seq;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::string label = std::to_string(r);
      for (const PositionRange& p : positions_of(seq, static_cast<int>(rows.size()),
                                                 static_cast<int>(r), layout_of(options_.kind)))
        label += " [" + std::to_string(p.start) + ", " + std::to_string(p.end()) + ")";
      std::vector<double> values = rows[r].extra;
      if (!ring) values.pop_back();
      report.ranks.rows.push_back({label, values});
    }
  }

 private:
  SequenceParallelRunOptions options_;
  SequenceParallelTrainer trainer_;
  std::int64_t bytes_before_ = 0;
};

}  // namespace

void SequenceParallelStrategy::add_flags(drivers::FlagGroup& flags) {
  flags.integer(
      "--sp", &options.sp, 1, 1024, "N",
      "ranks that split every sequence's positions (the world); --seq must divide by N (2 N for "
      "zigzag); every rank holds the whole model and batch");
  flags.custom("--sp-kind", "KIND",
               "the attention across ranks: ulysses (6.1, default; --heads must divide by N), ring "
               "(6.2-6.3), "
               "zigzag (6.4, load-balanced ring) or hybrid (6.5)",
               [this](const std::string& v) { options.kind = parse_sequence_parallel_kind(v); });
  flags.integer("--sp-ulysses", &options.ulysses, 1, 1024, "U",
                "hybrid: ranks per Ulysses group; U must divide N and --heads; ring attention "
                "across the N / U "
                "groups");
  flags.paragraph(
      "After each kept step, a row per rank: its positions, its activation peak, the bytes it "
      "moved "
      "and (ring kinds) its attention blocks.");
}

void SequenceParallelStrategy::resolve(TrainConfig& config,
                                       const std::vector<drivers::GivenFlag>& given,
                                       int processes) {
  (void)config, (void)processes;
  if (cli::was_given(given, "--sp-ulysses") && options.kind != SequenceParallelKind::hybrid)
    throw drivers::UsageError(
        "--sp-ulysses sets the Ulysses group of --sp-kind hybrid; this run's --sp-kind is not "
        "hybrid");
}

std::vector<RunSetting> SequenceParallelStrategy::settings(const TrainConfig& config) const {
  (void)config;
  return {{"--sp", std::to_string(options.sp)},
          {"--sp-kind", sequence_parallel_kind_name(options.kind)},
          {"--sp-ulysses", std::to_string(options.ulysses)}};
}

std::string SequenceParallelStrategy::header(const TrainConfig& config,
                                             const std::string& backend) const {
  std::string hybrid;
  if (options.kind == SequenceParallelKind::hybrid)
    hybrid = " (Ulysses in groups of " + std::to_string(options.ulysses) + ", ring across " +
             std::to_string(options.sp / std::max(1, options.ulysses)) + " groups)";
  char line[320];
  std::snprintf(line, sizeof line,
                "sp: %d ranks (%s backend), %s attention%s: each holds %lld of every sequence's "
                "%lld positions%s, "
                "the whole model and the whole batch",
                options.sp, backend.c_str(), sequence_parallel_kind_name(options.kind),
                hybrid.c_str(), static_cast<long long>(config.seq / options.sp),
                static_cast<long long>(config.seq),
                options.kind == SequenceParallelKind::zigzag ? " (two chunks)" : "");
  return line;
}

std::unique_ptr<drivers::RankRun> SequenceParallelStrategy::start(const TrainConfig& config,
                                                                  Comm& world) const {
  return std::make_unique<SequenceParallelRank>(config, options, world);
}

std::vector<drivers::PuzzleCall> SequenceParallelStrategy::puzzle_calls(
    const TrainConfig& config) const {
  (void)config;
  if (options.kind != SequenceParallelKind::hybrid) return {};  // one puzzle class each
  // q, k, v [B, T, H, D] of one rank.
  const auto x = [] { return Tensor::zeros(Shape{1, 4, 2, 4}); };
  return {
      {"6.1", [=](Comm& sp) { heads_to_sequence(sp, sequence_to_heads(sp, x())); }},
      {"6.2",
       [=](Comm& sp) { RingAttention(sp, SequenceLayout::contiguous).forward(x(), x(), x()); }},
      {"6.3",
       [=](Comm& sp) {
         RingAttention ring(sp, SequenceLayout::contiguous);
         ring.forward(x(), x(), x());
         Tensor dq, dk, dv;
         ring.backward(x(), dq, dk, dv);
       }},
  };
}

}  // namespace dtp::ch06

namespace dtp::strategies {
drivers::Strategy& sp() {
  static ch06::SequenceParallelStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
