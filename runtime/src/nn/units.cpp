// The three kinds of unit: Embedding, Block, Head. Each builds its flat
// layout from its layers' declarations, then binds the layers to the views.
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/trace.h"

namespace dtp {

namespace {
Tensor new_activation(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, like.dtype(), like.device(), MemoryCategory::activations);
}

void check_ids(const char* what, const Tensor& ids, const GPTConfig& config) {
  DTP_CHECK(ids.defined() && ids.dtype() == DType::i32 && ids.ndim() == 2, what,
            " must be i32 [B, T] token ids, got ", ids.describe());
  DTP_CHECK(ids.size(1) <= config.context, what, " has T = ", ids.size(1),
            " positions but the model's context is ", config.context);
}

std::vector<ParamSpec> embedding_layout(const GPTConfig& c) {
  return {{"tokens", Shape{c.vocab_size, c.d_model}, ParamInit::normal, c.init_std},
          {"positions", Shape{c.context, c.d_model}, ParamInit::normal, c.init_std}};
}

std::vector<ParamSpec> block_layout(const GPTConfig& c) {
  std::vector<ParamSpec> layout;
  LayerNorm(c.d_model, c.layernorm_eps).declare(layout, "ln1");
  CausalSelfAttention(c).declare(layout, "attn");
  LayerNorm(c.d_model, c.layernorm_eps).declare(layout, "ln2");
  if (c.experts > 0)
    MoeMlp(c).declare(layout, "moe");
  else
    Mlp(c).declare(layout, "mlp");
  return layout;
}

std::vector<ParamSpec> head_layout(const GPTConfig& c) {
  std::vector<ParamSpec> layout;
  LayerNorm(c.d_model, c.layernorm_eps).declare(layout, "ln");
  Linear(c.d_model, c.vocab_size, false).declare(layout, "lm", c.init_std);
  return layout;
}
}  // namespace

// --- Embedding ----------------------------------------------------------------------------

Embedding::Embedding(const GPTConfig& config)
    : Unit("embedding", 0, config, embedding_layout(config)) {
  finish_construction();
}

void Embedding::bind() {
  tokens = value("tokens");
  positions = value("positions");
  tokens_grad = grad("tokens");
  positions_grad = grad("positions");
}

Tensor Embedding::forward(const Tensor& ids, EmbeddingSaved& saved,
                          std::int64_t start_position) const {
  require_params("forward");
  check_ids("Embedding forward: ids", ids, config_);
  Tensor x = new_activation(Shape{ids.size(0), ids.size(1), config_.d_model}, tokens);
  ops::embedding_forward(ids, tokens, x);
  ops::add_positions(x, positions, start_position);
  saved.ids = ids;
  saved.start_position = start_position;
  return x;
}

void Embedding::backward(const Tensor& dx, EmbeddingSaved& saved) {
  require_params("backward");
  DTP_CHECK(saved.ids.defined(),
            "Embedding backward: no saved ids (forward not run, or already released)");
  DTP_CHECK(tokens_grad.defined(), "Embedding backward: the unit has no gradient buffer");
  ops::embedding_backward(saved.ids, dx, tokens_grad);
  ops::positions_backward(dx, positions_grad, saved.start_position);
  saved = EmbeddingSaved{};
}

// --- Block ----------------------------------------------------------------------------------

Block::Block(const GPTConfig& config, int layer)
    : Unit("block." + std::to_string(layer), 1 + layer, config, block_layout(config)),
      ln1(config.d_model, config.layernorm_eps),
      ln2(config.d_model, config.layernorm_eps),
      attn(config),
      mlp(config),
      moe(config.experts > 0 ? MoeMlp(config) : MoeMlp()),
      layer_(layer) {
  finish_construction();
}

void Block::bind() {
  ln1.bind(*this, "ln1");
  attn.bind(*this, "attn");
  ln2.bind(*this, "ln2");
  if (is_moe())
    moe.bind(*this, "moe");
  else
    mlp.bind(*this, "mlp");
}

