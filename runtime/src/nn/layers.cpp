// The small layers: Linear (with its backward split in two), LayerNorm, GELU
// and cross-entropy. Each forward allocates its output as an activation and
// records in a Saved struct what its backward needs; each backward releases it.
#include <vector>

#include "dtp/error.h"
#include "dtp/nn.h"

namespace dtp {

Tensor new_activation(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, like.dtype(), like.device(), MemoryCategory::activations);
}

Tensor new_gradient(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, like.dtype(), like.device(), MemoryCategory::other);
}

namespace {
Shape with_last_dim(const Shape& shape, std::int64_t last) {
  std::vector<std::int64_t> dims;
  for (int d = 0; d < shape.ndim(); ++d) dims.push_back(shape[d]);
  if (dims.empty())
    dims.push_back(last);
  else
    dims.back() = last;
  return Shape(dims);
}

void require_grads(const Tensor& grad, const char* layer) {
  DTP_CHECK(grad.defined(), layer,
            ": the unit has no gradient buffer (set_buffers was given an undefined grads)");
}
}  // namespace

// --- Linear ----------------------------------------------------------------------------

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool has_bias)
    : in_features(in_features), out_features(out_features), has_bias(has_bias) {}

void Linear::declare(std::vector<ParamSpec>& layout, const std::string& prefix,
                     double weight_std) const {
  layout.push_back(
      {prefix + ".weight", Shape{out_features, in_features}, ParamInit::normal, weight_std});
  if (has_bias) layout.push_back({prefix + ".bias", Shape{out_features}, ParamInit::zeros, 0});
}

void Linear::bind(const Unit& unit, const std::string& prefix) {
  frozen = unit.frozen();
  const ParamView& w = unit.parameter(prefix + ".weight");
  weight = w.value;
  weight_grad = w.grad;
  if (has_bias) {
    const ParamView& b = unit.parameter(prefix + ".bias");
    bias = b.value;
    bias_grad = b.grad;
  }
}

Tensor Linear::forward(const Tensor& x, LinearSaved& saved) const {
  DTP_CHECK(x.defined() && x.ndim() >= 1 && x.size(x.ndim() - 1) == in_features,
            "Linear forward: input must be [..., ", in_features, "], got ", x.describe());
  Tensor y = new_activation(with_last_dim(x.shape(), out_features), x);
  ops::matmul(x, weight, y, false, true);
  if (has_bias) ops::add_bias(y, bias);
  if (adapter) saved.adapter = adapter->forward(x, y);
  saved.input = x;
  return y;
}

void Linear::backward_input_into(const Tensor& dy, Tensor& dx, bool accumulate) const {
  DTP_CHECK(dy.defined() && dy.ndim() >= 1 && dy.size(dy.ndim() - 1) == out_features,
            "Linear backward: dy must be [..., ", out_features, "], got ", dy.describe());
  ops::matmul(dy, weight, dx, false, false, 1.0, accumulate ? 1.0 : 0.0);
  if (adapter) adapter->backward_input(dy, dx);
}

Tensor Linear::backward_input(const Tensor& dy) const {
  DTP_CHECK(dy.defined() && dy.ndim() >= 1, "Linear backward: dy is undefined or 0-D");
  Tensor dx = new_gradient(with_last_dim(dy.shape(), in_features), dy);
  backward_input_into(dy, dx, false);
  return dx;
}

void Linear::backward_weight(const Tensor& dy, const LinearSaved& saved) const {
  DTP_CHECK(saved.input.defined(),
            "Linear backward_weight: no saved input (forward not run, or already released)");
  if (adapter) adapter->backward_weight(dy, saved.input, saved.adapter);
  if (frozen) return;
  require_grads(weight_grad, "Linear backward_weight");
  Tensor dw = weight_grad;  // a view: writes land in the unit's gradient buffer
  ops::matmul(dy, saved.input, dw, true, false, 1.0, 1.0);
  if (has_bias) {
    Tensor db = bias_grad;
    ops::bias_backward(dy, db);
  }
}

