// `dtp train --precision bf16|fp16` (the strategy "mixed"): the chapter's
// puzzles wired into the trainer (drivers/07_mixed_precision/mixed_strategy.h
// says how).
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "drivers/07_mixed_precision/mixed_strategy.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/nn_ops.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch07 {
namespace {

// The scaler --loss-scale asks for; null for none.
std::unique_ptr<LossScaler> make_scaler(const LossScale& scale, const ScalerConfig& dynamic) {
  switch (scale.kind) {
    case LossScale::Kind::none:
      return nullptr;
    case LossScale::Kind::dynamic:
      return std::make_unique<LossScaler>(dynamic);
    case LossScale::Kind::fixed:
      return std::make_unique<LossScaler>(ScalerConfig{scale.value, 1.0, 1.0, 1});
  }
  return nullptr;
}

// The masters' name in a checkpoint: "extra/master/<unit>" (checkpoint_also).
std::string master_name(const std::string& unit) { return "master/" + unit; }

// --load under --precision: the f32 masters take the file's values (its own
// masters when a mixed-precision run wrote it, else its parameters, cast to
// f32 from any float dtype) and the 16-bit model takes them rounded from the
// masters. So a model pretrained in f32 and fine-tuned in bf16 keeps every
// bit of its weights in the masters, and only the copy that computes is
// rounded.
void start_from(MasterWeights& masters, const Checkpoint& checkpoint, const std::string& path) {
  GPT& model = masters.model();
  load_parameters(model, checkpoint, path);  // checks every shape, names what differs
  std::vector<Unit*> units = model.units();
  for (std::size_t i = 0; i < units.size(); ++i) {
    Unit& unit = *units[i];
    Tensor master = masters.buffers()[i].params;
    const std::string saved_master = extra_entry(master_name(unit.name()));
    if (checkpoint.has(saved_master) && checkpoint.tensor(saved_master).dtype() == DType::f32 &&
        checkpoint.tensor(saved_master).numel() == master.numel()) {
      master.copy_from(checkpoint.tensor(saved_master));
    } else {
      for (const ParamView& p : unit.parameters()) {
        Tensor slot = master.slice(p.offset, p.shape.numel());
        ops::cast(
            checkpoint.tensor(parameter_entry(unit.name(), p.name)).flatten().to(slot.device()),
            slot);
      }
    }
    ops::cast(master, unit.params());
  }
}

// One rank: the 16-bit model, its f32 masters and optimizer, the scaler.
class MixedPrecisionRank : public drivers::RankRun {
 public:
  MixedPrecisionRank(const TrainConfig& config, const MixedPrecisionRunOptions& options, Comm& comm)
      : options_(options),
        comm_(comm),
        trainer_(config, comm.rank(), comm.size()),
        masters_(trainer_.model()) {
    if (!config.load_path.empty())
      start_from(masters_, read_checkpoint(config.load_path), config.load_path);
    trainer_.set_optimizer(make_optimizer(trainer_.config(), masters_.buffers()));
    scaler_ = make_scaler(loss_scale_for(options, config.model.dtype), options.dynamic_scaler);
    // What a checkpoint holds beside the model and the optimizer state: the
    // masters, and the scaler's scale and count of good steps.
    if (!config.save_path.empty() || !config.resume_path.empty()) {
      std::vector<NamedTensor> extra;
      for (const ParamBuffer& b : masters_.buffers())
        extra.push_back({master_name(b.name), b.params});
      if (scaler_) {
        scaler_state_ = Tensor::zeros(Shape{2}, DType::f64);
        extra.push_back({"loss_scaler", scaler_state_});
      }
      trainer_.checkpoint_also(std::move(extra));
    }
  }

  Trainer& trainer() override { return trainer_; }

  void resume(const std::string& path, const std::vector<RunSetting>& settings) override {
    trainer_.resume(path, settings);
    if (scaler_)
      scaler_->restore(scaler_state_.data<double>()[0],
                       static_cast<std::int64_t>(scaler_state_.data<double>()[1]));
  }

  void save(Comm& world, const std::string& path,
            const std::vector<RunSetting>& settings) override {
    if (world.rank() != 0) return;
    if (scaler_) {
      scaler_state_.data<double>()[0] = scaler_->scale();
      scaler_state_.data<double>()[1] = static_cast<double>(scaler_->good_steps());
    }
    trainer_.save(path, settings);
  }

