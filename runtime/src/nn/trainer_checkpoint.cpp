// Saving a training run, resuming it, and starting a model from saved
// parameters (see dtp/checkpoint.h for the file).
#include <algorithm>
#include <set>
#include <sstream>

#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/nn_ops.h"
#include "dtp/train_checkpoint.h"
#include "dtp/train_run.h"
#include "dtp/trainer.h"

namespace dtp {

namespace {

const std::string kParams = "params/";
const std::string kExtra = "extra/";
const std::string kOptimizer = "optimizer/";
// The optimizer's update count, which AdamW's bias correction goes by: fewer
// than the steps done when a loss scaler skipped some (chapter 07).
const std::string kOptimizerSteps = "optimizer/steps";

// Settings a resumed run may change: how long it runs, where it runs, and
// what the log records about how it was started.
const std::set<std::string> kFreeOnResume = {"kind", "steps", "device", "command_line", "git"};

/// "batch 16 in the saved run, 8 in this one" for every member of @p saved
/// and @p now that differs (nested objects by dotted name), but @p skip.
void differences(const JsonValue& saved, const JsonValue& now, const std::string& prefix,
                 const std::set<std::string>& skip, std::vector<std::string>& out) {
  for (const auto& [key, value] : now.members) {
    if (skip.count(key)) continue;
    const JsonValue* before = saved.find(key);
    const std::string name = prefix + key;
    if (!before) {
      out.push_back(name + " (not in the saved run)");
    } else if (before->kind == JsonValue::Kind::object && value.kind == JsonValue::Kind::object) {
      differences(*before, value, name + ".", {}, out);
    } else if (before->dump() != value.dump()) {
      out.push_back(name + " " + before->dump() + " in the saved run, " + value.dump() +
                    " in this one");
    }
  }
}

std::string listed(const std::vector<std::string>& items) {
  std::ostringstream text;
  for (const std::string& item : items) text << "\n  " << item;
  return text.str();
}

/// Copies checkpoint tensor @p name into @p into, which must match it.
void restore(const Checkpoint& checkpoint, const std::string& name, Tensor& into,
             const std::string& path) {
  DTP_CHECK(checkpoint.has(name), path, ": the checkpoint has no ", name);
  const Tensor& saved = checkpoint.tensor(name);
  DTP_CHECK(saved.shape() == into.shape() && saved.dtype() == into.dtype(), path, ": ", name,
            " is ", saved.shape().str(), " ", dtype_name(saved.dtype()), " in the checkpoint but ",
            into.shape().str(), " ", dtype_name(into.dtype()), " here");
  into.copy_from(saved);
}

/// The run's settings as a checkpoint records them: the log's config line,
/// with the strategy's own settings (if any) as one more object.
JsonValue saved_settings(const TrainConfig& config, const std::vector<RunSetting>& strategy) {
  JsonValue settings = parse_json(config_json(config));
  if (strategy.empty()) return settings;
  JsonLine line;
  for (const auto& [flag, value] : strategy) line.add(flag, value);
  settings.members.push_back({"strategy_settings", parse_json(line.str())});
  return settings;
}

/// Every parameter of @p model under its checkpoint name, in unit order
/// (those of frozen units too, unless @p trained_only).
std::vector<NamedTensor> parameter_tensors(GPT& model, bool trained_only = false) {
  std::vector<NamedTensor> named;
  for (Unit* unit : model.units())
    if (!(trained_only && unit->frozen()))
      for (const ParamView& p : unit->parameters())
        named.push_back({parameter_entry(unit->name(), p.name), p.value});
  return named;
}

/// What a training checkpoint holds besides the optimizer state: the
/// parameters of the units that train and the extra tensors.
std::vector<NamedTensor> trained_tensors(GPT& model, const std::vector<NamedTensor>& extra) {
  std::vector<NamedTensor> named = parameter_tensors(model, true);
  for (const NamedTensor& t : extra) named.push_back({extra_entry(t.name), t.tensor});
  return named;
}

}  // namespace

std::string parameter_entry(const std::string& unit, const std::string& parameter) {
  return kParams + unit + "." + parameter;
}

std::string optimizer_entry(const std::string& state) { return kOptimizer + state; }

std::string optimizer_entry(const std::string& buffer, const std::string& kind) {
  return optimizer_entry(buffer + "." + kind);
}

std::string extra_entry(const std::string& name) { return kExtra + name; }

void save_parameters(const std::string& path, GPT& model, const TrainConfig& config) {
  Checkpoint checkpoint;
  checkpoint.kind = "model";
  checkpoint.config = parse_json(config_json(config));
  checkpoint.tensors = parameter_tensors(model);
  write_checkpoint(path, checkpoint);
}

void Trainer::save(const std::string& path, const std::vector<RunSetting>& strategy) {
  std::vector<NamedTensor> tensors = trained_tensors(*model_, extra_);
  for (NamedTensor& state : optimizer().state())
    tensors.push_back({optimizer_entry(state.name), state.tensor});
  save_gathered(path, strategy, std::move(tensors));
}

void Trainer::save_gathered(const std::string& path, const std::vector<RunSetting>& strategy,
                            std::vector<NamedTensor> tensors) {
  Checkpoint checkpoint;
  checkpoint.kind = "training";
  checkpoint.step = steps_done_;
  checkpoint.config = saved_settings(config_, strategy);
  checkpoint.tensors = std::move(tensors);
  // f64 holds every count below 2^53 exactly.
  checkpoint.tensors.push_back(
      {kOptimizerSteps,
       Tensor::from_values({static_cast<double>(optimizer().steps())}, DType::f64)});
  write_checkpoint(path, checkpoint);
}

void Trainer::resume(const std::string& path, const std::vector<RunSetting>& strategy) {
  const Checkpoint checkpoint = resume_gathered(path, strategy);
  for (NamedTensor& t : trained_tensors(*model_, extra_))
    restore(checkpoint, t.name, t.tensor, path);
  for (NamedTensor& state : optimizer().state())
    restore(checkpoint, optimizer_entry(state.name), state.tensor, path);
}

Checkpoint Trainer::resume_gathered(const std::string& path,
                                    const std::vector<RunSetting>& strategy) {
  Checkpoint checkpoint = read_checkpoint(path);
  DTP_CHECK(
      checkpoint.kind == "training", "--resume ", path, ": a '", checkpoint.kind,
      "' checkpoint has no optimizer state to resume from (start from its parameters with --load)");
  std::vector<std::string> differ;
  differences(checkpoint.config, saved_settings(config_, strategy), "", kFreeOnResume, differ);
  DTP_CHECK(differ.empty(), "--resume ", path,
            ": a resumed run must have the saved run's settings (all but --steps); ",
            "these differ:", listed(differ));
  DTP_CHECK(checkpoint.step < config_.steps, "--resume ", path, ": the saved run is at step ",
            checkpoint.step, ", so --steps ", config_.steps, " leaves nothing to train");
  std::int64_t updates = checkpoint.step;
  if (checkpoint.has(kOptimizerSteps)) {
    const Tensor& saved = checkpoint.tensor(kOptimizerSteps);
    DTP_CHECK(saved.numel() == 1 && saved.dtype() == DType::f64, "--resume ", path, ": ",
              kOptimizerSteps, " must be one f64, got ", saved.shape().str(), " ",
              dtype_name(saved.dtype()));
    updates = static_cast<std::int64_t>(saved.data<double>()[0]);
  }
  optimizer().set_steps(updates);
  steps_done_ = checkpoint.step;
  return checkpoint;
}

void Trainer::checkpoint_also(std::vector<NamedTensor> tensors) {
  for (NamedTensor& t : tensors) extra_.push_back(std::move(t));
}

std::int64_t start_from_checkpoints(Trainer& trainer, const std::vector<RunSetting>& strategy) {
  const TrainConfig& config = trainer.config();
  load_parameters(trainer.model(), config);
  if (!config.resume_path.empty()) trainer.resume(config.resume_path, strategy);
  return last_step(trainer);
}

std::int64_t last_step(const Trainer& trainer) {
  const TrainConfig& config = trainer.config();
  const std::int64_t last = config.stop_after > 0 ? config.stop_after : config.steps;
  DTP_CHECK(trainer.steps_done() < last, "train: --resume ", config.resume_path, " is at step ",
            trainer.steps_done(), ", so --stop-after ", last, " leaves nothing to train");
  return last;
}

void load_parameters(GPT& model, const Checkpoint& checkpoint, const std::string& path) {
  std::vector<NamedTensor> parameters = parameter_tensors(model);
  for (const NamedTensor& p : parameters) {
    const bool fits =
        checkpoint.has(p.name) && checkpoint.tensor(p.name).shape() == p.tensor.shape() &&
        is_floating(checkpoint.tensor(p.name).dtype()) && is_floating(p.tensor.dtype());
    if (fits) continue;
    // Say which model settings differ: the usual cause.
    std::vector<std::string> differ;
    if (const JsonValue* saved_model = checkpoint.config.find("model"))
      differences(*saved_model, parse_json(model_json(model.config())), "model.", {"parameters"},
                  differ);
    const std::string found = checkpoint.has(p.name)
                                  ? checkpoint.tensor(p.name).shape().str() + " " +
                                        dtype_name(checkpoint.tensor(p.name).dtype())
                                  : "nothing";
    const bool adapters =
        std::any_of(checkpoint.tensors.begin(), checkpoint.tensors.end(),
                    [](const NamedTensor& t) { return t.name.rfind(kExtra, 0) == 0; });
    DTP_CHECK(
        false, "--load ", path, ": this model's ", p.name, " is ", p.tensor.shape().str(), " ",
        dtype_name(p.tensor.dtype()), " but the checkpoint holds ", found,
        differ.empty() ? std::string() : "; the model settings differ:" + listed(differ),
        adapters
            ? "; it is a LoRA run's checkpoint, which holds the adapters, not the frozen base: "
              "continue it with --load BASE --resume FILE, or write a whole model with "
              "--save-merged"
            : "");
  }
  for (NamedTensor& p : parameters) {
    const Tensor& saved = checkpoint.tensor(p.name);
    if (saved.dtype() == p.tensor.dtype())
      p.tensor.copy_from(saved);
    else
      ops::cast(saved.to(p.tensor.device()), p.tensor);  // to the model's dtype
  }
}

void load_parameters(GPT& model, const TrainConfig& config) {
  if (!config.load_path.empty())
    load_parameters(model, read_checkpoint(config.load_path), config.load_path);
}

}  // namespace dtp