Tensor Linear::backward(const Tensor& dy, LinearSaved& saved, PendingWeightGrads* defer) const {
  Tensor dx = backward_input(dy);
  if (defer) {
    defer->add([this, dy, kept = saved] { backward_weight(dy, kept); });
  } else {
    backward_weight(dy, saved);
  }
  saved = LinearSaved{};
  return dx;
}

// --- LayerNorm ---------------------------------------------------------------------------

void LayerNorm::declare(std::vector<ParamSpec>& layout, const std::string& prefix) const {
  layout.push_back({prefix + ".weight", Shape{features}, ParamInit::ones, 0});
  layout.push_back({prefix + ".bias", Shape{features}, ParamInit::zeros, 0});
}

void LayerNorm::bind(const Unit& unit, const std::string& prefix) {
  frozen = unit.frozen();
  weight = unit.parameter(prefix + ".weight").value;
  weight_grad = unit.parameter(prefix + ".weight").grad;
  bias = unit.parameter(prefix + ".bias").value;
  bias_grad = unit.parameter(prefix + ".bias").grad;
}

Tensor LayerNorm::forward(const Tensor& x, LayerNormSaved& saved) const {
  DTP_CHECK(x.defined() && x.ndim() >= 1 && x.size(x.ndim() - 1) == features,
            "LayerNorm forward: input must be [..., ", features, "], got ", x.describe());
  const std::int64_t rows = x.numel() / features;
  Tensor y = new_activation(x.shape(), x);
  saved.mean = new_activation(Shape{rows}, x);
  saved.rstd = new_activation(Shape{rows}, x);
  ops::layernorm_forward(x, weight, bias, y, saved.mean, saved.rstd, eps);
  saved.input = x;
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy, LayerNormSaved& saved) const {
  if (!frozen) require_grads(weight_grad, "LayerNorm backward");
  DTP_CHECK(saved.input.defined(),
            "LayerNorm backward: no saved activations (forward not run, or already released)");
  Tensor dx = new_gradient(saved.input.shape(), dy);
  // Frozen: the op's weight and bias sums land in scratch and are dropped.
  Tensor dw =
      frozen ? Tensor::zeros(weight.shape(), weight.dtype(), weight.device(), MemoryCategory::other)
             : weight_grad;
  Tensor db = frozen
                  ? Tensor::zeros(bias.shape(), bias.dtype(), bias.device(), MemoryCategory::other)
                  : bias_grad;
  ops::layernorm_backward(dy, saved.input, weight, saved.mean, saved.rstd, dx, dw, db);
  saved = LayerNormSaved{};
  return dx;
}

// --- GELU ----------------------------------------------------------------------------------

Tensor Gelu::forward(const Tensor& x, GeluSaved& saved) const {
  Tensor y = new_activation(x.shape(), x);
  ops::gelu_forward(x, y);
  saved.input = x;
  return y;
}

Tensor Gelu::backward(const Tensor& dy, GeluSaved& saved) const {
  DTP_CHECK(saved.input.defined(),
            "Gelu backward: no saved input (forward not run, or already released)");
  Tensor dx = new_gradient(dy.shape(), dy);
  ops::gelu_backward(saved.input, dy, dx);
  saved = GeluSaved{};
  return dx;
}

// --- cross-entropy ---------------------------------------------------------------------------

double CrossEntropy::forward(const Tensor& logits, const Tensor& targets,
                             CrossEntropySaved& saved) const {
  Tensor no_losses;
  const double loss = ops::cross_entropy_forward(logits, targets, no_losses);
  saved.logits = logits;
  saved.targets = targets;
  return loss;
}

Tensor CrossEntropy::backward(CrossEntropySaved& saved, double loss_scale) const {
  DTP_CHECK(saved.logits.defined(),
            "CrossEntropy backward: no saved logits (forward not run, or already released)");
  Tensor dlogits = saved.logits;  // in place: the logits are not needed afterwards
  const std::int64_t rows = saved.targets.numel();
  ops::cross_entropy_backward(saved.logits, saved.targets,
                              rows > 0 ? loss_scale / static_cast<double>(rows) : 0.0, dlogits);
  saved = CrossEntropySaved{};
  return dlogits;
}

}  // namespace dtp