  StepRecord step() override {
    const StepMeter meter;
    const TrainConfig& config = trainer_.config();
    const std::int64_t s = trainer_.steps_done();
    StepRecord record;
    record.step = s + 1;
    record.lr = config.schedule().at(s);
    record.loss_scale = scaler_ ? scaler_->scale() : 0;
    const BatchSampler& sampler = trainer_.sampler();
    const Batch batch = sampler.batch(s, config.model.device);
    Optimizer& optimizer = trainer_.optimizer();
    const MixedStep step =
        comm_.size() == 1
            ? mixed_precision_step(masters_, optimizer, scaler_.get(), batch, record.lr,
                                   config.grad_clip)
            : ddp_mixed_precision_step(comm_, masters_, optimizer, scaler_.get(), batch, record.lr,
                                       config.grad_clip, options_.reduce_dtype);
    trainer_.count_step();
    record.loss = step.loss;
    record.grad_norm = step.grad_norm;
    record.skipped = !step.stepped;
    DTP_CHECK(std::isfinite(record.loss), "train: the loss is ", record.loss, " at step ",
              record.step, " in ", dtype_name(config.model.dtype),
              "; try a lower --lr, a tighter --clip or --precision bf16");
    meter.finish(record, sampler.local_batch() * sampler.seq());
    return record;
  }

 private:
  MixedPrecisionRunOptions options_;
  Comm& comm_;
  Trainer trainer_;
  MasterWeights masters_;
  std::unique_ptr<LossScaler> scaler_;  // null: no loss scaling
  Tensor scaler_state_;                 // its scale and good steps, in checkpoints
};

}  // namespace

void validate_mixed_precision(const TrainConfig& config, const MixedPrecisionRunOptions& options) {
  const DType precision = config.model.dtype;
  DTP_CHECK(precision == DType::bf16 || precision == DType::f16,
            "mixed precision: the model must be bf16 or f16 (--precision bf16|fp16), got ",
            dtype_name(precision));
  DTP_CHECK(options.world >= 1, "mixed precision: --world (ranks) must be at least 1, got ",
            options.world);
  DTP_CHECK(config.batch % options.world == 0, "mixed precision: the global batch (--batch ",
            config.batch, ") must divide evenly by --world ", options.world);
  DTP_CHECK(options.reduce_dtype == DType::f32 || options.reduce_dtype == precision,
            "mixed precision: --reduce-dtype must be f32 or the model's ", dtype_name(precision),
            ", got ", dtype_name(options.reduce_dtype));
  if (options.loss_scale && options.loss_scale->kind == LossScale::Kind::fixed)
    DTP_CHECK(std::isfinite(options.loss_scale->value) && options.loss_scale->value > 0,
              "mixed precision: a fixed --loss-scale must be finite and > 0, got ",
              options.loss_scale->value);
}