Tensor Block::forward(const Tensor& x, BlockSaved& saved) const {
  require_params("forward");
  DTP_CHECK(x.defined() && x.ndim() == 3 && x.size(2) == config_.d_model, name(),
            " forward: input must be [B, T, ", config_.d_model, "], got ", x.describe());
  Tensor h, mid;
  {
    trace::Scope span(name() + " attention forward", "compute");
    h = ln1.forward(x, saved.ln1);
    mid = attn.forward(h, saved.attn);
    ops::axpy(mid, 1.0, x);  // residual, in place: mid = x + attn(ln1(x))
  }
  trace::Scope span(name() + " mlp forward", "compute");
  h = ln2.forward(mid, saved.ln2);
  Tensor out = is_moe() ? moe.forward(h, saved.moe) : mlp.forward(h, saved.mlp);
  ops::axpy(out, 1.0, mid);
  return out;
}

Tensor Block::backward(const Tensor& dy, BlockSaved& saved, WeightGrads mode,
                       double loss_scale) const {
  require_params("backward");
  DTP_CHECK(saved.ln1.input.defined(), name(),
            " backward: no saved activations (forward not run, or already released)");
  PendingWeightGrads* defer = mode == WeightGrads::deferred ? &saved.pending : nullptr;
  Tensor d_mid;
  {
    trace::Scope span(name() + " mlp backward", "compute");
    Tensor dh = is_moe() ? moe.backward(dy, saved.moe, loss_scale, defer)
                         : mlp.backward(dy, saved.mlp, defer);
    d_mid = ln2.backward(dh, saved.ln2);
    ops::axpy(d_mid, 1.0, dy);  // the residual path
  }
  trace::Scope span(name() + " attention backward", "compute");
  Tensor dh = attn.backward(d_mid, saved.attn, defer);
  Tensor dx = ln1.backward(dh, saved.ln1);
  ops::axpy(dx, 1.0, d_mid);
  return dx;
}

void Block::backward_weight(BlockSaved& saved) const {
  trace::Scope span(name() + " weight backward", "compute");
  saved.pending.run();
}

// --- Head -----------------------------------------------------------------------------------

Head::Head(const GPTConfig& config)
    : Unit("head", config.layers + 1, config, head_layout(config)),
      ln(config.d_model, config.layernorm_eps),
      lm(config.d_model, config.vocab_size, false) {
  finish_construction();
}

void Head::bind() {
  ln.bind(*this, "ln");
  lm.bind(*this, "lm");
}

double Head::forward(const Tensor& x, const Tensor& targets, HeadSaved& saved) const {
  require_params("forward");
  DTP_CHECK(x.defined() && x.ndim() == 3 && x.size(2) == config_.d_model,
            "head forward: input must be [B, T, ", config_.d_model, "], got ", x.describe());
  check_ids("head forward: targets", targets, config_);
  DTP_CHECK(targets.size(0) == x.size(0) && targets.size(1) == x.size(1),
            "head forward: targets must be [", x.size(0), ", ", x.size(1), "] like the input, got ",
            targets.describe());
  Tensor h = ln.forward(x, saved.ln);
  Tensor logits = lm.forward(h, saved.lm);
  return loss.forward(logits, targets, saved.loss);
}

Tensor Head::backward(HeadSaved& saved, double loss_scale) const {
  require_params("backward");
  Tensor dlogits = loss.backward(saved.loss, loss_scale);
  Tensor dh = lm.backward(dlogits, saved.lm);
  dlogits = Tensor();
  return ln.backward(dh, saved.ln);
}

Tensor Head::logits(const Tensor& x) const {
  require_params("forward");
  HeadSaved scratch;
  Tensor h = ln.forward(x, scratch.ln);
  Tensor out = Tensor::empty(Shape{x.size(0), x.size(1), config_.vocab_size}, x.dtype(), x.device(),
                             MemoryCategory::other);
  ops::matmul(h, lm.weight, out, false, true);
  return out;
}

}  // namespace dtp
