// Unit: one flat parameter buffer and one flat gradient buffer, with a view
// per named parameter. Initialization draws from a stream seeded by (model
// seed, unit index), so a unit built alone (a pipeline stage, an FSDP shard
// owner) starts with the same weights as in the whole model.
#include "dtp/error.h"
#include "dtp/nn.h"

namespace dtp {

Unit::Unit(std::string name, int index, const GPTConfig& config, std::vector<ParamSpec> layout)
    : config_(config), name_(std::move(name)), index_(index), layout_(std::move(layout)) {
  config_.validate();
  for (const ParamSpec& spec : layout_)
    if (spec.held) numel_ += spec.shape.numel();
  params_ = Tensor::zeros({numel_}, config_.dtype, config_.device, MemoryCategory::params);
  grads_ = Tensor::zeros({numel_}, config_.dtype, config_.device, MemoryCategory::grads);
  make_views();
}

void Unit::finish_construction() {
  reset_parameters();
  bind();
}

void Unit::make_views() {
  views_.clear();
  std::int64_t offset = 0;
  for (const ParamSpec& spec : layout_) {
    if (!spec.held) continue;
    ParamView view;
    view.name = spec.name;
    view.shape = spec.shape;
    view.offset = offset;
    if (params_.defined()) view.value = params_.slice(offset, spec.shape.numel()).view(spec.shape);
    if (grads_.defined()) view.grad = grads_.slice(offset, spec.shape.numel()).view(spec.shape);
    views_.push_back(std::move(view));
    offset += spec.shape.numel();
  }
}

const ParamView& Unit::parameter(const std::string& name) const {
  for (const ParamView& view : views_)
    if (view.name == name) return view;
  std::string names;
  for (const ParamView& view : views_) names += (names.empty() ? "" : ", ") + view.name;
  DTP_CHECK(false, "unit '", name_, "' has no parameter '", name, "'; it has: ", names);
  return views_.front();
}

void Unit::zero_grad() {
  if (grads_.defined()) grads_.fill(0.0);
}

void Unit::require_params(const char* pass) const {
  DTP_CHECK(params_.defined(), "unit '", name_, "' has no parameters: all-gather them before its ",
            pass, " (FSDP), then install them with set_buffers()");
}

void Unit::reset_parameters() {
  DTP_CHECK(params_.defined(), "unit '", name_,
            "': reset_parameters needs its parameters; install a buffer with set_buffers() first");
  // Values are drawn on the host and copied, so every device starts from the
  // same weights.
  const bool on_host = params_.device().is_cpu();
  Tensor host = on_host ? params_ : Tensor::empty({numel_}, config_.dtype, Device::cpu());
  Rng rng(Rng::derive(config_.seed, static_cast<std::uint64_t>(index_)));
  std::int64_t offset = 0;
  for (const ParamSpec& spec : layout_) {
    // A parameter this unit does not hold is still drawn (into a scratch
    // tensor), so that the stream reaches the next one where it would in the whole unit.
    const std::int64_t numel = spec.shape.numel();
    Tensor value = spec.held ? host.slice(offset, numel)
                             : Tensor::empty({numel}, config_.dtype, Device::cpu());
    if (spec.held) offset += numel;
    switch (spec.init) {
      case ParamInit::zeros:
        value.fill(0.0);
        break;
      case ParamInit::ones:
        value.fill(1.0);
        break;
      case ParamInit::normal:
        ops::fill_normal(value, 0.0, spec.std, rng);
        break;
    }
  }
  if (!on_host) params_.copy_from(host);
}

void Unit::freeze() {
  frozen_ = true;
  set_buffers(params_, Tensor());  // rebinds the layers, now frozen, without gradient views
}

void Unit::set_buffers(Tensor params, Tensor grads) {
  DTP_CHECK(!frozen_ || !grads.defined(), "unit '", name_,
            "' is frozen (Unit::freeze): it takes no gradient buffer, got ", grads.describe());
  DTP_CHECK(!params.defined() || (params.numel() == numel_ && params.dtype() == config_.dtype),
            "unit '", name_, "': set_buffers needs params with ", numel_, " elements of ",
            dtype_name(config_.dtype), " (or an undefined tensor to release them), got ",
            params.describe());
  DTP_CHECK(!grads.defined() || (grads.numel() == numel_ && grads.dtype() == config_.dtype),
            "unit '", name_, "': set_buffers needs grads with ", numel_, " elements of ",
            dtype_name(config_.dtype), " (or an undefined tensor), got ", grads.describe());
  // Views and layers are rebuilt from the new buffers, so no handle to the
  // old storage survives here: a released buffer is freed with its last user.
  params_ = params.defined() ? params.flatten() : Tensor();
  grads_ = grads.defined() ? grads.flatten() : Tensor();
  make_views();
  bind();
}

void PendingWeightGrads::run() {
  std::vector<std::function<void()>> work = std::move(work_);
  work_.clear();
  for (auto& fn : work) fn();
}

}  // namespace dtp