std::string LossScale::str() const {
  if (kind == Kind::dynamic) return "dynamic";
  if (kind == Kind::none) return "none";
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

LossScale parse_loss_scale(const std::string& text) {
  if (text == "dynamic") return {LossScale::Kind::dynamic};
  if (text == "none") return {LossScale::Kind::none};
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  // Decimal only: strtod also takes " 8" and hexadecimal ("0x10" is 16).
  const bool decimal = !text.empty() && !std::isspace(static_cast<unsigned char>(text[0])) &&
                       text.find_first_of("xX") == std::string::npos;
  DTP_CHECK(decimal && end != text.c_str() && *end == '\0' && std::isfinite(value) && value > 0,
            "expected dynamic, none or a number > 0, got '", text, "'");
  return {LossScale::Kind::fixed, value};
}

LossScale loss_scale_for(const MixedPrecisionRunOptions& options, DType precision) {
  if (options.loss_scale) return *options.loss_scale;
  return {precision == DType::f16 ? LossScale::Kind::dynamic : LossScale::Kind::none};
}

bool MixedPrecisionStrategy::chosen(const std::vector<drivers::GivenFlag>& given) const {
  std::string precision;
  return cli::was_given(given, "--precision", &precision) && precision != "fp32";
}

void MixedPrecisionStrategy::add_flags(drivers::FlagGroup& flags) {
  flags.choice("--precision", &precision_, {"fp32", "bf16", "fp16"},
               "fp32 trains as --dtype says; bf16 and fp16 run a 16-bit model with f32 master "
               "weights (7.2), on "
               "one device or, with --world N, data parallel (7.4)");
  drivers::add_world_flag(flags, &options.world, "data-parallel ranks (7.4)");
  flags.custom("--loss-scale", "dynamic|none|S",
               "dynamic: start at 2^16, halve on an overflow (the step is skipped), double after "
               "2000 good steps "
               "(7.3); none; or a fixed scale S > 0 (overflows still skip). Default: dynamic for "
               "fp16, none for "
               "bf16. The log shows the scale and every skipped step",
               [this](const std::string& v) { options.loss_scale = parse_loss_scale(v); });
  flags.custom(
      "--reduce-dtype", "f32|bf16|f16",
      "the dtype gradients are averaged in with --world > 1: f32 (default) or the model's",
      [this](const std::string& v) {
        if (v != "f32" && v != "bf16" && v != "f16")
          throw drivers::UsageError("--reduce-dtype accepts f32, bf16 or f16, got '" + v + "'");
        options.reduce_dtype = parse_dtype(v);
      });
}

void MixedPrecisionStrategy::resolve(TrainConfig& config,
                                     const std::vector<drivers::GivenFlag>& given, int processes) {
  drivers::default_world_to_processes(options.world, given, processes);
  if (cli::was_given(given, "--dtype"))
    throw drivers::UsageError("--precision " + precision_ +
                              " sets the model's dtype; drop --dtype");
  config.model.dtype = precision_ == "bf16" ? DType::bf16 : DType::f16;
}

std::vector<RunSetting> MixedPrecisionStrategy::settings(const TrainConfig& config) const {
  const ScalerConfig& d = options.dynamic_scaler;
  return {{"--world", std::to_string(options.world)},
          {"--precision", dtype_name(config.model.dtype)},
          {"--loss-scale", loss_scale_for(options, config.model.dtype).str()},
          {"dynamic scaler",
           std::to_string(d.initial_scale) + " x" + std::to_string(d.growth_factor) + " x" +
               std::to_string(d.backoff_factor) + " every " + std::to_string(d.growth_interval)},
          {"--reduce-dtype", dtype_name(options.reduce_dtype)}};
}

std::string MixedPrecisionStrategy::header(const TrainConfig& config,
                                           const std::string& backend) const {
  const std::string scale = loss_scale_for(options, config.model.dtype).str();
  std::string line =
      "mixed: the model in " + std::string(dtype_name(config.model.dtype)) +
      " with f32 master weights (2 + 2 + 12 bytes per parameter), loss scale " + scale +
      (scale == "dynamic" ? " (from 2^16, halved on an overflow, doubled after 2000 good steps)"
                          : "");
  if (options.world > 1)
    line += "; " + std::to_string(options.world) + " ranks (" + backend +
            " backend), gradients averaged in " + dtype_name(options.reduce_dtype);
  return line;
}

std::unique_ptr<drivers::RankRun> MixedPrecisionStrategy::start(const TrainConfig& config,
                                                                Comm& world) const {
  return std::make_unique<MixedPrecisionRank>(config, options, world);
}

std::vector<drivers::PuzzleCall> MixedPrecisionStrategy::puzzle_calls(
    const TrainConfig& config) const {
  if (options.world == 1) return {};  // 7.2's step calls 7.3's scaler: the chapter's order
  GPTConfig tiny = drivers::tiny_probe_config();
  tiny.dtype = config.model.dtype;
  const auto casts = [=](Comm&) {
    GPT model(tiny);
    MasterWeights masters(model);
    auto optimizer = make_optimizer(config, masters.buffers());
    masters.grads_to_master(*optimizer);
    masters.master_to_model();
  };
  std::vector<drivers::PuzzleCall> calls = {{"7.2", casts}};
  if (loss_scale_for(options, config.model.dtype).kind != LossScale::Kind::none)
    calls.push_back({"7.3", [](Comm&) {
                       LossScaler scaler;
                       scaler.update(scaler.unscale({Tensor::zeros(Shape{2})}));
                     }});
  return calls;
}

}  // namespace dtp::ch07

namespace dtp::strategies {
drivers::Strategy& mixed() {
  static ch07::MixedPrecisionStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
