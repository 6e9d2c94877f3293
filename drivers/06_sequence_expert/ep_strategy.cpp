// `dtp train --strategy ep`: puzzle 6.7 trained inside the GPT
// (drivers/06_sequence_expert/ep_strategy.h says how).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include <cstdio>

#include "drivers/06_sequence_expert/ep_strategy.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/trace.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch06 {

void validate_expert_parallel(const TrainConfig& config, const ExpertParallelRunOptions& options) {
  const int m = options.world;
  DTP_CHECK(m >= 1, "ep: --world (expert-parallel ranks) must be at least 1, got ", m);
  const GPTConfig& model = config.model;
  DTP_CHECK(model.experts > 0,
            "ep: --strategy ep spreads a mixture of experts over the ranks: give "
            "--moe-experts E (a multiple of --world ",
            m, ")");
  DTP_CHECK(model.experts % m == 0, "ep: --moe-experts ", model.experts,
            " do not split over --world ", m,
            " (every rank holds the same number of experts: pick E a multiple of ", m, ")");
  DTP_CHECK(config.batch % m == 0 && config.batch >= m, "ep: the global batch (--batch ",
            config.batch, ") must split into --world ", m, " equal non-empty slices");
  DTP_CHECK(model.expert_shards == 1,
            "ep: the model must hold every expert (GPTConfig::expert_shards 1, got ",
            model.expert_shards, "); the ep trainer shards them itself");
  DTP_CHECK(model.moe_groups == 1, "ep: --moe-groups ", model.moe_groups,
            " is not supported with --strategy ep "
            "(each rank routes its own tokens as one group: ep on N ranks routes like --moe-groups "
            "N on one device)");
}

namespace {

// ExpertParallelMoe (puzzle 6.7) as a block's MoeCore.
class ExpertCore : public MoeCore {
 public:
  ExpertCore(Comm& ep, const MoeMlp& weights) : moe_(ep, weights) {}
  Tensor forward(const Tensor& x) override { return moe_.forward(x); }
  Tensor backward(const Tensor& dy, double loss_scale) override {
    DTP_CHECK(loss_scale == 1.0,
              "ep: expert parallelism's backward takes the loss unscaled (loss_scale 1, got ",
              loss_scale, "): gradient accumulation is not supported with --strategy ep");
    return moe_.backward(dy);
  }
  double aux_loss() const override { return moe_.aux_loss(); }
  const ExpertParallelMoe& moe() const { return moe_; }

 private:
  ExpertParallelMoe moe_;
};

std::int64_t expert_offset(const Unit& block, int expert) {
  return block.parameter("moe.expert." + std::to_string(expert) + ".fc.weight").offset;
}

}  // namespace

ExpertParallelTrainer::ExpertParallelTrainer(const TrainConfig& config, Comm& ep) : ep_(ep) {
  validate_expert_parallel(config, ExpertParallelRunOptions{ep.size()});
  // This rank's model holds only its own experts (the others' weights are
  // drawn at init and dropped, so its experts start as on one device).
  TrainConfig sharded = config;
  sharded.model.expert_shards = ep.size();
  sharded.model.expert_shard = ep.rank();
  trainer_ = std::make_unique<Trainer>(sharded, ep.rank(), ep.size());
  GPT& model = trainer_->model();
  local_ = model.config().experts / ep.size();
  first_ = ep.rank() * local_;
  // Each block's flat buffers hold ln1, attention, ln2 and the router, then
  // this rank's experts in order: the replicated part is one prefix and the
  // owned experts the rest.
  std::vector<ParamBuffer> buffers;
  auto add = [&](std::vector<Chunk>& to, Unit& unit, std::int64_t offset, std::int64_t length,
                 const char* what) {
    to.push_back({unit.params().slice(offset, length), unit.grads().slice(offset, length)});
    buffers.push_back({unit.name() + what, to.back().params, to.back().grads});
  };
  for (Unit* unit : model.units()) {
    auto* block = dynamic_cast<Block*>(unit);
    if (block == nullptr) {
      add(replicated_, *unit, 0, unit->numel(), "");
      continue;
    }
    cores_.push_back(std::make_unique<ExpertCore>(ep, block->moe));
    block->moe_core = cores_.back().get();
    const std::int64_t mine = expert_offset(*block, first_);
    add(replicated_, *block, 0, mine, "");
    add(owned_, *block, mine, block->numel() - mine, " experts");
  }
  // The optimizer holds state only for what this rank updates.
  trainer_->set_optimizer(make_optimizer(trainer_->config(), std::move(buffers)));
}

