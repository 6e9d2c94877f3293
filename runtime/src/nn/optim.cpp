// SGD, AdamW, the warm-up + cosine schedule and global-norm clipping.
#include "dtp/optim.h"

#include <cmath>
#include <numbers>

#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/nn_ops.h"
#include "dtp/ops.h"

namespace dtp {

std::vector<ParamBuffer> param_buffers(GPT& model) { return param_buffers(model.units()); }

std::vector<ParamBuffer> param_buffers(const std::vector<Unit*>& units) {
  std::vector<ParamBuffer> out;
  for (Unit* unit : units) out.push_back({unit->name(), unit->params(), unit->grads()});
  return out;
}

std::vector<Tensor> grad_tensors(const std::vector<ParamBuffer>& buffers) {
  std::vector<Tensor> out;
  for (const ParamBuffer& b : buffers) {
    DTP_CHECK(b.grads.defined(), "optimizer: buffer '", b.name,
              "' has no gradients attached (Optimizer::set_grads attaches them)");
    out.push_back(b.grads);
  }
  return out;
}

namespace {
void check_grads_match(const ParamBuffer& b) {
  if (!b.grads.defined()) return;
  DTP_CHECK(b.params.numel() == b.grads.numel() && b.params.dtype() == b.grads.dtype() &&
                b.params.device() == b.grads.device(),
            "optimizer: buffer '", b.name, "' has params ", b.params.describe(), " but grads ",
            b.grads.describe(), "; they must match in dtype, element count and device");
}
}  // namespace

Optimizer::Optimizer(std::vector<ParamBuffer> buffers) : buffers_(std::move(buffers)) {
  for (const ParamBuffer& b : buffers_) {
    DTP_CHECK(b.params.defined(), "optimizer: buffer '", b.name, "' needs defined params");
    check_grads_match(b);
  }
}

void Optimizer::set_grads(std::size_t i, Tensor grads) {
  DTP_CHECK(i < buffers_.size(), "optimizer: set_grads(", i, ", ...) but there are ",
            buffers_.size(), " buffers");
  ParamBuffer candidate = buffers_[i];
  candidate.grads = std::move(grads);
  check_grads_match(candidate);
  buffers_[i] = std::move(candidate);
}

void Optimizer::set_steps(std::int64_t steps) {
  DTP_CHECK(steps >= 0, "Optimizer::set_steps: a count of updates is at least 0, got ", steps);
  steps_ = steps;
}

double Optimizer::clip_gradients(double max_norm) {
  return clip_grad_norm(grad_tensors(buffers_), max_norm);
}

Tensor Optimizer::new_state(std::size_t i) const {
  const Tensor& p = buffers_[i].params;
  return Tensor::zeros(p.shape(), p.dtype(), p.device(), MemoryCategory::optimizer);
}

SGD::SGD(std::vector<ParamBuffer> buffers, SGDConfig config)
    : Optimizer(std::move(buffers)), config_(config) {
  DTP_CHECK(config_.momentum >= 0 && config_.momentum < 1, "SGD: momentum must be in [0, 1), got ",
            config_.momentum);
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    momentum_.push_back(config_.momentum != 0 ? new_state(i) : Tensor());
}

void SGD::step(double lr) {
  grad_tensors(buffers_);  // every buffer has gradients attached
  ++steps_;
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    ops::sgd_update(buffers_[i].params, buffers_[i].grads, momentum_[i], lr, config_.momentum,
                    config_.weight_decay, config_.nesterov);
}

std::vector<std::string> state_kinds(const Optimizer& optimizer) {
  DTP_CHECK(!optimizer.buffers().empty(), "state_kinds: the optimizer has no buffers");
  const std::string first = optimizer.buffers().front().name + ".";
  std::vector<std::string> kinds;
  for (const NamedTensor& s : optimizer.state())
    if (s.name.rfind(first, 0) == 0) kinds.push_back(s.name.substr(first.size()));
  return kinds;
}

Tensor state_tensor(const Optimizer& optimizer, const std::string& buffer,
                    const std::string& kind) {
  const std::string name = buffer + "." + kind;
  for (const NamedTensor& s : optimizer.state())
    if (s.name == name) return s.tensor;
  DTP_CHECK(false, "state_tensor: the ", optimizer.name(), " optimizer has no state '", name, "'");
  return Tensor();
}

std::vector<NamedTensor> SGD::state() const {
  std::vector<NamedTensor> named;
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    if (momentum_[i].defined()) named.push_back({buffers_[i].name + ".momentum", momentum_[i]});
  return named;
}

AdamW::AdamW(std::vector<ParamBuffer> buffers, AdamWConfig config)
    : Optimizer(std::move(buffers)), config_(config) {
  DTP_CHECK(config_.beta1 >= 0 && config_.beta1 < 1 && config_.beta2 >= 0 && config_.beta2 < 1,
            "AdamW: beta1 and beta2 must be in [0, 1), got ", config_.beta1, " and ",
            config_.beta2);
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    m_.push_back(new_state(i));
    v_.push_back(new_state(i));
  }
}

void AdamW::step(double lr) {
  grad_tensors(buffers_);  // every buffer has gradients attached
  ++steps_;
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    ops::adamw_update(buffers_[i].params, buffers_[i].grads, m_[i], v_[i], lr, config_.beta1,
                      config_.beta2, config_.eps, config_.weight_decay, steps_);
}

std::vector<NamedTensor> AdamW::state() const {
  std::vector<NamedTensor> named;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    named.push_back({buffers_[i].name + ".m", m_[i]});
    named.push_back({buffers_[i].name + ".v", v_[i]});
  }
  return named;
}

double LRSchedule::at(std::int64_t step) const {
  if (step < warmup_steps)
    return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const std::int64_t decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0) return max_lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

double global_grad_norm(const std::vector<Tensor>& grads) {
  double sum = 0;
  for (double s : ops::sum_squares(grads)) sum += s;  // one wait on a GPU, not one per tensor
  return std::sqrt(sum);
}

namespace {
// Scales @p grads as clip_grad_norm does for a global norm @p norm.
void scale_to(const std::vector<Tensor>& grads, double norm, double max_norm) {
  if (max_norm > 0 && norm > max_norm && std::isfinite(norm)) {
    const double factor = max_norm / (norm + 1e-6);
    for (Tensor g : grads) ops::scale(g, factor);
  }
}
}  // namespace

double clip_grad_norm(const std::vector<Tensor>& grads, double max_norm) {
  const double norm = global_grad_norm(grads);
  scale_to(grads, norm, max_norm);
  return norm;
}

double clip_sharded_grad_norm(Comm& comm, const std::vector<Tensor>& shards, double max_norm) {
  double squares = 0;
  for (double s : ops::sum_squares(shards)) squares += s;
  const double norm = std::sqrt(all_reduce_value(comm, squares, ReduceOp::sum));
  scale_to(shards, norm, max_norm);
  return norm;
}

}  // namespace dtp
