// Saving a training run, resuming it, and starting a model from saved
// parameters (see dtp/checkpoint.h for the file).
#include <set>
#include <sstream>

#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/trainer.h"

namespace dtp {

namespace {

const std::string kParams = "params/";
const std::string kOptimizer = "optimizer/";

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
      out.push_back(name + " " + before->dump() + " in the saved run, " + value.dump() + " in this one");
    }
  }
}

std::string listed(const std::vector<std::string>& items) {
  std::ostringstream text;
  for (const std::string& item : items) text << "\n  " << item;
  return text.str();
}

/// Copies checkpoint tensor @p name into @p into, which must match it.
void restore(const Checkpoint& checkpoint, const std::string& name, Tensor& into, const std::string& path) {
  DTP_CHECK(checkpoint.has(name), path, ": the checkpoint has no ", name);
  const Tensor& saved = checkpoint.tensor(name);
  DTP_CHECK(saved.shape() == into.shape() && saved.dtype() == into.dtype(), path, ": ", name, " is ",
            saved.shape().str(), " ", dtype_name(saved.dtype()), " in the checkpoint but ", into.shape().str(), " ",
            dtype_name(into.dtype()), " here");
  into.copy_from(saved);
}

/// Every parameter of @p model under its checkpoint name, in unit order.
std::vector<NamedTensor> parameter_tensors(GPT& model) {
  std::vector<NamedTensor> named;
  for (Unit* unit : model.units())
    for (const ParamView& p : unit->parameters()) named.push_back({kParams + unit->name() + "." + p.name, p.value});
  return named;
}

}  // namespace

void save_parameters(const std::string& path, GPT& model, const TrainConfig& config) {
  Checkpoint checkpoint;
  checkpoint.kind = "model";
  checkpoint.config = parse_json(config_json(config));
  checkpoint.tensors = parameter_tensors(model);
  write_checkpoint(path, checkpoint);
}

void Trainer::save(const std::string& path) {
  Checkpoint checkpoint;
  checkpoint.kind = "training";
  checkpoint.step = steps_done_;
  checkpoint.config = parse_json(config_json(config_));
  checkpoint.tensors = parameter_tensors(*model_);
  for (NamedTensor& state : optimizer().state()) checkpoint.tensors.push_back({kOptimizer + state.name, state.tensor});
  write_checkpoint(path, checkpoint);
}

void Trainer::resume(const std::string& path) {
  const Checkpoint checkpoint = read_checkpoint(path);
  DTP_CHECK(checkpoint.kind == "training", "--resume ", path, ": a '", checkpoint.kind,
            "' checkpoint has no optimizer state to resume from (start from its parameters with --load)");
  std::vector<std::string> differ;
  differences(checkpoint.config, parse_json(config_json(config_)), "", kFreeOnResume, differ);
  DTP_CHECK(differ.empty(), "--resume ", path, ": a resumed run must have the saved run's settings (all but --steps); ",
            "these differ:", listed(differ));
  DTP_CHECK(checkpoint.step < config_.steps, "--resume ", path, ": the saved run is at step ", checkpoint.step,
            ", so --steps ", config_.steps, " leaves nothing to train");
  for (NamedTensor& p : parameter_tensors(*model_)) restore(checkpoint, p.name, p.tensor, path);
  Optimizer& optim = optimizer();
  for (NamedTensor& state : optim.state()) restore(checkpoint, kOptimizer + state.name, state.tensor, path);
  optim.set_steps(checkpoint.step);
  steps_done_ = checkpoint.step;
}

void load_parameters(GPT& model, const Checkpoint& checkpoint, const std::string& path) {
  std::vector<NamedTensor> parameters = parameter_tensors(model);
  for (const NamedTensor& p : parameters) {
    const bool same = checkpoint.has(p.name) && checkpoint.tensor(p.name).shape() == p.tensor.shape() &&
                      checkpoint.tensor(p.name).dtype() == p.tensor.dtype();
    if (same) continue;
    // Say which model settings differ: the usual cause.
    std::vector<std::string> differ;
    if (const JsonValue* saved_model = checkpoint.config.find("model"))
      differences(*saved_model, parse_json(model_json(model.config())), "model.", {"parameters"}, differ);
    const std::string found = checkpoint.has(p.name) ? checkpoint.tensor(p.name).shape().str() + " " +
                                                           dtype_name(checkpoint.tensor(p.name).dtype())
                                                     : "nothing";
    DTP_CHECK(false, "--load ", path, ": this model's ", p.name, " is ", p.tensor.shape().str(), " ",
              dtype_name(p.tensor.dtype()), " but the checkpoint holds ", found,
              differ.empty() ? std::string() : "; the model settings differ:" + listed(differ));
  }
  for (NamedTensor& p : parameters) p.tensor.copy_from(checkpoint.tensor(p.name));
}

}  // namespace dtp