ExpertParallelTrainer::~ExpertParallelTrainer() = default;

GPT& ExpertParallelTrainer::model() { return trainer_->model(); }

const TrainConfig& ExpertParallelTrainer::config() const { return trainer_->config(); }

std::int64_t ExpertParallelTrainer::dropped() const {
  std::int64_t total = 0;
  for (const auto& core : cores_)
    total += static_cast<const ExpertCore&>(*core).moe().routing().dropped();
  return total;
}

std::int64_t ExpertParallelTrainer::bytes_moved() const { return ep_.stats().collective_bytes; }

double ExpertParallelTrainer::forward_backward() {
  Batch batch = trainer_->sampler().batch(trainer_->steps_done(), config().model.device);
  GPT& model = trainer_->model();
  model.zero_grad();
  const double loss = model.forward(batch.inputs, batch.targets);
  model.backward();
  {
    trace::Scope span("gradient all-reduce", "comm");
    for (Chunk& chunk : replicated_) ep_.all_reduce(chunk.grads, ReduceOp::avg);
  }
  // Summed over every rank's tokens by the exchange: the mean over ranks is a division.
  for (Chunk& chunk : owned_) ops::scale(chunk.grads, 1.0 / ep_.size());
  return all_reduce_value(ep_, loss, ReduceOp::avg);
}

StepRecord ExpertParallelTrainer::step() {
  const StepMeter meter;
  const TrainConfig& c = config();
  StepRecord record;
  record.step = trainer_->steps_done() + 1;
  record.loss = forward_backward();
  DTP_CHECK(std::isfinite(record.loss), "train: the loss is ", record.loss, " at step ",
            record.step, "; try a lower --lr or a tighter --clip");
  // The global norm: the replicated part once, every rank's experts summed.
  std::vector<Tensor> replicated, owned;
  for (const Chunk& chunk : replicated_) replicated.push_back(chunk.grads);
  for (const Chunk& chunk : owned_) owned.push_back(chunk.grads);
  const double replicated_norm = global_grad_norm(replicated), owned_norm = global_grad_norm(owned);
  const double experts_squared = all_reduce_value(ep_, owned_norm * owned_norm, ReduceOp::sum);
  record.grad_norm = std::sqrt(replicated_norm * replicated_norm + experts_squared);
  if (c.grad_clip > 0 && record.grad_norm > c.grad_clip && std::isfinite(record.grad_norm)) {
    const double factor = c.grad_clip / (record.grad_norm + 1e-6);
    for (Tensor& g : replicated) ops::scale(g, factor);
    for (Tensor& g : owned) ops::scale(g, factor);
  }
  record.lr = c.schedule().at(trainer_->steps_done());
  {
    trace::Scope span("optimizer step", "compute");
    trainer_->optimizer().step(record.lr);
  }
  meter.finish(record, trainer_->sampler().local_batch() * trainer_->sampler().seq());
  trainer_->count_step();
  return record;
}

namespace {

// One rank: its slice of the batch, the replicated weights and its experts.
class ExpertParallelRank : public drivers::RankRun {
 public:
  ExpertParallelRank(const TrainConfig& config, Comm& ep) : trainer_(config, ep) {
    // Every rank reads its own experts by their names; the replicated part
    // is the same everywhere.
    load_parameters(trainer_.model(), config);
  }

