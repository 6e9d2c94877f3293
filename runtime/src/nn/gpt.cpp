// The GPT: units in order, the saved activations of one forward, and the
// backward that hands each unit to the grad-ready hooks as soon as it is done.
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/trace.h"

namespace dtp {

GPT::GPT(const GPTConfig& config) : config_(config) {
  config_.validate();
  embedding_ = std::make_unique<Embedding>(config_);
  for (int layer = 0; layer < config_.layers; ++layer)
    blocks_.push_back(std::make_unique<Block>(config_, layer));
  head_ = std::make_unique<Head>(config_);
}

void GPT::check_tokens(const Tensor& tokens, const char* what) const {
  DTP_CHECK(tokens.defined() && tokens.dtype() == DType::i32 && tokens.ndim() == 2, "GPT: ", what,
            " must be i32 [B, T], got ", tokens.describe());
  DTP_CHECK(tokens.size(1) >= 1 && tokens.size(1) <= config_.context, "GPT: ", what,
            " has T = ", tokens.size(1), "; T must be in [1, context = ", config_.context, "]");
}

void GPT::run_hooks(const std::vector<UnitHook>& hooks, Unit& unit) {
  for (const UnitHook& hook : hooks) hook(unit);
}

void GPT::clear_hooks() {
  before_forward_hooks_.clear();
  after_forward_hooks_.clear();
  before_backward_hooks_.clear();
  grad_ready_hooks_.clear();
}

double GPT::forward(const Tensor& tokens, const Tensor& targets) {
  check_tokens(tokens, "tokens");
  return forward(tokens, targets, {PositionRange{0, tokens.size(1)}});
}

double GPT::forward(const Tensor& tokens, const Tensor& targets,
                    const std::vector<PositionRange>& positions) {
  check_tokens(tokens, "tokens");
  check_tokens(targets, "targets");
  DTP_CHECK(tokens.shape() == targets.shape(),
            "GPT forward: targets must have the shape of tokens ", tokens.shape().str(), ", got ",
            targets.describe());
  release_activations();
  block_saved_.resize(blocks_.size());
  // Each unit's hooks run outside its span: a hook's all-gather is not the unit's compute.
  Tensor x;
  run_hooks(before_forward_hooks_, *embedding_);
  {
    trace::Scope span("embedding forward", "compute");
    x = embedding_->forward(tokens, embedding_saved_, positions);
  }
  run_hooks(after_forward_hooks_, *embedding_);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    run_hooks(before_forward_hooks_, *blocks_[i]);
    {
      trace::Scope span(blocks_[i]->name() + " forward", "compute");
      x = blocks_[i]->forward(x, block_saved_[i]);
    }
    run_hooks(after_forward_hooks_, *blocks_[i]);
  }
  aux_loss_ = 0;
  for (const BlockSaved& saved : block_saved_) aux_loss_ += saved.moe.aux_loss;
  double loss;
  run_hooks(before_forward_hooks_, *head_);
  {
    trace::Scope span("head forward", "compute");
    loss = head_->forward(x, targets, head_saved_);
  }
  run_hooks(after_forward_hooks_, *head_);
  has_saved_ = true;
  return loss + aux_loss_;
}

void GPT::backward(double loss_scale) {
  DTP_CHECK(has_saved_, "GPT backward: call forward() first (each forward allows one backward)");
  has_saved_ = false;
  Tensor dx;
  run_hooks(before_backward_hooks_, *head_);
  {
    trace::Scope span("head backward", "compute");
    dx = head_->backward(head_saved_, loss_scale);
  }
  run_hooks(grad_ready_hooks_, *head_);
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    run_hooks(before_backward_hooks_, *blocks_[i]);
    {
      trace::Scope span(blocks_[i]->name() + " backward", "compute");
      dx = blocks_[i]->backward(dx, block_saved_[i], WeightGrads::immediate, loss_scale);
    }
    run_hooks(grad_ready_hooks_, *blocks_[i]);
  }
  run_hooks(before_backward_hooks_, *embedding_);
  {
    trace::Scope span("embedding backward", "compute");
    embedding_->backward(dx, embedding_saved_);
  }
  dx = Tensor();
  run_hooks(grad_ready_hooks_, *embedding_);
}

Tensor GPT::logits(const Tensor& tokens) const {
  check_tokens(tokens, "tokens");
  // unique_ptr hands out non-const units even here: the hooks may install
  // gathered parameters, which an evaluation needs as much as training does.
  EmbeddingSaved embedding_saved;
  run_hooks(before_forward_hooks_, *embedding_);
  Tensor x = embedding_->forward(tokens, embedding_saved);
  run_hooks(after_forward_hooks_, *embedding_);
  for (const auto& block : blocks_) {
    BlockSaved saved;
    run_hooks(before_forward_hooks_, *block);
    x = block->forward(x, saved);
    run_hooks(after_forward_hooks_, *block);
  }
  run_hooks(before_forward_hooks_, *head_);
  Tensor out = head_->logits(x);
  run_hooks(after_forward_hooks_, *head_);
  return out;
}

void GPT::release_activations() {
  embedding_saved_ = EmbeddingSaved{};
  for (BlockSaved& saved : block_saved_) saved.clear();
  head_saved_ = HeadSaved{};
  has_saved_ = false;
  aux_loss_ = 0;
}

void GPT::zero_grad() {
  for (Unit* unit : units()) unit->zero_grad();
}

std::vector<Unit*> GPT::units() {
  std::vector<Unit*> out{embedding_.get()};
  for (auto& block : blocks_) out.push_back(block.get());
  out.push_back(head_.get());
  return out;
}

std::vector<const Unit*> GPT::units() const {
  std::vector<const Unit*> out{embedding_.get()};
  for (const auto& block : blocks_) out.push_back(block.get());
  out.push_back(head_.get());
  return out;
}

Block& GPT::block(int layer) {
  DTP_CHECK(layer >= 0 && layer < num_blocks(), "GPT: block ", layer,
            " does not exist; the model has ", num_blocks(), " blocks");
  return *blocks_[static_cast<std::size_t>(layer)];
}

std::int64_t GPT::parameter_count() const {
  std::int64_t total = 0;
  for (const Unit* unit : units()) total += unit->numel();
  return total;
}

}  // namespace dtp
