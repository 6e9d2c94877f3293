// `dtp train --precision bf16|fp16` (strategy "mixed"): the chapter's
// puzzles wired into the trainer. Provided code, not a puzzle (see
// drivers/README.md). Each rank builds Trainer(config, rank, world) for its
// 16-bit model and its slice of the batch, keeps f32 master weights and an
// optimizer over them, and runs 7.2's step (one rank) or 7.4's (several),
// with 7.3's loss scaler when one is asked for. A checkpoint holds the
// 16-bit model, the f32 masters, their optimizer state and the scaler's scale
// and count, so a resumed run goes on exactly where the saved one stopped;
// --load starts the masters from a file of any float dtype (start_from).
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "07_mixed_precision/mixed_precision.h"
#include "dtp/agreement.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/nn_ops.h"

namespace dtp::ch07 {
namespace {

using Clock = std::chrono::steady_clock;

// The scaler --loss-scale asks for; null for none.
std::unique_ptr<LossScaler> make_scaler(const LossScale& scale, const ScalerConfig& dynamic) {
  switch (scale.kind) {
    case LossScale::Kind::none: return nullptr;
    case LossScale::Kind::dynamic: return std::make_unique<LossScaler>(dynamic);
    case LossScale::Kind::fixed: return std::make_unique<LossScaler>(ScalerConfig{scale.value, 1.0, 1.0, 1});
  }
  return nullptr;
}

// The strategy's own settings: what every rank must share beside the
// trainer's, and what a resumed run must share with the saved one.
std::vector<RunSetting> mixed_own_settings(const TrainConfig& config, const MixedPrecisionRunOptions& options,
                                           int world) {
  const ScalerConfig& d = options.dynamic_scaler;
  return {{"--world", std::to_string(world)},
          {"--precision", dtype_name(config.model.dtype)},
          {"--loss-scale", loss_scale_for(options, config.model.dtype).str()},
          {"dynamic scaler", std::to_string(d.initial_scale) + " x" + std::to_string(d.growth_factor) + " x" +
                                 std::to_string(d.backoff_factor) + " every " + std::to_string(d.growth_interval)},
          {"--reduce-dtype", dtype_name(options.reduce_dtype)}};
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
        ops::cast(checkpoint.tensor(parameter_entry(unit.name(), p.name)).flatten().to(slot.device()), slot);
      }
    }
    ops::cast(master, unit.params());
  }
}

TrainResult run_mixed(const TrainConfig& config, const MixedPrecisionRunOptions& options,
                      const StepCallback& on_step) {
  validate_mixed_precision(config, options);
  const auto start = Clock::now();
  TrainResult result;
  result.peak_by_category.assign(kMemoryCategoryCount, 0);
  launch(World::from_env(options.world), [&](Comm& comm) {
    Trainer trainer(config, comm.rank(), comm.size());
    MasterWeights masters(trainer.model());
    if (!config.load_path.empty()) start_from(masters, read_checkpoint(config.load_path), config.load_path);
    const std::vector<RunSetting> own = mixed_own_settings(config, options, comm.size());
    check_ranks_agree(comm, run_settings(config, own), trainer.model());
    trainer.set_optimizer(make_optimizer(trainer.config(), masters.buffers()));
    Optimizer& optimizer = trainer.optimizer();
    std::unique_ptr<LossScaler> scaler =
        make_scaler(loss_scale_for(options, config.model.dtype), options.dynamic_scaler);
    // What a checkpoint holds beside the model and the optimizer state: the
    // masters, and the scaler's scale and count of good steps.
    const bool checkpoints = !config.save_path.empty() || !config.resume_path.empty();
    Tensor scaler_state;
    if (checkpoints) {
      std::vector<NamedTensor> extra;
      for (const ParamBuffer& b : masters.buffers()) extra.push_back({master_name(b.name), b.params});
      if (scaler) {
        scaler_state = Tensor::zeros(Shape{2}, DType::f64);
        extra.push_back({"loss_scaler", scaler_state});
      }
      trainer.checkpoint_also(std::move(extra));
    }
    if (!config.resume_path.empty()) {
      trainer.resume(config.resume_path, own);
      if (scaler)
        scaler->restore(scaler_state.data<double>()[0], static_cast<std::int64_t>(scaler_state.data<double>()[1]));
    }
    const std::int64_t last = last_step(trainer);
    if (comm.rank() == 0) {
      result.parameters = trainer.model().parameter_count();
      result.data_name = trainer.sampler().data().name();
    }
    std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
    const BatchSampler& sampler = trainer.sampler();
    for (std::int64_t s = trainer.steps_done(); s < last; ++s) {
      const StepMeter meter;
      StepRecord record;
      record.step = s + 1;
      record.lr = config.schedule().at(s);
      record.loss_scale = scaler ? scaler->scale() : 0;
      const Batch batch = sampler.batch(s, config.model.device);
      const MixedStep step =
          comm.size() == 1
              ? mixed_precision_step(masters, optimizer, scaler.get(), batch, record.lr, config.grad_clip)
              : ddp_mixed_precision_step(comm, masters, optimizer, scaler.get(), batch, record.lr,
                                         config.grad_clip, options.reduce_dtype);
      trainer.count_step();
      record.loss = step.loss;
      record.grad_norm = step.grad_norm;
      record.skipped = !step.stepped;
      DTP_CHECK(std::isfinite(record.loss), "train: the loss is ", record.loss, " at step ", record.step,
                " in ", dtype_name(config.model.dtype), "; try a lower --lr, a tighter --clip or --precision bf16");
      meter.finish(record, sampler.local_batch() * sampler.seq());
      report_group_step(comm, record);  // equal slices: rank 0's record gets the mean loss
      if (comm.rank() != 0) continue;
      result.add_step(record, *tracker);
      if (on_step) on_step(record);
    }
    if (comm.rank() == 0 && !config.save_path.empty()) {
      if (scaler) {
        scaler_state.data<double>()[0] = scaler->scale();
        scaler_state.data<double>()[1] = static_cast<double>(scaler->good_steps());
      }
      trainer.save(config.save_path, own);
    }
  });
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace

void validate_mixed_precision(const TrainConfig& config, const MixedPrecisionRunOptions& options) {
  const DType precision = config.model.dtype;
  DTP_CHECK(precision == DType::bf16 || precision == DType::f16,
            "mixed precision: the model must be bf16 or f16 (--precision bf16|fp16), got ", dtype_name(precision));
  DTP_CHECK(options.world >= 1, "mixed precision: --world (ranks) must be at least 1, got ", options.world);
  DTP_CHECK(config.batch % options.world == 0, "mixed precision: the global batch (--batch ", config.batch,
            ") must divide evenly by --world ", options.world);
  DTP_CHECK(options.reduce_dtype == DType::f32 || options.reduce_dtype == precision,
            "mixed precision: --reduce-dtype must be f32 or the model's ", dtype_name(precision), ", got ",
            dtype_name(options.reduce_dtype));
  if (options.loss_scale && options.loss_scale->kind == LossScale::Kind::fixed)
    DTP_CHECK(std::isfinite(options.loss_scale->value) && options.loss_scale->value > 0,
              "mixed precision: a fixed --loss-scale must be finite and > 0, got ", options.loss_scale->value);
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

void register_mixed_precision_strategy(const MixedPrecisionRunOptions& options) {
  register_strategy("mixed", [options](const TrainConfig& config, const StepCallback& on_step) {
    return run_mixed(config, options, on_step);
  });
}

}  // namespace dtp::ch07