  Trainer& trainer() override { return trainer_.trainer(); }
  void resume(const std::string& path, const std::vector<RunSetting>& settings) override {
    trainer_.resume(path, settings);
  }
  void save(Comm& world, const std::string& path,
            const std::vector<RunSetting>& settings) override {
    (void)world;
    trainer_.save(path, settings);  // collective
  }
  // The whole model's; each rank holds a share of the experts.
  std::int64_t parameter_count() override { return trainer_.config().model.parameter_count(); }

  StepRecord step() override {
    bytes_before_ = trainer_.bytes_moved();
    return trainer_.step();
  }

  // Each rank routed its own slice's tokens; the step already averaged the loss.
  GroupStepRule group_rule() const override { return {{}, false}; }

  std::vector<double> report_values() override {
    return {static_cast<double>(trainer_.dropped()),
            static_cast<double>(trainer_.bytes_moved() - bytes_before_)};
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    using drivers::ColumnUnit;
    report.ranks.columns = {{"tokens", ColumnUnit::count},
                            {"dropped", ColumnUnit::count},
                            {"moved", ColumnUnit::mebibytes}};
    const int local = trainer_.local_experts();
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const int first = static_cast<int>(r) * local;
      report.ranks.rows.push_back({std::to_string(r) + " (experts " + std::to_string(first) + "-" +
                                       std::to_string(first + local - 1) + ")",
                                   {rows[r].tokens, rows[r].extra[0], rows[r].extra[1]}});
    }
  }

 private:
  ExpertParallelTrainer trainer_;
  std::int64_t bytes_before_ = 0;
};

}  // namespace

void ExpertParallelStrategy::add_flags(drivers::FlagGroup& flags) {
  drivers::add_world_flag(flags, &options.world,
                          "expert-parallel ranks; --moe-experts must divide by N");
  flags.paragraph(
      "Each of --world ranks trains its slice of the batch and holds 1 / world of every block's "
      "experts; tokens travel to their experts and back (6.7). Each rank routes its own tokens, so "
      "a "
      "run on N ranks equals one device with --moe-groups N. After each kept step, a row per rank: "
      "its experts, tokens, dropped choices and bytes moved.");
}

void ExpertParallelStrategy::resolve(TrainConfig& config,
                                     const std::vector<drivers::GivenFlag>& given, int processes) {
  (void)config;
  drivers::default_world_to_processes(options.world, given, processes);
}

std::vector<RunSetting> ExpertParallelStrategy::settings(const TrainConfig& config) const {
  (void)config;
  return {{"--world", std::to_string(options.world)}};
}

std::string ExpertParallelStrategy::header(const TrainConfig& config,
                                           const std::string& backend) const {
  const int m = options.world;
  char line[320];
  std::snprintf(line, sizeof line,
                "ep: %d ranks (%s backend), each holds %d of every block's %d experts and %lld "
                "sequences of the "
                "batch; tokens routed per rank (like --moe-groups %d on one device)",
                m, backend.c_str(), config.model.experts / std::max(1, m), config.model.experts,
                static_cast<long long>(config.batch / std::max(1, m)), m);
  return line;
}

std::unique_ptr<drivers::RankRun> ExpertParallelStrategy::start(const TrainConfig& config,
                                                                Comm& world) const {
  return std::make_unique<ExpertParallelRank>(config, world);
}

std::vector<drivers::PuzzleCall> ExpertParallelStrategy::puzzle_calls(
    const TrainConfig& config) const {
  (void)config;
  // One token, two experts, top-1.
  return {{"6.6", [](Comm&) { route_tokens({0.5, 0.5}, 2, 1, 1.0); }}};
}

}  // namespace dtp::ch06

namespace dtp::strategies {
drivers::Strategy& ep() {
  static ch06::ExpertParallelStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
