// Causal multi-head self-attention and the MLP: the two halves of a block.
#include <cmath>

#include "dtp/error.h"
#include "dtp/nn.h"

namespace dtp {

namespace {
double residual_std(const GPTConfig& config) {
  // GPT-2: residual projections start smaller so the stream's variance does
  // not grow with depth.
  return config.init_std / std::sqrt(2.0 * std::max(1, config.layers));
}
}  // namespace

// --- attention -------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config)
    : q(config.d_model, config.d_model, true),
      k(config.d_model, config.d_model, true),
      v(config.d_model, config.d_model, true),
      proj(config.d_model, config.d_model, true),
      heads(config.heads),
      kind(config.attention),
      init_std(config.init_std),
      proj_std(residual_std(config)) {}

void CausalSelfAttention::declare(std::vector<ParamSpec>& layout, const std::string& prefix) const {
  q.declare(layout, prefix + ".q", init_std);
  k.declare(layout, prefix + ".k", init_std);
  v.declare(layout, prefix + ".v", init_std);
  proj.declare(layout, prefix + ".proj", proj_std);
}

void CausalSelfAttention::bind(const Unit& unit, const std::string& prefix) {
  q.bind(unit, prefix + ".q");
  k.bind(unit, prefix + ".k");
  v.bind(unit, prefix + ".v");
  proj.bind(unit, prefix + ".proj");
}

Tensor CausalSelfAttention::forward(const Tensor& x, AttentionSaved& saved) const {
  DTP_CHECK(x.defined() && x.ndim() == 3, "attention forward: input must be [B, T, C], got ",
            x.describe());
  const std::int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = heads, D = C / H;
  saved.q = q.forward(x, saved.q_in);
  saved.k = k.forward(x, saved.k_in);
  saved.v = v.forward(x, saved.v_in);
  const Shape heads_shape{B, T, H, D};
  if (core) {
    // Another computes the attention (across ranks): it keeps its own state.
    Tensor out = core->forward(saved.q.view(heads_shape), saved.k.view(heads_shape),
                               saved.v.view(heads_shape));
    DTP_CHECK(out.defined() && out.shape() == heads_shape,
              "attention forward: the attention core returned ", out.describe(), ", expected ",
              heads_shape.str());
    return proj.forward(out.view(x.shape()), saved.proj_in);
  }
  Tensor out = new_activation(x.shape(), x);
  Tensor out4 = out.view(heads_shape);
  if (kind == AttentionKind::naive) {
    saved.probs = new_activation(Shape{B, H, T, T}, x);
    ops::attention_forward(saved.q.view(heads_shape), saved.k.view(heads_shape),
                           saved.v.view(heads_shape), out4, saved.probs);
  } else {
    saved.row_max = new_activation(Shape{B, H, T}, x);
    saved.row_sum = new_activation(Shape{B, H, T}, x);
    ops::flash_attention_forward(saved.q.view(heads_shape), saved.k.view(heads_shape),
                                 saved.v.view(heads_shape), out4, saved.row_max, saved.row_sum);
  }
  return proj.forward(out, saved.proj_in);
}

Tensor CausalSelfAttention::backward(const Tensor& dy, AttentionSaved& saved,
                                     PendingWeightGrads* defer) const {
  DTP_CHECK(saved.q.defined(),
            "attention backward: no saved activations (forward not run, or already released)");
  const std::int64_t B = dy.size(0), T = dy.size(1), C = dy.size(2), H = heads, D = C / H;
  const Shape heads_shape{B, T, H, D};
  Tensor attention_out = saved.proj_in.input;
  Tensor dout = proj.backward(dy, saved.proj_in, defer);
  Tensor dq = new_gradient(dy.shape(), dy), dk = new_gradient(dy.shape(), dy),
         dv = new_gradient(dy.shape(), dy);
  Tensor dq4 = dq.view(heads_shape), dk4 = dk.view(heads_shape), dv4 = dv.view(heads_shape);
  if (core) {
    core->backward(dout.view(heads_shape), dq4, dk4, dv4);
    for (const Tensor* g : {&dq4, &dk4, &dv4})
      DTP_CHECK(g->defined() && g->shape() == heads_shape,
                "attention backward: the attention core set a gradient ", g->describe(),
                ", expected ", heads_shape.str());
    dq = dq4.view(dy.shape());
    dk = dk4.view(dy.shape());
    dv = dv4.view(dy.shape());
  } else if (kind == AttentionKind::naive) {
    ops::attention_backward(saved.q.view(heads_shape), saved.k.view(heads_shape),
                            saved.v.view(heads_shape), saved.probs, dout.view(heads_shape), dq4,
                            dk4, dv4);
  } else {
    ops::flash_attention_backward(saved.q.view(heads_shape), saved.k.view(heads_shape),
                                  saved.v.view(heads_shape), attention_out.view(heads_shape),
                                  saved.row_max, saved.row_sum, dout.view(heads_shape), dq4, dk4,
                                  dv4);
  }
  attention_out = Tensor();
  saved.q = saved.k = saved.v = saved.probs = saved.row_max = saved.row_sum = Tensor();
  // The input fed all three projections: its gradient is the sum of theirs.
  Tensor dx = q.backward(dq, saved.q_in, defer);
  Tensor dx_k = k.backward(dk, saved.k_in, defer);
  ops::axpy(dx, 1.0, dx_k);
  dx_k = Tensor();
  Tensor dx_v = v.backward(dv, saved.v_in, defer);
  ops::axpy(dx, 1.0, dx_v);
  return dx;
}

// --- MLP ---------------------------------------------------------------------------------

Mlp::Mlp(const GPTConfig& config)
    : fc(config.d_model, std::int64_t{config.mlp_ratio} * config.d_model, true),
      proj(std::int64_t{config.mlp_ratio} * config.d_model, config.d_model, true),
      init_std(config.init_std),
      proj_std(residual_std(config)) {}

void Mlp::declare(std::vector<ParamSpec>& layout, const std::string& prefix) const {
  fc.declare(layout, prefix + ".fc", init_std);
  proj.declare(layout, prefix + ".proj", proj_std);
}

void Mlp::bind(const Unit& unit, const std::string& prefix) {
  fc.bind(unit, prefix + ".fc");
  proj.bind(unit, prefix + ".proj");
}

Tensor Mlp::forward(const Tensor& x, MlpSaved& saved) const {
  Tensor hidden = fc.forward(x, saved.fc);
  Tensor activated = gelu.forward(hidden, saved.gelu);
  return proj.forward(activated, saved.proj);
}

Tensor Mlp::backward(const Tensor& dy, MlpSaved& saved, PendingWeightGrads* defer) const {
  Tensor d_activated = proj.backward(dy, saved.proj, defer);
  Tensor d_hidden = gelu.backward(d_activated, saved.gelu);
  d_activated = Tensor();
  return fc.backward(d_hidden, saved.fc, defer);
}

}  // namespace dtp
