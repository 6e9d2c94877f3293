// `dtp train --lora-rank R` (the strategy "lora"): the chapter's puzzles
// wired into the trainer (drivers/08_lora/lora_strategy.h says how).
#include "drivers/08_lora/lora_strategy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "dtp/checkpoint.h"
#include "dtp/memory.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch08 {
namespace {

// The adapters under their checkpoint names: one flat buffer per block.
std::vector<NamedTensor> adapter_tensors(const LoraModel& lora) {
  std::vector<NamedTensor> named;
  for (const ParamBuffer& b : lora.buffers()) named.push_back({b.name, b.params});
  return named;
}

// One rank: the frozen base, its adapters, their optimizer (and 8.4's averaging).
class LoraRank : public drivers::RankRun {
 public:
  LoraRank(const TrainConfig& config, const LoraRunOptions& options, Comm& comm)
      : options_(options), comm_(comm), trainer_(config, comm.rank(), comm.size()) {
    GPT& model = trainer_.model();
    load_parameters(model, config);  // the base
    lora_ = std::make_unique<LoraModel>(model, options.lora);
    trainer_.set_optimizer(make_optimizer(config, lora_->buffers()));
    trainer_.on_zero_grad([this] { lora_->zero_grad(); });
    trainer_.checkpoint_also(adapter_tensors(*lora_));
    if (comm.size() > 1) {
      data_parallel_ = std::make_unique<LoraDataParallel>(comm, model, *lora_);
      trainer_.on_after_backward([this] { data_parallel_->finish(); });
    }
  }

  Trainer& trainer() override { return trainer_; }

  StepRecord step() override {
    bytes_before_ = comm_.stats().collective_bytes;
    StepRecord record = trainer_.step();
    all_reduced_ = comm_.stats().collective_bytes - bytes_before_;
    return record;
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    if (rows.size() < 2) return;
    char line[160];
    std::snprintf(
        line, sizeof line, "all-reduced %lld bytes: the %lld adapter gradients x %zu bytes",
        static_cast<long long>(all_reduced_), static_cast<long long>(lora_->trainable_parameters()),
        dtype_size(trainer_.config().model.dtype));
    report.lines.push_back(line);
  }

  // The merged model: an ordinary set of parameters for --load or inference.
  void finish(Comm& world) override {
    if (world.rank() != 0 || options_.save_merged_path.empty()) return;
    lora_->merge_all();
    save_parameters(options_.save_merged_path, trainer_.model(), trainer_.config());
  }

 private:
  LoraRunOptions options_;
  Comm& comm_;
  Trainer trainer_;
  std::unique_ptr<LoraModel> lora_;  // attached to the trainer's model
  std::unique_ptr<LoraDataParallel> data_parallel_;
  std::int64_t bytes_before_ = 0;
  std::int64_t all_reduced_ = 0;  // this rank's collective bytes in the last step
};

}  // namespace

void validate_lora(const TrainConfig& config, const LoraRunOptions& options) {
  DTP_CHECK(options.lora.rank >= 1, "lora: --lora-rank must be at least 1, got ",
            options.lora.rank);
  DTP_CHECK(std::isfinite(options.lora.alpha) && options.lora.alpha > 0,
            "lora: --lora-alpha must be positive, got ", options.lora.alpha);
  DTP_CHECK(!options.lora.targets.empty(), "lora: --lora-targets names none");
  DTP_CHECK(options.world >= 1, "lora: --world must be at least 1, got ", options.world);
  DTP_CHECK(config.batch % options.world == 0, "lora: the global batch (--batch ", config.batch,
            ") must divide evenly by --world ", options.world);
  const auto& targets = options.lora.targets;
  const bool mlp = std::find(targets.begin(), targets.end(), "mlp.fc") != targets.end() ||
                   std::find(targets.begin(), targets.end(), "mlp.proj") != targets.end();
  DTP_CHECK(config.model.experts == 0 || !mlp,
            "lora: a mixture-of-experts model takes adapters on attention only (attn.q, attn.k, "
            "attn.v, attn.proj)");
}

bool LoraStrategy::chosen(const std::vector<drivers::GivenFlag>& given) const {
  return cli::was_given(given, "--lora-rank");
}

