// The three kinds of unit: Embedding, Block, Head. Each builds its flat
// layout from its layers' declarations, then binds the layers to the views.
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/trace.h"

namespace dtp {

namespace {
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
  DTP_CHECK(ids.defined() && ids.ndim() == 2,
            "Embedding forward: ids must be i32 [B, T] token ids, got ", ids.describe());
  return forward(ids, saved, std::vector<PositionRange>{{start_position, ids.size(1)}});
}

namespace {
// Rows [first, first + count) of a table [P, C]: a view.
Tensor table_rows(const Tensor& table, std::int64_t first, std::int64_t count) {
  const std::int64_t C = table.size(1);
  return table.slice(first * C, count * C).view(Shape{count, C});
}

// The rows of a position table [P, C] that @p ranges name, stacked in order:
// the positions a zigzag rank's tokens sit at.
Tensor position_rows(const Tensor& table, const std::vector<PositionRange>& ranges,
                     std::int64_t total, MemoryCategory category) {
  Tensor rows = Tensor::empty(Shape{total, table.size(1)}, table.dtype(), table.device(), category);
  std::int64_t at = 0;
  for (const PositionRange& r : ranges) {
    Tensor to = table_rows(rows, at, r.length);
    to.copy_from(table_rows(table, r.start, r.length));
    at += r.length;
  }
  return rows;
}
}  // namespace

Tensor Embedding::forward(const Tensor& ids, EmbeddingSaved& saved,
                          const std::vector<PositionRange>& ranges) const {
  require_params("forward");
  check_ids("Embedding forward: ids", ids, config_);
  std::int64_t total = 0;
  for (const PositionRange& r : ranges) {
    DTP_CHECK(r.start >= 0 && r.length >= 1 && r.end() <= config_.context,
              "Embedding forward: positions [", r.start, ", ", r.end(),
              ") are not inside the model's context [0, ", config_.context, ")");
    total += r.length;
  }
  DTP_CHECK(total == ids.size(1), "Embedding forward: the position ranges hold ", total,
            " positions but the ids have T = ", ids.size(1));
  Tensor x = new_activation(Shape{ids.size(0), ids.size(1), config_.d_model}, tokens);
  ops::embedding_forward(ids, tokens, x);
  if (ranges.size() == 1)
    ops::add_positions(x, positions, ranges[0].start);
  else
    ops::add_positions(x, position_rows(positions, ranges, total, MemoryCategory::other), 0);
  saved.ids = ids;
  saved.ranges = ranges;
  return x;
}

void Embedding::backward(const Tensor& dx, EmbeddingSaved& saved) {
  require_params("backward");
  DTP_CHECK(saved.ids.defined(),
            "Embedding backward: no saved ids (forward not run, or already released)");
  if (frozen()) {  // nothing flows further back than the embedding
    saved = EmbeddingSaved{};
    return;
  }
  DTP_CHECK(tokens_grad.defined(), "Embedding backward: the unit has no gradient buffer");
  ops::embedding_backward(saved.ids, dx, tokens_grad);
  if (saved.ranges.size() == 1) {
    ops::positions_backward(dx, positions_grad, saved.ranges[0].start);
  } else {
    // Sum over the batch into the stacked rows, then add each range home.
    Tensor rows = Tensor::zeros(Shape{dx.size(1), config_.d_model}, dx.dtype(), dx.device(),
                                MemoryCategory::other);
    ops::positions_backward(dx, rows, 0);
    std::int64_t at = 0;
    for (const PositionRange& r : saved.ranges) {
      Tensor home = table_rows(positions_grad, r.start, r.length);
      ops::axpy(home, 1.0, table_rows(rows, at, r.length));
      at += r.length;
    }
  }
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

std::vector<Tensor*> saved_tensor_slots(BlockSaved& saved) {
  MoeSaved& moe = saved.moe;
  DTP_CHECK(!moe.probs.defined() && moe.rows.empty() && moe.experts.empty(),
            "saved_tensor_slots: a mixture-of-experts block's tensors are not enumerated (only a "
            "dense block's)");
  auto linear = [](LinearSaved& l) { return std::vector<Tensor*>{&l.input, &l.adapter}; };
  std::vector<Tensor*> slots = {&saved.ln1.input, &saved.ln1.mean, &saved.ln1.rstd};
  AttentionSaved& a = saved.attn;
  for (LinearSaved* l : {&a.q_in, &a.k_in, &a.v_in, &a.proj_in})
    for (Tensor* t : linear(*l)) slots.push_back(t);
  for (Tensor* t : {&a.q, &a.k, &a.v, &a.probs, &a.row_max, &a.row_sum}) slots.push_back(t);
  for (Tensor* t : {&saved.ln2.input, &saved.ln2.mean, &saved.ln2.rstd}) slots.push_back(t);
  for (Tensor* t : linear(saved.mlp.fc)) slots.push_back(t);
  slots.push_back(&saved.mlp.gelu.input);
  for (Tensor* t : linear(saved.mlp.proj)) slots.push_back(t);
  return slots;
}

Tensor Block::forward(const Tensor& x, BlockSaved& saved) const {
  return policy ? policy->forward(*this, x, saved) : run_forward(x, saved);
}

Tensor Block::backward(const Tensor& dy, BlockSaved& saved, WeightGrads mode,
                       double loss_scale) const {
  return policy ? policy->backward(*this, dy, saved, mode, loss_scale)
                : run_backward(dy, saved, mode, loss_scale);
}

Tensor Block::run_forward(const Tensor& x, BlockSaved& saved) const {
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
  Tensor out;
  if (is_moe() && moe_core) {
    const std::int64_t C = config_.d_model;
    out = moe_core->forward(h.view(Shape{h.numel() / C, C})).view(h.shape());
    saved.moe.aux_loss = moe_core->aux_loss();
  } else {
    out = is_moe() ? moe.forward(h, saved.moe) : mlp.forward(h, saved.mlp);
  }
  ops::axpy(out, 1.0, mid);
  return out;
}

Tensor Block::run_backward(const Tensor& dy, BlockSaved& saved, WeightGrads mode,
                           double loss_scale) const {
  require_params("backward");
  DTP_CHECK(saved.ln1.input.defined(), name(),
            " backward: no saved activations (forward not run, or already released)");
  PendingWeightGrads* defer = mode == WeightGrads::deferred ? &saved.pending : nullptr;
  Tensor d_mid;
  {
    trace::Scope span(name() + " mlp backward", "compute");
    Tensor dh;
    if (is_moe() && moe_core) {
      DTP_CHECK(mode == WeightGrads::immediate, name(),
                " backward: a block whose experts run elsewhere (a MoeCore) computes its weight "
                "gradients at once");
      const std::int64_t C = config_.d_model;
      dh = moe_core->backward(dy.view(Shape{dy.numel() / C, C}), loss_scale).view(dy.shape());
    } else {
      dh = is_moe() ? moe.backward(dy, saved.moe, loss_scale, defer)
                    : mlp.backward(dy, saved.mlp, defer);
    }
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