void LoraStrategy::add_flags(drivers::FlagGroup& flags) {
  flags.integer("--lora-rank", &options.lora.rank, 1, 4096, "R",
                "fine-tune low-rank adapters of rank R on a frozen model: start from --load FILE's "
                "parameters, "
                "train only the adapters; with --world N data parallel (8.4); --save writes the "
                "adapters and their "
                "optimizer state");
  flags.real("--lora-alpha", &options.lora.alpha, 0, 1e6, "A", "the adapters' scale is A / R",
             cli::Ends::open_low, "2R");
  flags.custom("--lora-targets", "LIST",
               "the Linears of each block that get adapters: a comma list of attn.q, attn.k, "
               "attn.v, attn.proj, "
               "mlp.fc, mlp.proj, or all (default attn.q,attn.v)",
               [this](const std::string& v) { options.lora.targets = parse_lora_targets(v); });
  drivers::add_world_flag(flags, &options.world, "data-parallel ranks (8.4)");
  flags.path("--save-merged", &options.save_merged_path, "FILE",
             "at the end, write the merged model (W + (alpha/R) B A in every adapted Linear): a "
             "whole model for "
             "--load");
}

void LoraStrategy::resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
                           int processes) {
  drivers::default_world_to_processes(options.world, given, processes);
  if (!cli::was_given(given, "--lora-alpha")) options.lora.alpha = 2.0 * options.lora.rank;
  options.lora.seed = config.seed;
}

std::vector<RunSetting> LoraStrategy::settings(const TrainConfig& config) const {
  std::string targets;
  for (const std::string& t : options.lora.targets) targets += (targets.empty() ? "" : ",") + t;
  return {{"--world", std::to_string(options.world)},
          {"--lora-rank", std::to_string(options.lora.rank)},
          {"--lora-alpha", std::to_string(options.lora.alpha)},
          {"--lora-targets", targets},
          {"--load", config.load_path}};
}

std::string LoraStrategy::header(const TrainConfig& config, const std::string& backend) const {
  std::string targets;
  for (const std::string& t : options.lora.targets) targets += (targets.empty() ? "" : ",") + t;
  const GPTConfig model = config.resolved_model();
  const std::int64_t trainable = lora_parameter_count(model, options.lora);
  char line[512];
  std::snprintf(
      line, sizeof line,
      "lora: rank %d, alpha %g (scale %g) on %s of every block: %lld trainable parameters (%.2f%% "
      "of "
      "%lld), the base frozen%s; %d rank(s) (%s backend)",
      options.lora.rank, options.lora.alpha, options.lora.scale(), targets.c_str(),
      static_cast<long long>(trainable),
      100.0 * static_cast<double>(trainable) / static_cast<double>(model.parameter_count()),
      static_cast<long long>(model.parameter_count()),
      config.load_path.empty() ? " (no --load: from the model's own initialization)"
                               : (", from " + config.load_path).c_str(),
      options.world, backend.c_str());
  return line;
}

std::unique_ptr<drivers::RankRun> LoraStrategy::start(const TrainConfig& config,
                                                      Comm& world) const {
  return std::make_unique<LoraRank>(config, options, world);
}

std::vector<drivers::PuzzleCall> LoraStrategy::puzzle_calls(const TrainConfig& config) const {
  (void)config;
  // A [3, 4] linear with rank-2 adapters, on 2 rows.
  std::vector<drivers::PuzzleCall> calls = {
      {"8.1", [](Comm&) {
         const Tensor x = Tensor::zeros(Shape{2, 4}), a = Tensor::zeros(Shape{2, 4}),
                      b = Tensor::zeros(Shape{3, 2});
         Tensor y = Tensor::zeros(Shape{2, 3}), dx = Tensor::zeros(Shape{2, 4});
         Tensor grad_a = Tensor::zeros(Shape{2, 4}), grad_b = Tensor::zeros(Shape{3, 2});
         const Tensor h = lora_forward(x, a, b, 1.0, y);
         lora_backward_input(y, a, b, 1.0, dx);
         lora_backward_weight(y, x, h, b, 1.0, grad_a, grad_b);
       }}};
  if (!options.save_merged_path.empty())
    calls.push_back({"8.2", [](Comm&) {
                       Tensor weight = Tensor::zeros(Shape{3, 4});
                       const Tensor a = Tensor::zeros(Shape{2, 4}), b = Tensor::zeros(Shape{3, 2});
                       merge(weight, a, b, 1.0);
                       unmerge(weight, a, b, 1.0);
                     }});
  return calls;
}

}  // namespace dtp::ch08

namespace dtp::strategies {
drivers::Strategy& lora() {
  static ch08::LoraStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
